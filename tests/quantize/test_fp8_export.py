"""`deployfuse export --precision fp8 --target ort-cuda` on this CPU: an fp16 graph whose GEMMs are
deployfuse.Fp8GemmAct nodes (no Q/DQ left), Q, K and V of each self-attention one of them
(`split_qkv`), gated against PyTorch fp32 as it is saved (the function bodies on ONNX Runtime's
CPU EP) and within the budget on the custom-op library's kernels, the layers the gate leaves out
kept in fp16."""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto

from deployfuse import metadata
from deployfuse.backends.ort import run, session
from deployfuse.examples.tiny_bert import build
from deployfuse.export import flatten_outputs
from deployfuse.inputs import make_inputs, specs_of
from deployfuse.ops import ort_custom_ops_library
from deployfuse.quantize.calibration import Calibration, load_calibration
from deployfuse.quantize.gate import measure
from deployfuse.quantize.lowering import float_precision
from deployfuse.targets import ORT_CPU, ORT_CUDA, TENSORRT


def _half(sample: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.half() if v.is_floating_point() else v for k, v in sample.items()}


@pytest.fixture(scope="module")
def fp8_bert(tmp_path_factory):
    """The CLI's fp8 ort-cuda export of the example BERT: (exit code, what it printed, artefact, report)."""
    from deployfuse.cli import main

    folder = tmp_path_factory.mktemp("fp8")
    model, example = build()
    samples = [make_inputs(specs_of(example), model, seed=100 + i, pad_masks=i % 2 == 1) for i in range(8)]
    np.savez(folder / "calib.npz", **{name: np.stack([s[name].numpy() for s in samples]) for name in example})
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        code = main(["export", "deployfuse.examples.tiny_bert:build", "-o", str(folder / "bert.onnx"), "--precision", "fp8", "--target", "ort-cuda",
                     "--calibration-data", str(folder / "calib.npz"), "--seed", "0", "--report", str(folder / "report.json")])
    return code, printed.getvalue(), folder / "bert.onnx", json.loads((folder / "report.json").read_text())


def test_fp8_for_ort_cuda_is_an_fp16_graph_of_fp8_gemms(fp8_bert):
    code, printed, artefact, report = fp8_bert
    assert code == 0, printed
    assert f"layers kept in fp16: {len(report['quantization']['gate']['fp16_layers'])} of" in printed
    graph = onnx.load(artefact)
    ops = [n.op_type for n in graph.graph.node]
    gate = report["quantization"]["gate"]
    kept = [layer["node"] for layer in gate["fp16_layers"]]
    assert gate["passed"] and ops.count("Fp8GemmAct") + 2 * ops.count("Fp8Mlp") == gate["quantized_layers"] - len(kept) > 0  # an Fp8Mlp: 2 GEMMs
    assert not {"QuantizeLinear", "DequantizeLinear"} & set(ops) and {"FusedMHA", "SkipLayerNormalization"} <= set(ops)
    assert {o.type.tensor_type.elem_type for o in graph.graph.output} == {TensorProto.FLOAT16}
    weights = {t.name: t.data_type for t in graph.graph.initializer}
    fp8_weights = [n.input[i] for n in graph.graph.node for i in {"Fp8GemmAct": (2,), "Fp8Mlp": (2, 6)}.get(n.op_type, ())]
    assert {weights[w] for w in fp8_weights} == {TensorProto.FLOAT8E4M3FN}
    recorded = metadata.read(graph, metadata.QUANTIZATION)
    assert isinstance(recorded, dict) and recorded["precision"] == "fp8" and recorded["fp16_layers"] == kept


def test_the_gate_judged_the_saved_artefact(fp8_bert):
    """The report's errors are the saved file's own on the export's calibration samples (cast to
    fp16) against PyTorch fp32; and fresh inputs stay within the budget."""
    _, _, artefact, report = fp8_bert
    model, example = build()
    drawn = load_calibration(artefact.parent / "calib.npz", example)
    calibration = Calibration([_half(s) for s in drawn.samples], [_half(s) for s in drawn.held_out], drawn.source)
    with torch.inference_mode():
        references = {kind: [flatten_outputs(model(**{k: v.float() if v.is_floating_point() else v for k, v in s.items()})) for s in samples]
                      for kind, samples in (("calibration", calibration.samples), ("held-out", calibration.held_out))}
    errors = measure(onnx.load(artefact), calibration, references)
    recorded = {(e["name"], e["samples"]): e for e in report["quantization"]["gate"]["errors"]}
    assert len(errors) == len(recorded) == 4
    for e in errors:
        assert e.cos == pytest.approx(recorded[(e.name, e.samples)]["cos"], abs=1e-12) and e.rel == pytest.approx(recorded[(e.name, e.samples)]["rel"], abs=1e-12)
    _within_budget(model, example, onnx.load(artefact))


def _within_budget(model: torch.nn.Module, example: dict[str, torch.Tensor], artefact: onnx.ModelProto, library=None) -> None:
    """The artefact on ONNX Runtime's CPU EP (deployfuse nodes on `library`'s kernels, or their
    function bodies) against PyTorch fp32 on fresh inputs, padded and not: within the gate's default budget."""
    fresh = session(artefact, custom_ops_library=library)
    for seed in (21, 22):
        inputs = make_inputs(specs_of(example), model, seed, pad_masks=seed == 22)
        with torch.inference_mode():
            want = flatten_outputs(model(**inputs))["last_hidden_state"].double().numpy().ravel()
        got = run(fresh, {k: v.numpy() for k, v in inputs.items()})["last_hidden_state"].astype(np.float64).ravel()
        cos = float(want @ got / np.linalg.norm(want) / np.linalg.norm(got))
        assert cos >= 0.999 and np.abs(got - want).max() <= 2e-2 * np.abs(want).max(), (seed, cos)


def test_q_k_v_are_one_fp8_gemm_per_layer(fp8_bert):
    """Each FusedMHA reads Q, K, V in place from one Fp8GemmAct (x quantized once; packed_qkv=1), so
    a layer has 4 GEMMs (QKV, attention output, up, down) and the model one more (the pooler); the
    artefact, its Fp8GemmAct nodes run by the library alone, stays within the budget."""
    _, _, artefact, report = fp8_bert
    model, example = build()
    graph = onnx.load(artefact)
    producers = {o: n for n in graph.graph.node for o in n.output}
    packed = [n.input[0] for n in graph.graph.node if n.op_type == "FusedMHA" and n.input[0] == n.input[1] == n.input[2]]
    qkv = [producers[p].op_type for p in packed]
    layers = model.config.num_hidden_layers
    assert qkv == ["Fp8GemmAct"] * layers and report["quantization"]["gate"]["quantized_layers"] == 4 * layers + 1, (qkv, report["quantization"]["gate"])
    functions = [f for f in graph.functions if f.name not in ("Fp8GemmAct", "Fp8Mlp")]
    del graph.functions[:]
    graph.functions.extend(functions)  # only the library's kernels can run an Fp8GemmAct or an Fp8Mlp now
    _within_budget(model, example, graph, ort_custom_ops_library())


def test_which_float_type_surrounds_the_quantized_gemms():
    assert float_precision("fp8", ORT_CUDA) == "fp16"
    assert float_precision("fp8", TENSORRT) == float_precision("int8", ORT_CUDA) == float_precision("int8", ORT_CPU) == "fp32"
