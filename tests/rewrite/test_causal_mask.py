"""causal_mask: a FusedMHA whose Mask is a constant causal mask takes `causal = 1` and no Mask.

GPT-2 (transformers, random weights) builds its causal mask as data. Exported with a dynamic batch, mask_broadcast's
batch-row rule makes it one [1, 1, S, S] constant, which this rule then drops; exported with static shapes for
TensorRT, the export folds it to a constant itself. Each form must equal the graph without the rule on fresh inputs
(ONNX Runtime CPU, optimisations off, FusedMHA's function body) or, end to end, PyTorch (the export's own check).
Hand-built masks that are almost causal (a key above the diagonal left visible or weakly masked, a non-zero below
it), not constant, or of one row or column broadcast over the queries or keys are refused by the rule itself, saying why.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import transformers
from onnx import helper, numpy_helper

import deployfuse
from deployfuse.backends.ort import run, session
from deployfuse.inputs import DynamicAxis
from deployfuse.ops import attach_functions
from deployfuse.rewrite.fuser import fuse
from deployfuse.rewrite.rules import causal_mask, mask_broadcast

F32 = onnx.TensorProto.FLOAT


def _fused_mha(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == "FusedMHA"]


def _causal(node: onnx.NodeProto) -> int:
    return next((a.i for a in node.attribute if a.name == "causal"), 0)


def _tril(size: int, masked: float, dtype=np.float32, dims: tuple[int, ...] = (1, 1)) -> np.ndarray:
    return np.where(np.tril(np.ones((size, size), bool)), 0, masked).astype(dtype).reshape(*dims, size, size)


@pytest.mark.parametrize(("mask", "causal"), [
    (_tril(5, -np.inf), True), (_tril(5, -65504, np.float16), True), (_tril(5, -1e4), True), (_tril(4, np.finfo(np.float32).min, dims=()), True),
    (_tril(5, -9999), False),  # too weak to vanish in every softmax row
    (np.where(np.arange(5) <= np.arange(5)[:, None], 0, -np.inf)[None], True),
    (np.where(np.arange(5) <= np.arange(5)[:, None] + 1, 0, -np.inf)[None], False),  # one key past the diagonal visible
    (_tril(5, -np.inf) + np.eye(5, dtype=np.float32), False),  # a bias on the diagonal
    (np.zeros((1, 1, 5, 5), np.float32), False), (np.tril(np.ones((5, 5), np.int64)), False),
], ids=["inf", "fp16-min", "minus-1e4", "fp32-min-2d", "minus-9999", "rank-3", "off-by-one", "diagonal-bias", "zeros", "int"])
def test_is_causal(mask: np.ndarray, causal: bool) -> None:
    assert causal_mask.is_causal(mask) is causal


def _gpt2(layers: int = 2) -> transformers.GPT2Model:
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=100, n_embd=64, n_layer=layers, n_head=4, n_positions=32, use_cache=False)
    return transformers.GPT2Model(config).eval()


def test_gpt2_dynamic_batch_mask_becomes_causal(tmp_path) -> None:
    """The fp16 FusedMHA form of GPT-2 with a dynamic batch: after mask_broadcast's one constant row, every FusedMHA
    is causal with no Mask, the row is no longer in the graph, and the outputs equal the graph without the rule at
    another batch."""
    path = tmp_path / "gpt2.onnx"
    ids = torch.randint(0, 100, (2, 16))
    deployfuse.export(_gpt2().half(), path, example_inputs={"input_ids": ids}, dynamic=[DynamicAxis("input_ids", 0, "batch")],
                      target="ort-cuda", precision="fp16", fuse=False, verify=False)
    model = onnx.load(path)
    draws = [{"input_ids": np.random.default_rng(seed).integers(0, 100, (3, 16))} for seed in range(2)]
    families = ["attention", "packed_mha", mask_broadcast.FAMILY]
    without, _ = fuse(model, "ort-cuda", draws[:1], families=families)
    fused, report = fuse(model, "ort-cuda", draws[:1], families=[*families, causal_mask.FAMILY])
    (family,) = [f for f in report.families if f.family == causal_mask.FAMILY]
    assert family.matches.get(causal_mask.FAMILY) == 2 and not family.rolled_back, family
    assert [_causal(n) for n in _fused_mha(without)] == [0, 0] and all(len(n.input) > 3 and n.input[3] for n in _fused_mha(without))
    assert [_causal(n) for n in _fused_mha(fused)] == [1, 1] and not any(len(n.input) > 3 and n.input[3] for n in _fused_mha(fused))
    assert not any(i.name.endswith("_batch_row") for i in fused.graph.initializer), "the Mask constant left with its last reader"
    for feed in draws:
        want, got = run(session(without, optimize=False), feed), run(session(fused, optimize=False), feed)
        for name, value in want.items():
            np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_gpt2_fp8_export_keeps_yscale_after_the_absent_mask(tmp_path) -> None:
    """The fp8 ort-cuda export (gate on, against PyTorch fp32): the FusedMHA nodes are causal, have no Mask, and those
    feeding an fp8 output projection still read their YScale in its place (input 4, after an empty Mask)."""
    ids = torch.randint(0, 100, (2, 16))
    result = deployfuse.export(_gpt2(), tmp_path / "gpt2_fp8.onnx", example_inputs={"input_ids": ids}, dynamic=[DynamicAxis("input_ids", 0, "batch")],
                               target="ort-cuda", precision="fp8", accuracy_budget="cos=0.99,rel=0.2", seed=0, verify_draws=1)
    assert result.gate is not None and result.gate.passed
    nodes = _fused_mha(onnx.load(result.onnx_path))
    assert nodes and all(_causal(n) == 1 for n in nodes), [(_causal(n), list(n.input)) for n in nodes]
    assert all(len(n.input) <= 3 or not n.input[3] for n in nodes)
    assert any(len(n.input) == 5 and n.input[4] for n in nodes), "fp8_attention_out gave some FusedMHA its YScale"


def test_gpt2_static_tensorrt_export(tmp_path) -> None:
    """A static TensorRT export (verified against PyTorch by the export): the folded constant mask becomes causal."""
    result = deployfuse.export(_gpt2(), tmp_path / "gpt2_trt.onnx", example_inputs={"input_ids": torch.randint(0, 100, (2, 16))},
                               target="tensorrt", seed=0)
    assert result.report.verify and all(o["passed"] for v in result.report.verify for o in v["outputs"])
    nodes = _fused_mha(onnx.load(result.onnx_path))
    assert [_causal(n) for n in nodes] == [1, 1] and not any(len(n.input) > 3 and n.input[3] for n in nodes)


def _model(mask: np.ndarray | None) -> onnx.ModelProto:
    """FusedMHA(q, k, v, mask) on [2, 6, 16]: `mask` a constant, or (None) a graph input."""
    inputs = [helper.make_tensor_value_info(n, F32, [2, 6, 16]) for n in "qkv"]
    inits = []
    if mask is None:
        inputs.append(helper.make_tensor_value_info("mask", F32, [1, 1, 6, 6]))
    else:
        inits.append(numpy_helper.from_array(mask, "mask"))
    graph = helper.make_graph([helper.make_node("FusedMHA", ["q", "k", "v", "mask"], ["y"], domain="deployfuse", num_heads=2)], "masked",
                              inputs, [helper.make_tensor_value_info("y", F32, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("deployfuse", 1)], ir_version=10)
    attach_functions(model)
    return onnx.shape_inference.infer_shapes(model)


def _draws(model: onnx.ModelProto) -> list[dict[str, np.ndarray]]:
    names = [i.name for i in model.graph.input]
    return [{n: (np.random.default_rng(s).standard_normal((2, 6, 16)) if n in "qkv" else _tril(6, -np.inf)).astype(np.float32) for n in names} for s in range(2)]


def test_causal_constant_is_dropped() -> None:
    model = _model(_tril(6, np.finfo(np.float32).min))
    out, report = fuse(model, "ort-cuda", _draws(model), families=[causal_mask.FAMILY])
    (node,) = _fused_mha(out)
    assert report.counts()[causal_mask.FAMILY] == 1 and _causal(node) == 1 and list(node.input) == ["q", "k", "v"]
    for feed in _draws(model):
        np.testing.assert_allclose(run(session(out, optimize=False), feed)["y"], run(session(model, optimize=False), feed)["y"], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("mask", "why"), [
    (_tril(6, -1e3), "not 0 on and below the diagonal"), (_tril(6, -np.inf) + np.eye(6, dtype=np.float32), "not 0 on and below the diagonal"),
    (None, "not a constant"),
    (_tril(6, -np.inf)[..., :1, :], "broadcasts over the queries"), (np.zeros((1, 1, 6, 1), np.float32), "broadcasts over the queries or keys"),
    (np.zeros((1, 1), np.float32), "broadcasts over the queries or keys"),
], ids=["weak", "diagonal-bias", "input", "one-row", "one-column", "one-element"])
def test_almost_causal_masks_refuse(mask: np.ndarray | None, why: str) -> None:
    model = _model(mask)
    out, report = fuse(model, "ort-cuda", _draws(model), families=[causal_mask.FAMILY], debug=True)
    (family,) = report.families
    assert family.matches == {causal_mask.FAMILY: 0} and not family.rolled_back, "the rule refuses it (not the guard)"
    assert [_causal(n) for n in _fused_mha(out)] == [0]
    assert any(why in r for r in family.near_misses[causal_mask.FAMILY]), family.near_misses


def test_targets() -> None:
    assert causal_mask.rules("ort-cuda") and causal_mask.rules("tensorrt") and not causal_mask.rules("ort-cpu")
