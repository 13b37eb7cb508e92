"""rules.fp8_attention_out: a FusedMHA feeding fp8 GEMMs writes their float8 X (YQ) itself, so no quantize pass is left.

On hand-built graphs (with and without a Mask, Y also read elsewhere or not) and on tiny BertModel / GPT2Model fp8 ort-cuda
exports, the rewritten graph computes what the same graph without the rule (`without_fp8_x`: the GEMMs quantize Y
themselves) computes, on fresh random inputs, through the function bodies (ONNX Runtime optimisations off) and through the
CPU custom-op library; the near misses are refused with their reason.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
import torch
import transformers
from onnx import helper, numpy_helper

import deployfuse
from deployfuse.backends.ort import run, session
from deployfuse.ops import attach_functions, ort_custom_ops_library
from deployfuse.ops.schema import to_element_type
from deployfuse.rewrite.rules import fp8_attention_out

HIDDEN, HEADS, N = 32, 2, 24
F16 = onnx.TensorProto.FLOAT16


@pytest.fixture(scope="module")
def library():
    return ort_custom_ops_library()


def _graph(rng: np.random.Generator, *, mask: bool, residual: bool, scales: tuple[float, float] = (0.01, 0.01), hidden: int = HIDDEN) -> onnx.ModelProto:
    """q, k, v [2, 7, hidden] (+ a [2, 1, 1, 7] mask) -> FusedMHA -> two Fp8GemmAct readers, the first through GPT-2's Reshape
    to [14, hidden]; with `residual`, an Add also reads FusedMHA's Y."""
    inits = [numpy_helper.from_array(np.array([14, hidden], np.int64), "shape")]
    for i, s in enumerate(scales):
        weight = rng.standard_normal((N, hidden)).astype(np.float32) / np.sqrt(hidden)
        w_scale = np.float32(np.abs(weight).max() / 448)
        inits += [numpy_helper.from_array(np.array(s, np.float32), f"xs{i}"), numpy_helper.from_array(np.array(w_scale, np.float32), f"ws{i}"),
                  numpy_helper.from_array(to_element_type(weight / w_scale, "float8e4m3fn"), f"w{i}"),
                  numpy_helper.from_array(rng.standard_normal(N).astype(np.float16), f"b{i}")]
    nodes = [helper.make_node("FusedMHA", ["q", "k", "v", *(["mask"] if mask else [])], ["y"], name="mha", domain="deployfuse", num_heads=HEADS),
             helper.make_node("Reshape", ["y", "shape"], ["flat"]),
             helper.make_node("Fp8GemmAct", ["flat", "xs0", "w0", "ws0", "b0"], ["g0"], domain="deployfuse", activation="gelu_tanh"),
             helper.make_node("Fp8GemmAct", ["y", "xs1", "w1", "ws1", "b1"], ["g1"], domain="deployfuse"),
             *([helper.make_node("Add", ["y", "q"], ["residual"])] if residual else [])]
    inputs = [helper.make_tensor_value_info(n, F16, [2, 7, hidden]) for n in "qkv"] + ([helper.make_tensor_value_info("mask", F16, [2, 1, 1, 7])] if mask else [])
    outputs = [helper.make_tensor_value_info(o, F16, None) for o in ("g0", "g1", *(["residual"] if residual else []))]
    graph = helper.make_graph(nodes, "mha_fp8", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    attach_functions(model)
    return model


def _feed(rng: np.random.Generator, model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Fresh random values for the graph's inputs (token ids below 500 and an all-ones mask for the exports)."""
    feed = {}
    for value in model.graph.input:
        dims = [d.dim_value for d in value.type.tensor_type.shape.dim]
        if value.type.tensor_type.elem_type == onnx.TensorProto.INT64:
            feed[value.name] = np.ones(dims, np.int64) if "mask" in value.name else rng.integers(0, 500, dims)
        else:
            feed[value.name] = rng.standard_normal(dims).astype(np.float16)
    return feed


def _native(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model without its deployfuse function bodies: only the custom-op library's kernels can run its nodes."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    kept = [f for f in out.functions if f.domain != "deployfuse"]
    del out.functions[:]
    out.functions.extend(kept)
    return out


def _assert_same_outputs(fused: onnx.ModelProto, unfused: onnx.ModelProto, feed: dict[str, np.ndarray], library) -> None:
    """The same float8 values reach the GEMMs: equal outputs through the function bodies, bit for bit. Through the CPU
    kernels (both graphs) nearly so: ONNX Runtime's CPU EP runs the float16 graph's custom ops in float32 (casts around them), so there
    FusedMHA quantizes its float32 Y where the GEMM's own pass quantized Y rounded to float16: a float8 step apart where Y
    sits near a midpoint, which the layers after it carry (on the GPU T is float16 on both sides)."""
    want = run(session(unfused, optimize=False), feed)
    got = run(session(fused, optimize=False), feed)
    assert set(got) == set(want)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)
    native = run(session(_native(fused), optimize=False, custom_ops_library=library), feed)
    for name, value in run(session(_native(unfused), optimize=False, custom_ops_library=library), feed).items():
        ref, out = value.astype(np.float64), native[name].astype(np.float64)
        rel = np.linalg.norm(out - ref) / np.linalg.norm(ref)
        assert rel < 1e-2 and np.abs(out - ref).max() < 0.05 * np.abs(ref).max(), (name, rel)


@pytest.mark.parametrize("mask,residual", [(True, False), (False, True)])
def test_rewritten_graph_computes_what_the_gemms_own_quantize_passes_did(library, mask, residual):
    rng = np.random.default_rng()
    model = _graph(rng, mask=mask, residual=residual)
    fused, count, refused = fp8_attention_out.fuse(onnx.ModelProto.FromString(model.SerializeToString()), "ort-cuda")
    attach_functions(fused)
    assert (count, refused) == (1, [])
    mha = next(n for n in fused.graph.node if n.op_type == "FusedMHA")
    assert list(mha.input) == ["q", "k", "v", "mask" if mask else "", "xs0"], "YScale = the readers' XScale; an absent Mask named \"\""
    assert (mha.output[0] == "y") == residual and mha.output[1], "Y kept only for the residual"
    gemms = [n for n in fused.graph.node if n.op_type == "Fp8GemmAct"]
    assert all(n.input[0] == mha.output[1] for n in gemms), "both GEMMs read YQ (float8 X: no quantize pass)"
    assert [n.op_type for n in fused.graph.node].count("Reshape") == 1, "the Reshape moved past the GEMM (onto its output)"
    feed = _feed(rng, model)
    _assert_same_outputs(fused, model, feed, library)
    unfused = fp8_attention_out.without_fp8_x(fused)  # autotune's other side, with its own function bodies
    assert not any(n.op_type == "FusedMHA" and len(n.input) > 4 and n.input[4] for n in unfused.graph.node)
    _assert_same_outputs(fused, unfused, feed, library)


@pytest.mark.parametrize("change,why", [({"scales": (0.01, 0.02)}, "different XScale values"), ({"hidden": 40}, "not a multiple of 16")])
def test_near_misses_are_refused_with_their_reason(change, why):
    model = _graph(np.random.default_rng(0), mask=True, residual=False, **change)
    fused, count, refused = fp8_attention_out.fuse(model, "ort-cuda")
    assert count == 0 and len(refused) == 1 and why in refused[0], refused
    assert all(len(n.input) < 5 for n in fused.graph.node if n.op_type == "FusedMHA")


def test_other_targets_keep_the_gemms_quantize_passes():
    model = _graph(np.random.default_rng(0), mask=True, residual=False)
    assert fp8_attention_out.fuse(model, "ort-cpu")[1:] == (0, [])
    assert fp8_attention_out.fuse(model, "tensorrt")[1:] == (0, [])


_MODELS = {
    "bert": lambda: transformers.BertModel(transformers.BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                                     intermediate_size=128, max_position_embeddings=64)),
    "gpt2": lambda: transformers.GPT2Model(transformers.GPT2Config(vocab_size=500, n_embd=64, n_layer=2, n_head=4, n_positions=64)),
}


@pytest.mark.parametrize("name", list(_MODELS))
def test_fp8_export_attention_writes_the_output_projection_x(library, name, tmp_path):
    """Every layer's FusedMHA writes YQ, which its output projection reads as a float8 X, and the artefact computes what it
    computes without the rule."""
    torch.manual_seed(0)
    model = _MODELS[name]().eval()
    ids = torch.randint(0, 500, (2, 16))
    result = deployfuse.export(model, tmp_path / "model.onnx", example_inputs={"input_ids": ids, "attention_mask": torch.ones_like(ids)},
                               target="ort-cuda", precision="fp8", accuracy_budget="cos=0.99,rel=0.2", seed=0, verify_draws=1)
    artefact = onnx.load(result.onnx_path)
    attention = [n for n in artefact.graph.node if n.op_type == "FusedMHA"]
    assert len(attention) == model.config.num_hidden_layers and all(len(n.output) > 1 and n.output[1] and not n.output[0] for n in attention)
    yq = {n.output[1] for n in attention}
    projections = [n for n in artefact.graph.node if n.op_type == "Fp8GemmAct" and n.input[0] in yq]
    assert len(projections) == len(attention), "each output projection reads its attention's float8 YQ"
    ops = collections.Counter(n.op_type for n in artefact.graph.node)
    unfused = fp8_attention_out.without_fp8_x(artefact)
    assert collections.Counter(n.op_type for n in unfused.graph.node) == ops, "the rule changes no node count: the pass lives inside Fp8GemmAct"
    _assert_same_outputs(artefact, unfused, _feed(np.random.default_rng(), artefact), library)
