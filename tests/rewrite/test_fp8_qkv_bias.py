"""rules.fp8_qkv_bias: the packed QKV fp8 GEMM's bias moves into the FusedMHA that reads the GEMM's output.

On a hand-built graph and on tiny BertModel / GPT2Model fp8 ort-cuda exports with trained-like (non-zero) biases, each
FusedMHA takes its QKV GEMM's bias, the GEMM keeps an empty one, and the graph computes what `undo` (the biases back in the
GEMMs) computes, on fresh random inputs, through the function bodies (ONNX Runtime optimisations off) and the CPU custom-op
library. The near misses are left alone with their reason; other targets are unchanged, and so is every model unless
DEPLOYFUSE_FP8_QKV_BIAS=1 (set here for the other tests).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import transformers
from _export import _trained_like
from _native import random_feed, without_deployfuse_bodies
from onnx import helper, numpy_helper

import deployfuse
from deployfuse.backends.ort import run, session
from deployfuse.ops import attach_functions, ort_custom_ops_library
from deployfuse.ops.schema import to_element_type
from deployfuse.rewrite.rules import fp8_qkv_bias

HIDDEN, HEADS = 32, 2
F16 = onnx.TensorProto.FLOAT16


@pytest.fixture(scope="module")
def library():
    return ort_custom_ops_library()


@pytest.fixture(autouse=True)
def rule_on(monkeypatch):
    monkeypatch.setenv(fp8_qkv_bias.ENV, "1")


def _graph(rng: np.random.Generator, *, activation: str = "none", other_reader: bool = False) -> onnx.ModelProto:
    """x [2, 7, hidden] -> Fp8GemmAct (a bias, `activation`) -> packed QKV [2, 7, 3·hidden] -> FusedMHA(P, P, P, mask) -> y;
    with `other_reader`, an Add also reads the packed QKV."""
    weight = rng.standard_normal((3 * HIDDEN, HIDDEN)).astype(np.float32) / np.sqrt(HIDDEN)
    w_scale = np.float32(np.abs(weight).max() / 448)
    inits = [numpy_helper.from_array(np.array(1 / 64, np.float32), "xs"), numpy_helper.from_array(np.array(w_scale, np.float32), "ws"),
             numpy_helper.from_array(to_element_type(weight / w_scale, "float8e4m3fn"), "w"),
             numpy_helper.from_array(rng.standard_normal(3 * HIDDEN).astype(np.float16), "b")]
    nodes = [helper.make_node("Fp8GemmAct", ["x", "xs", "w", "ws", "b"], ["qkv"], name="qkv_gemm", domain="deployfuse", activation=activation),
             helper.make_node("FusedMHA", ["qkv", "qkv", "qkv", "mask"], ["y"], name="mha", domain="deployfuse", num_heads=HEADS, packed_qkv=1),
             *([helper.make_node("Add", ["qkv", "qkv"], ["twice"])] if other_reader else [])]
    inputs = [helper.make_tensor_value_info("x", F16, [2, 7, HIDDEN]), helper.make_tensor_value_info("mask", F16, [2, 1, 1, 7])]
    outputs = [helper.make_tensor_value_info(o, F16, None) for o in ("y", *(["twice"] if other_reader else []))]
    model = helper.make_model(helper.make_graph(nodes, "qkv_fp8", inputs, outputs, inits), opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    attach_functions(model)
    return model


def _assert_same_outputs(fused: onnx.ModelProto, unfused: onnx.ModelProto, feed: dict[str, np.ndarray], library) -> None:
    """The same attention up to rounding: Q, K and V are rounded to float16 before the bias is added as well as after, and a
    later layer's float8 quantization can move a value by a step."""
    for lib in (None, library):
        pair = [m if lib is None else without_deployfuse_bodies(m) for m in (fused, unfused)]
        got, want = (run(session(m, optimize=False, custom_ops_library=lib), feed) for m in pair)
        assert set(got) == set(want)
        for name, value in want.items():
            ref, out = value.astype(np.float64), got[name].astype(np.float64)
            rel = np.linalg.norm(out - ref) / np.linalg.norm(ref)
            assert rel < 1e-2 and np.abs(out - ref).max() < 0.05 * np.abs(ref).max(), (name, lib, rel)


