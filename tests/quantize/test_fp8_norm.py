"""rules.fp8_norm: a (Skip)LayerNormalization feeding fp8 GEMMs becomes one SkipLayerNormFp8 whose float8 YQ they read.

On hand-built graphs (fresh random inputs, ONNX Runtime optimisations off, the function bodies) the fused graph computes
what the unfused one does, and the near misses are refused with their reason; tiny BertModel / GPT2Model fp8 ort-cuda
exports get one SkipLayerNormFp8 per norm feeding a GEMM, GEMMs reading float8 X, and agree with PyTorch fp32.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import transformers
from onnx import helper, numpy_helper

import deployfuse
from deployfuse.backends.ort import run, session
from deployfuse.ops import attach_functions
from deployfuse.ops.defs import fp8_gemm_act
from deployfuse.rewrite.gemm_tuning import gemm_problems
from deployfuse.rewrite.rules import fp8_norm
from deployfuse.targets import MS

HIDDEN, N = 32, 24
F16 = onnx.TensorProto.FLOAT16


def _init(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(array, name)


def _graph(rng: np.random.Generator, *, skip: bool, scales: tuple[float, float] = (0.02, 0.02), axis: int = -1, hidden: int = HIDDEN,
           reshape: bool = False) -> onnx.ModelProto:
    """x [2, 5, hidden] (+ skip) -> norm -> two Fp8GemmAct readers (GELU and none) and an Add reading the norm's Y (the residual);
    with `reshape`, the first reader sees the norm's Y through a Reshape to [10, hidden] (GPT-2's Conv1D)."""
    f16 = np.float16
    inits = [_init("gamma", (1 + 0.3 * rng.standard_normal(hidden)).astype(f16)), _init("beta", (0.1 * rng.standard_normal(hidden)).astype(f16)),
             _init("bias", (0.1 * rng.standard_normal(hidden)).astype(f16)), _init("shape", np.array([10, hidden], np.int64))]
    for i, s in enumerate(scales):
        weight = rng.standard_normal((N, hidden)).astype(np.float32) / np.sqrt(hidden)
        w_scale = np.float32(np.abs(weight).max() / 448)
        inits += [_init(f"xs{i}", np.array(s, np.float32)), _init(f"ws{i}", np.array(w_scale, np.float32)),
                  _init(f"w{i}", fp8_gemm_act.to_element_type(weight / w_scale, "float8e4m3fn")), _init(f"b{i}", rng.standard_normal(N).astype(f16))]
    if skip:
        norm = helper.make_node("SkipLayerNormalization", ["x", "skip", "gamma", "beta", "bias"], ["y", "", "", "sum"], domain=MS, epsilon=1e-5)
    else:
        norm = helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["y"], axis=axis, epsilon=1e-5)
    gemm_x = "flat" if reshape else "y"
    nodes = [norm, *([helper.make_node("Reshape", ["y", "shape"], ["flat"])] if reshape else []),
             helper.make_node("Fp8GemmAct", [gemm_x, "xs0", "w0", "ws0", "b0"], ["g0"], domain="deployfuse", activation="gelu_tanh"),
             helper.make_node("Fp8GemmAct", ["y", "xs1", "w1", "ws1", "b1"], ["g1"], domain="deployfuse"),
             helper.make_node("Add", ["y", "x"], ["residual"])]
    outputs = ["g0", "g1", "residual"] + (["sum"] if skip else [])
    inputs = [helper.make_tensor_value_info("x", F16, [2, 5, hidden])] + ([helper.make_tensor_value_info("skip", F16, [2, 5, hidden])] if skip else [])
    graph = helper.make_graph(nodes, "norm_fp8", inputs, [helper.make_tensor_value_info(o, F16, None) for o in outputs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid(MS, 1)], ir_version=10)
    attach_functions(model)
    return model


def _run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return run(session(model, optimize=False), feed)


@pytest.mark.parametrize("skip,reshape", [(True, False), (False, False), (False, True)])
def test_fused_graph_computes_what_the_unfused_one_does(skip, reshape):
    rng = np.random.default_rng()
    model = _graph(rng, skip=skip, reshape=reshape)
    feed = {"x": rng.standard_normal((2, 5, HIDDEN)).astype(np.float16)}
    if skip:
        feed["skip"] = rng.standard_normal((2, 5, HIDDEN)).astype(np.float16)
    want = _run(model, feed)
    fused, count, refused = fp8_norm.fuse(onnx.ModelProto.FromString(model.SerializeToString()), "ort-cuda")
    attach_functions(fused)
    assert (count, refused) == (1, [])
    ops = collections.Counter(n.op_type for n in fused.graph.node)
    assert ops["SkipLayerNormFp8"] == 1 and not {"SkipLayerNormalization", "LayerNormalization"} & set(ops), ops
    norm = next(n for n in fused.graph.node if n.op_type == "SkipLayerNormFp8")
    assert norm.output[0] == "y" and (norm.output[2] == "sum") == skip  # Y kept for the residual, Sum where it was read
    assert all(n.input[0] == norm.output[1] for n in fused.graph.node if n.op_type == "Fp8GemmAct")  # both GEMMs read YQ
    got = _run(fused, feed)
    for name, value in want.items():  # the same float8 values reach the GEMMs: equal up to the norm's float32 rounding
        np.testing.assert_allclose(got[name].astype(np.float32), value.astype(np.float32), rtol=2e-3, atol=2e-3, err_msg=name)


@pytest.mark.parametrize("change,why", [
    ({"scales": (0.02, 0.03)}, "different XScale values"),
    ({"axis": -2}, "more than the last axis"),
    ({"hidden": 24}, "not a multiple of 16"),
])
def test_near_misses_are_refused_with_their_reason(change, why):
    model = _graph(np.random.default_rng(0), skip=False, **change)
    fused, count, refused = fp8_norm.fuse(model, "ort-cuda")
    assert count == 0 and len(refused) == 1 and why in refused[0], refused
    assert not any(n.op_type == "SkipLayerNormFp8" for n in fused.graph.node)


def test_autotune_times_the_fused_graph_against_the_gemms_own_quantize_passes():
    """The A/B's other side reads Y again (no YQ written, the GEMMs quantize) and computes the same; on a machine without the
    CUDA EP the family is kept, untimed, and says so."""
    rng = np.random.default_rng()
    fused, count, _ = fp8_norm.fuse(_graph(rng, skip=True), "ort-cuda")
    attach_functions(fused)
    before = fp8_norm.without_fp8_x(fused)
    norm = next(n for n in before.graph.node if n.op_type == "SkipLayerNormFp8")
    assert count == 1 and norm.output[1] == "" and all(n.input[0] == norm.output[0] for n in before.graph.node if n.op_type == "Fp8GemmAct")
    feed = {name: rng.standard_normal((2, 5, HIDDEN)).astype(np.float16) for name in ("x", "skip")}
    for name, value in _run(fused, feed).items():
        np.testing.assert_allclose(_run(before, feed)[name].astype(np.float32), value.astype(np.float32), rtol=1e-3, atol=1e-3, err_msg=name)
    shipped, line = fp8_norm.autotune(fused, feed, None)
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        assert shipped is fused and line == "fp8_norm kept: not timed: this onnxruntime has no CUDA EP", line


def test_other_targets_keep_the_norm():
    model = _graph(np.random.default_rng(0), skip=True)
    assert fp8_norm.fuse(model, "ort-cpu")[1:] == (0, [])


def _export(model: torch.nn.Module, tmp_path) -> tuple[onnx.ModelProto, dict[str, torch.Tensor]]:
    ids = torch.randint(0, 500, (2, 16))
    example = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    result = deployfuse.export(model, tmp_path / "model.onnx", example_inputs=example, target="ort-cuda", precision="fp8",
                               accuracy_budget="cos=0.99,rel=0.2", seed=0, verify_draws=1)
    assert result.gate is not None and result.gate.passed and result.gate.fp32_layers == []
    return onnx.load(result.onnx_path), example


# BERT (post-LN): the embeddings' LayerNorm and each layer's attention-output SkipLayerNorm feed a GEMM (QKV, the MLP), the
# last layer's output norm none. GPT-2 (pre-LN): ln_1 and ln_2 of each layer, the first a LayerNormalization, the rest
# SkipLayerNormalizations carrying the residual as Sum; ln_f feeds no GEMM.
_MODELS = {
    "bert": (lambda: transformers.BertModel(transformers.BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                                      intermediate_size=128, max_position_embeddings=64)), 4, 1),
    "gpt2": (lambda: transformers.GPT2Model(transformers.GPT2Config(vocab_size=500, n_embd=64, n_layer=2, n_head=4, n_positions=64)), 4, 1),
}


@pytest.mark.parametrize("name", list(_MODELS))
def test_fp8_export_norms_quantize_the_gemm_inputs(name, tmp_path):
    build, fused_norms, left_norms = _MODELS[name]
    torch.manual_seed(0)
    model = build().eval()
    artefact, example = _export(model, tmp_path)
    ops = collections.Counter(n.op_type for n in artefact.graph.node)
    assert ops["SkipLayerNormFp8"] == fused_norms and ops["SkipLayerNormalization"] + ops["LayerNormalization"] == left_norms, ops
    yq = {n.output[1] for n in artefact.graph.node if n.op_type == "SkipLayerNormFp8"}
    gemms = [n for n in artefact.graph.node if n.op_type in ("Fp8GemmAct", "Fp8Mlp")]
    assert sum(n.input[0] in yq for n in gemms) == 2 * model.config.num_hidden_layers  # QKV and the MLP of each layer: no quantize pass
    problems = gemm_problems(artefact, {k: v.numpy() for k, v in example.items()})  # --autotune times them as they run: X in float8
    attention_yq = {n.output[1] for n in artefact.graph.node if n.op_type == "FusedMHA" and len(n.output) > 1}  # rules.fp8_attention_out's
    assert {name for name, p in problems.items() if getattr(p, "x_fp8", 0)} == {n.output[0] for n in gemms if n.input[0] in yq | attention_yq}
    assert {p.dtype for p in problems.values()} == {onnx.TensorProto.FLOAT16}
    ids = torch.randint(0, 500, (2, 16))  # fresh inputs at the exported (static) shape
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    with torch.inference_mode():
        want = model(**inputs).last_hidden_state.double().numpy().ravel()
    got = run(session(artefact), {k: v.numpy() for k, v in inputs.items()})["last_hidden_state"].astype(np.float64).ravel()
    cos, rel = want @ got / np.linalg.norm(want) / np.linalg.norm(got), np.abs(got - want).max() / np.abs(want).max()
    assert cos >= 0.99 and rel <= 0.2, (cos, rel)
