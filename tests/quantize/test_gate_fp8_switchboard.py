"""The fp8 gate's switchboard: one ONNX Runtime session that runs any choice of a model's GEMMs in
fp8 gives the numbers of the artefact the fp8 quantizer makes for that choice (ort-cuda: float8
Q/DQ lowered to Fp8GemmAct, its function bodies on this CPU; tensorrt: the Q/DQ graph), so the
gate ranks and searches on it, and quantizes for real only the choice it finds."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import zoo

import deployfuse
from deployfuse.backends.ort import run, session
from deployfuse.export import flatten_outputs
from deployfuse.inputs import make_inputs, specs_of
from deployfuse.quantize import fp8_switchboard
from deployfuse.quantize.calibration import Calibration, random_calibration
from deployfuse.quantize.gate import Budget, GateFailed, measure, run_gate, sensitivity_ranking
from deployfuse.quantize.lowering import FP8_SKIPPED_FAMILIES, QuantizeOptions, quantize as lowering_quantize
from deployfuse.quantize.qdq import place_qdq, quantizable_nodes
from deployfuse.rewrite import family_names, fuse
from deployfuse.rewrite.rules import fp8_gemm

_ROOT = tempfile.TemporaryDirectory(prefix="deployfuse-fp8-switchboard-tests.")


def _cast(sample: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in sample.items()}


@functools.cache
def _float_model(name: str, target: str) -> tuple[onnx.ModelProto, Calibration, dict, torch.nn.Module, dict[str, torch.Tensor]]:
    """Zoo model `name` as an fp8 export for `target` quantizes it: fp16 and fused less
    FP8_SKIPPED_FAMILIES for ort-cuda, fp32 and fused for tensorrt; random calibration in that
    float type, and PyTorch fp32's outputs on it."""
    torch.manual_seed(0)
    module, example = zoo.ZOO[name].build()
    dtype = torch.float16 if target == "ort-cuda" else torch.float32
    path = Path(_ROOT.name) / f"{name}_{target}.onnx"
    deployfuse.export(module, path, example_inputs=example, target=target, precision="fp16" if target == "ort-cuda" else "fp32", opset=20,
                      fuse=False, verify=False)
    families = [f for f in family_names() if f not in FP8_SKIPPED_FAMILIES] if target == "ort-cuda" else None
    feeds = [{k: v.numpy() for k, v in _cast(make_inputs(specs_of(example), module, s, pad_masks=s == 2), dtype).items()} for s in (1, 2)]
    model, _ = fuse(onnx.load(path), target, feeds, families=families, custom_ops_library=False)
    drawn = random_calibration(example, module, seed=0)
    calibration = Calibration([_cast(s, dtype) for s in drawn.samples], [_cast(s, dtype) for s in drawn.held_out], drawn.source, random=True)
    with torch.no_grad():
        references = {kind: [flatten_outputs(module(**_cast(s, torch.float32))) for s in samples]
                      for kind, samples in (("calibration", calibration.samples), ("held-out", calibration.held_out))}
    return model, calibration, references, module, example


def _quantizer(model: onnx.ModelProto, calibration: Calibration, target: str):
    """The fp8 quantizer the export uses for `target` (`lowering._qdq_quantizer`'s steps)."""

    def quantize(exclude: set[str]) -> onnx.ModelProto:
        qdq = place_qdq(model, "fp8", calibration, exclude)
        return fp8_gemm.lower(qdq, target)[0] if target == "ort-cuda" else qdq

    return quantize


@pytest.mark.parametrize(("name", "target"), [("bert", "ort-cuda"), ("gpt2", "ort-cuda"), ("bert", "tensorrt")])
def test_switchboard_runs_any_choice_as_the_fp8_artefact_does(name, target):
    """Every switch on, and every other one, against the artefact quantizing the same GEMMs, on
    fresh inputs: on ort-cuda (Fp8GemmAct's bias and GELU in its float32 epilogue, here in the
    graph's fp16) apart by fp16 roundings only, as fp8_gemm.lower's tests hold the lowered model to
    the Q/DQ one; on tensorrt (fp32 Q/DQ) the same numbers. Every switch off: the float graph,
    exactly in fp32; in fp16 up to one rounding of each GEMM's output (ONNX Runtime's CPU runs an
    fp16 MatMul and the Add after it in float32 in one go, and the If's output is fp16)."""
    model, calibration, _, module, example = _float_model(name, target)
    board = fp8_switchboard.switchboard(model, calibration)
    layers = quantizable_nodes(model, "fp8")
    assert board is not None and sorted(board.switches) == sorted(layers) and len(layers) >= 8
    quantize = _quantizer(model, calibration, target)
    dtype = torch.float16 if target == "ort-cuda" else torch.float32
    float_session, on_session = session(model), session(board.model)
    choices = {"all": set(layers), "every other": set(layers[1::2])}
    artefacts = {choice: session(quantize(set(layers) - quantized)) for choice, quantized in choices.items()}
    for seed in (11, 12):
        feed = {k: v.numpy() for k, v in _cast(make_inputs(specs_of(example), module, seed, pad_masks=seed == 12), dtype).items()}
        floats = run(float_session, feed)
        off = run(on_session, {**feed, **board.feed(())})
        for choice, quantized in choices.items():
            got, want = run(on_session, {**feed, **board.feed(quantized)}), run(artefacts[choice], feed)
            for output, reference in floats.items():
                reference, artefact, out = (a.astype(np.float64) for a in (reference, want[output], got[output]))
                fp8_cost, scale = np.abs(artefact - reference).mean(), np.abs(reference).max()
                diff = np.abs(out - artefact)
                if target == "tensorrt":
                    assert diff.max() <= 1e-5 * scale, (choice, output, diff.max())
                else:
                    # fp16 roundings that differ upstream flip a few e4m3 roundings (a step is 6-12 % of a value): on the tiny GPT-2,
                    # 3 of 2048 outputs past 2 % of the scale, the largest 2.6 %; a wrong switch moves the mean to fp8_cost and many past it
                    far = float((diff > 0.02 * scale).mean())
                    assert diff.mean() < 0.5 * fp8_cost and far <= 0.01 and diff.max() < 0.05 * scale, (choice, output, diff.mean(), fp8_cost, far, diff.max() / scale)
        for output, reference in floats.items():
            if target == "tensorrt":
                np.testing.assert_array_equal(off[output], reference)
            else:
                diff = np.abs(off[output].astype(np.float64) - reference)
                assert diff.max() <= 4 * np.spacing(np.abs(reference).max()), (output, diff.max())