def test_the_bias_moves_into_the_attention_and_back(library):
    rng = np.random.default_rng()
    model = _graph(rng)
    fused, count, refused = fp8_qkv_bias.fuse(onnx.ModelProto.FromString(model.SerializeToString()), "ort-cuda")
    attach_functions(fused)
    assert (count, refused) == (1, [])
    gemm, mha = fused.graph.node
    assert list(mha.input) == ["qkv", "qkv", "qkv", "mask", "", "b"], "the GEMM's bias after an absent YScale"
    empty = next(t for t in fused.graph.initializer if t.name == gemm.input[4])
    assert list(empty.dims) == [0] and empty.data_type == F16, "the GEMM's bias is empty, still float16"
    feed = random_feed(rng, model)
    _assert_same_outputs(fused, model, feed, library)
    unfused = fp8_qkv_bias.undo(fused)
    assert [list(n.input) for n in unfused.graph.node] == [list(n.input) for n in model.graph.node], "undo restores the nodes"
    assert {t.name for t in unfused.graph.initializer} == {t.name for t in model.graph.initializer}
    unbiased = onnx.ModelProto.FromString(fused.SerializeToString())
    bias = next(t for t in unbiased.graph.initializer if t.name == "b")
    bias.CopyFrom(numpy_helper.from_array(np.zeros(3 * HIDDEN, np.float16), "b"))  # the same graph, its moved bias zero
    without = run(session(unbiased, optimize=False), feed)["y"].astype(np.float64)
    assert np.abs(run(session(fused, optimize=False), feed)["y"].astype(np.float64) - without).max() > 0.05, "the moved bias moves Y"


@pytest.mark.parametrize("change,why", [({"activation": "gelu_tanh"}, "activation after its bias"), ({"other_reader": True}, "other readers")])
def test_near_misses_are_left_alone_with_their_reason(change, why):
    model = _graph(np.random.default_rng(0), **change)
    fused, count, refused = fp8_qkv_bias.fuse(model, "ort-cuda")
    assert count == 0 and len(refused) == 1 and why in refused[0], refused
    assert all(len(n.input) <= 4 for n in fused.graph.node if n.op_type == "FusedMHA")


def test_other_targets_keep_the_bias_in_the_gemm():
    for target in ("ort-cpu", "tensorrt"):
        assert fp8_qkv_bias.fuse(_graph(np.random.default_rng(0)), target)[1:] == (0, [])


def test_off_unless_asked(monkeypatch):
    monkeypatch.delenv(fp8_qkv_bias.ENV)
    assert fp8_qkv_bias.fuse(_graph(np.random.default_rng(0)), "ort-cuda")[1:] == (0, [])


_MODELS = {
    "bert": lambda: transformers.BertModel(transformers.BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                                     intermediate_size=128, max_position_embeddings=64)),
    "gpt2": lambda: transformers.GPT2Model(transformers.GPT2Config(vocab_size=500, n_embd=64, n_layer=2, n_head=4, n_positions=64)),
}


@pytest.mark.parametrize("name", list(_MODELS))
def test_fp8_export_adds_each_qkv_bias_in_the_attention(library, name, tmp_path):
    """Every layer's FusedMHA takes its QKV GEMM's bias (GPT-2's through the Reshape after its Gemm), and the artefact computes
    what it computes with the biases back in the GEMMs."""
    torch.manual_seed(0)
    model = _MODELS[name]().eval()
    _trained_like(model)
    ids = torch.randint(0, 500, (2, 16))
    result = deployfuse.export(model, tmp_path / "model.onnx", example_inputs={"input_ids": ids, "attention_mask": torch.ones_like(ids)},
                               target="ort-cuda", precision="fp8", accuracy_budget="cos=0.99,rel=0.2", seed=0, verify_draws=1)
    artefact = onnx.load(result.onnx_path)
    attention = [n for n in artefact.graph.node if n.op_type == "FusedMHA"]
    assert len(attention) == model.config.num_hidden_layers and all(len(n.input) == 6 and n.input[5] for n in attention)
    sizes = {t.name: list(t.dims) for t in artefact.graph.initializer}
    assert all(sizes[n.input[5]] == [3 * 64] for n in attention), "each Bias is its layer's [3 · hidden] QKV bias"
    unfused = fp8_qkv_bias.undo(artefact)  # runs as it is: FusedMHA without a Bias has its own function body
    assert not fp8_qkv_bias.has_moved_bias(unfused)
    _assert_same_outputs(artefact, unfused, random_feed(np.random.default_rng(), artefact), library)
