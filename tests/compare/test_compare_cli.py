"""`deployfuse compare` end to end on a real BERT: pass, fail + localise, tolerances, outputs, bad input."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from polygraphy.comparator import RunResults

from .conftest import perturb, weighted_fused_nodes


def _args(files, *extra: str) -> list[str]:
    return [files["model"], "--trust-pickle", "--example-inputs", files["inputs"], "--iterations", "3", "--warmup", "1", *extra]


def test_equal_models_pass_at_two_shapes(cli, bert_files, bert_dynamic, tmp_path):
    out = tmp_path / "cmp.json"
    model, *rest = _args(bert_files)
    code, stdout, _ = cli("compare", model, bert_files["fused"], *rest, *bert_dynamic, "--json", out)
    assert code == 0, stdout
    report = json.loads(out.read_text())
    assert report["passed"] and report["first_divergence"] is None
    shapes = [a["shapes"]["input_ids"] for a in report["accuracy"]]
    assert len(shapes) == 2 and shapes[0] != shapes[1]  # the dynamic graph ran at a second shape
    for a in report["accuracy"]:
        assert {o["name"] for o in a["outputs"]} == {"last_hidden_state", "pooler_output"}
        for o in a["outputs"]:
            assert o["max_abs_error"] <= o["atol"] + o["rtol"] * 10 and o["cosine_similarity"] > 0.9999
            assert o["p99_abs_error"] <= o["max_abs_error"] and o["median_abs_error"] <= o["p99_abs_error"]
    latency = {lat["backend"]: lat for lat in report["latency"]}
    assert set(latency) == {"torch", "ort-cpu"}
    for lat in latency.values():
        assert len(lat["samples_ms"]) == 3 and lat["min_ms"] <= lat["median_ms"] <= lat["p90_ms"] <= lat["max_ms"]
        assert lat["samples_per_s"] == pytest.approx(2 * lat["throughput_per_s"])  # batch 2


def test_perturbed_weight_fails_and_is_localised(cli, bert_files, tmp_path):
    fused = onnx.load(str(bert_files["fused"]))
    candidates = weighted_fused_nodes(fused)
    assert len(candidates) >= 3, "the ort-cpu rules fused too little of BERT to localise within it"
    target, index, rule = candidates[len(candidates) // 2]
    broken = tmp_path / "broken.onnx"
    onnx.save(perturb(fused, target, index, delta=0.5, scale=1.5), str(broken))  # a shift alone is lost after a LayerNorm
    out = tmp_path / "cmp.json"
    model, *rest = _args(bert_files)
    code, stdout, stderr = cli("compare", model, broken, *rest, "--reference-onnx", bert_files["unfused"], "--json", out)
    assert code == 1, stderr
    report = json.loads(out.read_text())
    first = report["first_divergence"]
    assert first["node"] == target and first["rule"] == rule
    order = [n.name for n in fused.graph.node]
    diverged = [d["node"] for d in report["localization"]["divergences"]]
    assert all(order.index(n) >= order.index(target) for n in diverged)  # nothing before the broken node differs
    assert len(diverged) > 1  # and the difference propagates to later fused nodes
    assert f"first divergence at {target}" in stderr and "ort-cpu:last_hidden_state" in stderr


def test_unfused_reference_is_derived_when_not_given(bert_files, tmp_path):
    from deployfuse.compare import compare

    fused = onnx.load(str(bert_files["fused"]))
    target, index, _ = weighted_fused_nodes(fused)[0]
    broken = tmp_path / "broken.onnx"
    onnx.save(perturb(fused, target, index, delta=0.3, scale=1.3), str(broken))
    result = compare(bert_files["model"], broken, example_inputs=bert_files["inputs"], trust_pickle=True, iterations=0)
    assert not result.passed
    assert result.first_divergence is not None and result.first_divergence["node"] == target
    assert result.localization is not None and result.localization.reference.startswith("(derived")


def test_failure_outside_fused_nodes_is_said_so(cli, bert_files, tmp_path):
    unfused = onnx.load(str(bert_files["unfused"]))
    gemm = next(n.name for n in unfused.graph.node if n.op_type == "Gemm")
    broken = tmp_path / "broken.onnx"
    onnx.save(perturb(unfused, gemm, 1, scale=1.5), str(broken))
    out = tmp_path / "cmp.json"
    model, *rest = _args(bert_files, "--iterations", "0")
    code, _, _ = cli("compare", model, broken, *rest, "--json", out)
    assert code == 1
    report = json.loads(out.read_text())
    assert report["first_divergence"] is None and "no fused nodes" in report["localization"]["note"]


def test_tolerance_per_output(cli, bert_files, tmp_path):
    gemm = next(n.name for n in onnx.load(str(bert_files["fused"])).graph.node if n.op_type == "Gemm")  # the pooler's dense layer
    shifted = tmp_path / "shifted.onnx"
    onnx.save(perturb(onnx.load(str(bert_files["fused"])), gemm, 1, scale=1.01), str(shifted))
    model, *rest = _args(bert_files, "--iterations", "0", "--no-localize")
    code, stdout, _ = cli("compare", model, shifted, *rest)
    assert code == 1 and "FAIL" in stdout.split("pooler_output")[1].splitlines()[0]
    assert "ok" in stdout.split("last_hidden_state")[1].splitlines()[0]
    code, stdout, _ = cli("compare", model, shifted, *rest, "--atol", "pooler_output:5e-2")
    assert code == 0, stdout
    code, _, _ = cli("compare", model, shifted, *rest, "--atol", "last_hidden_state:5e-2")
    assert code == 1


def test_report_and_polygraphy_results(cli, bert_files, tmp_path):
    html, results = tmp_path / "cmp.html", tmp_path / "results.json"
    model, *rest = _args(bert_files)
    code, stdout, _ = cli("compare", model, bert_files["fused"], *rest, "--report", html, "--save-results", results)
    assert code == 0, stdout
    page = html.read_text()
    images = [chunk.split("'")[0] for chunk in page.split("data:image/png;base64,")[1:]]
    assert len(images) == 3  # an error histogram per output, and the latency plot
    assert all(base64.b64decode(img).startswith(b"\x89PNG") for img in images)
    loaded = RunResults.load(str(results))
    assert list(loaded.keys()) == ["torch", "ort-cpu"]
    beside = Path(sys.executable).with_name("polygraphy")  # the console script of this interpreter, else the one on PATH (a venv over system packages)
    polygraphy = [str(beside) if beside.exists() else shutil.which("polygraphy") or "polygraphy", "run", str(bert_files["fused"]), "--onnxrt",
                  "--load-inputs", str(tmp_path / "results.inputs.json"), "--load-outputs", str(results)]
    run = subprocess.run(polygraphy, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "PASSED" in run.stdout + run.stderr, run.stdout + run.stderr


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--input", "input_ids:2x16:int64", "--input", "mask:2x16:int64"], "the model's inputs are"),
        (["--backends", "torch"], "at least two backends"),
        (["--backends", "torch,onnx"], "unknown backend 'onnx'"),
        (["--atol", "logits:1e-3"], "names output 'logits'"),
        (["--atol", "1e-3x"], "expected [OUTPUT:]VALUE"),
        (["--custom-ops", "/nonexistent/libdeployfuse_ort.so"], "onnxruntime cannot load"),
    ],
)
def test_bad_usage_exits_2(cli, bert_files, extra, message):
    model, *rest = _args(bert_files, "--iterations", "0")
    code, _, stderr = cli("compare", model, bert_files["unfused"], *rest, *extra)
    assert code == 2 and message in stderr, stderr


def test_shape_the_onnx_model_cannot_take_exits_2(cli, bert_files, tmp_path):
    fixed = onnx.load(str(bert_files["unfused"]))
    for value in fixed.graph.input:
        value.type.tensor_type.shape.dim[1].dim_value = 16
    path = tmp_path / "fixed.onnx"
    onnx.save(fixed, str(path))
    code, _, stderr = cli("compare", bert_files["model"], path, "--trust-pickle", "--input", "input_ids:2x8:int64", "--input", "attention_mask:2x8:int64")
    assert code == 2 and "input_ids has shape 2x8, but the ONNX model takes batch x16".replace(" x", "x") in stderr, stderr


def test_missing_files_exit_2(cli, bert_files, tmp_path):
    code, _, stderr = cli("compare", bert_files["model"], tmp_path / "none.onnx", "--trust-pickle")
    assert code == 2 and "no such ONNX file" in stderr
    code, _, stderr = cli("compare", bert_files["model"], bert_files["unfused"])  # a pickle without --trust-pickle
    assert code == 2 and "--trust-pickle" in stderr