def _recording(quantize):
    """`quantize`, recording the layers each call keeps in float."""
    calls: list[set[str]] = []

    def recorded(exclude: set[str]) -> onnx.ModelProto:
        calls.append(set(exclude))
        return quantize(exclude)

    return recorded, calls


def test_a_failing_gate_ranks_and_searches_on_the_switchboard():
    """A budget no graph meets: the ranking (9 layers) and the search (1, 2, 4 layers back) run on
    the switchboard; the artefact is quantized only with all layers and with the bound's 4 back,
    and the gate fails as it does without a switchboard."""
    model, calibration, references, _, _ = _float_model("bert", "ort-cuda")
    layers = {n.name: n for n in model.graph.node if n.name in set(quantizable_nodes(model, "fp8"))}
    assert len(layers) == 9  # 4 GEMMs a layer and the pooler: the bound is 4
    quantize, calls = _recording(_quantizer(model, calibration, "ort-cuda"))
    with pytest.raises(GateFailed, match="even with 4 of 9 layers back in fp16") as failed:
        run_gate(quantize, layers, calibration, references, Budget(cos=0.0, rel=1e-12), functools.partial(fp8_switchboard.switchboard, model, calibration), "fp16")
    attempts = [(a["model"], a["fp16_layers"]) for a in failed.value.result.attempts]
    assert attempts == [("artefact", 0), ("switchboard", 1), ("switchboard", 2), ("switchboard", 4), ("artefact", 4)]
    ranked = [layer.node for layer in failed.value.result.fp32_layers]
    assert calls == [set(), set(ranked)] and len(ranked) == 4


def test_the_fp8_export_gate_passes_on_the_artefact_the_switchboard_chose():
    """`lowering.quantize` for fp8 on ort-cuda, over budget with every GEMM in fp8 and within it
    with the most sensitive one back in fp16 (on the switchboard and on the artefact): the
    switchboard finds that one layer, and the artefact that passes is quantized and measured for real."""
    model, calibration, references, _, _ = _float_model("bert", "ort-cuda")
    layers = {n.name: n for n in model.graph.node if n.name in set(quantizable_nodes(model, "fp8"))}
    quantize = _quantizer(model, calibration, "ort-cuda")
    board = fp8_switchboard.switchboard(model, calibration)
    assert board is not None

    def worst_rel(errors) -> float:
        return max(e.rel for e in errors)

    order = [name for name, _ in sensitivity_ranking(quantize, layers, calibration, references, Budget(cos=0.0, rel=1.0), board)]
    all_fp8 = worst_rel(measure(quantize(set()), calibration, references))
    one_back = max(worst_rel(measure(quantize({order[0]}), calibration, references)), worst_rel(board.measure(set(layers) - {order[0]}, calibration, references)))
    budget = Budget(cos=0.0, rel=(all_fp8 + one_back) / 2)
    assert one_back < budget.rel < all_fp8, (one_back, all_fp8)
    assert [name for name, _ in sensitivity_ranking(quantize, layers, calibration, references, budget, board)] == order  # rel alone ranks
    options = QuantizeOptions("fp8", "qdq", budget, float_precision="fp16", fp8_gemms=True)
    artefact, result = lowering_quantize(model, options, calibration, references)
    assert result is not None and result.passed
    assert [(a["model"], a["fp16_layers"], a["passed"]) for a in result.attempts] == [("artefact", 0, False), ("switchboard", 1, True), ("artefact", 1, True)]
    assert [layer.node for layer in result.fp32_layers] == order[:1]
    ops = [n.op_type for n in artefact.graph.node]
    assert ops.count("Fp8GemmAct") + 2 * ops.count("Fp8Mlp") == len(layers) - 1 and "If" not in ops  # an Fp8Mlp: 2 GEMMs
    assert worst_rel(measure(artefact, calibration, references)) <= budget.rel


def test_no_switchboard_past_what_a_session_loads_from_memory(monkeypatch):
    """A switchboard past protobuf's 2 GiB (the float weights and their float8 copies) could not be
    loaded: there is none, and the gate measures artefacts as before."""
    model, calibration, _, _, _ = _float_model("bert", "tensorrt")
    board = fp8_switchboard.switchboard(model, calibration)
    assert board is not None
    monkeypatch.setattr(fp8_switchboard, "PROTOBUF_LIMIT", board.model.ByteSize() - 1)
    assert fp8_switchboard.switchboard(model, calibration) is None
