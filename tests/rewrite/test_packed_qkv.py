"""Packed QKV: every self-attention layer of the zoo's BERT and ViT (both exporters) and Whisper
encoder, for ort-cpu and ort-cuda, becomes one com.microsoft.Attention in place of
MultiHeadAttention and the projection MatMuls / bias Adds / query scale, with the numbers of the
unfused graph (ORT optimisations off) on fresh inputs at two shapes; so do projections run on
the flattened tokens (Reshape -> Gemm -> Reshape); a BERT decoder's cross-attention stays
MultiHeadAttention."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import onnx
import onnx_ir as ir
import pytest
import torch
from _export import EXPORTERS, _trained_like, check_case, exported, feeds, fused, op_counts
from test_attention import assert_same_outputs
from zoo import ZOO

from deployfuse.export import clean
from deployfuse.rewrite import family_names, fuse, guard
from deployfuse.rewrite.rules import packed_qkv

ORT_TARGETS = ("ort-cpu", "ort-cuda")


@functools.cache
def unpacked(name: str, exporter: str, target: str) -> onnx.ModelProto:
    """The same export fused by every family except packed_qkv."""
    model = exported(name, exporter)
    out, _ = fuse(model, target, feeds(name, model, seed=1), families=[f for f in family_names() if f != "packed_qkv"])
    return out


def check_packed(name: str, exporter: str, target: str, removed: dict[str, int]) -> None:
    """Every layer packed: one Attention, no MultiHeadAttention, `removed` ops per layer gone,
    the fused node tagged, and the numbers of the unfused graph at two shapes."""
    layers = ZOO[name].layers
    model, counts, rolled = fused(name, exporter, target)
    assert not rolled, rolled
    assert counts["packed_qkv"] == layers, counts
    have, before = op_counts(model), op_counts(unpacked(name, exporter, target))
    assert have.get("com.microsoft::Attention", 0) == layers and "com.microsoft::MultiHeadAttention" not in have, have
    assert {op: before.get(op, 0) - have.get(op, 0) for op in removed} == {op: n * layers for op, n in removed.items()}, (before, have)
    tags = {p.value for n in model.graph.node if n.op_type == "Attention" for p in n.metadata_props if p.key == "deployfuse.rule"}
    assert tags == {"packed_qkv"}
    assert_same_outputs(exported(name, exporter), model, seed=hash((name, exporter, target)) % 1000)


@pytest.mark.parametrize("target", ORT_TARGETS)
@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", ["bert", "vit"])
def test_self_attention_packs_into_attention(name: str, exporter: str, target: str) -> None:
    check_packed(name, exporter, target, {"MatMul": 3, "Add": 3})  # Q, K, V projections and their biases


@pytest.mark.parametrize("target", ORT_TARGETS)
@pytest.mark.parametrize("exporter", EXPORTERS)
def test_whisper_scaled_query_and_bias_free_key_pack(exporter: str, target: str) -> None:
    """Whisper: Q = (x·Wq + bq)·s, K = x·Wk (no bias), V = x·Wv + bv; from TorchScript each
    reaches the attention through a head split by `view(B, -1, H, hd)` and a merge back."""
    check_packed("whisper_encoder", exporter, target, {"MatMul": 3, "Add": 2, "Mul": 1})


@functools.cache
def bert_decoder() -> onnx.ModelProto:
    """The zoo's BERT as a decoder with cross-attention: self-attention on the tokens (causal),
    cross-attention with queries from the tokens and keys / values from `encoder_hidden_states`."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                                  max_position_embeddings=128, is_decoder=True, add_cross_attention=True, use_cache=False)
    module = transformers.BertModel(cfg, add_pooling_layer=False).eval()
    _trained_like(module)
    inputs = {"input_ids": torch.randint(0, 512, (2, 16)), "encoder_hidden_states": torch.randn(2, 8, 64)}
    auto = torch.export.Dim.AUTO
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(module, (), kwargs=inputs, dynamo=True, dynamic_shapes={"input_ids": {0: auto, 1: auto}, "encoder_hidden_states": {0: auto, 1: auto}},
                                    opset_version=18, optimize=True, verbose=False)
    return clean(program.model_proto)


def decoder_feeds(seed: int) -> list[dict[str, np.ndarray]]:
    """(batch, tokens, encoder length) = (2, 16, 8) and (3, 11, 5)."""
    rng = np.random.default_rng(seed)
    return [{"input_ids": rng.integers(0, 512, (b, s)), "encoder_hidden_states": rng.standard_normal((b, l, 64)).astype(np.float32)} for b, s, l in ((2, 16, 8), (3, 11, 5))]


def test_cross_attention_is_not_packed() -> None:
    model = bert_decoder()
    out, report = fuse(model, "ort-cpu", decoder_feeds(seed=1))
    counts, have = report.counts(), op_counts(out)
    assert not [f.family for f in report.families if f.rolled_back]
    assert counts["attention"] == 4 and counts["packed_qkv"] == 2, counts  # 2 layers x (self + cross)
    assert have.get("com.microsoft::Attention", 0) == 2 and have.get("com.microsoft::MultiHeadAttention", 0) == 2, have
    feeds_ = decoder_feeds(seed=5)
    guard.check(out, guard.run_outputs(model, feeds_, ["CPUExecutionProvider"]), feeds_, ["CPUExecutionProvider"])


def test_nothing_for_tensorrt() -> None:
    assert packed_qkv.rules("tensorrt") == []


@pytest.mark.parametrize("target", ORT_TARGETS)
def test_projections_on_flattened_tokens_pack(target: str) -> None:
    """Each projection as Reshape(x, [B·S, Din]) -> Gemm | MatMul -> Reshape(·, [B, S, H, hd])
    (addmm, a bias-free mm, a 2-D linear with transB): one Attention on x, nothing else left."""
    check_case("gemm_projections", "dynamo", target, {"attention": 1, "packed_qkv": 1},
               {"com.microsoft::Attention": 1, "Gemm": 0, "MatMul": 0, "Reshape": 0, "Transpose": 0})


def _flat_projection(back: list[int]) -> ir.Value:
    """x [2, 8, 32] -> Reshape [16, 32] -> Gemm(W, b) -> Reshape `back`, shapes inferred."""
    rng = np.random.default_rng(0)
    inits = [onnx.numpy_helper.from_array(a, n) for n, a in (("flat", np.array([16, 32])), ("back", np.array(back)),
                                                               ("w", rng.standard_normal((32, 32)).astype(np.float32)), ("b", rng.standard_normal(32).astype(np.float32)))]
    nodes = [onnx.helper.make_node("Reshape", ["x", "flat"], ["x2"]), onnx.helper.make_node("Gemm", ["x2", "w", "b"], ["y"]),
             onnx.helper.make_node("Reshape", ["y", "back"], ["out"]), onnx.helper.make_node("Identity", ["out"], ["z"])]
    graph = onnx.helper.make_graph(nodes, "g", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 8, 32])],
                                   [onnx.helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, None)], inits)
    model = onnx.shape_inference.infer_shapes(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)]))
    return next(v for n in ir.serde.deserialize_model(model).graph for v in n.outputs if v.name == "out")


def test_flattened_projection_needs_the_tokens_back_in_order() -> None:
    """Reshape back to x's [B, S, D] is x·W + b per token; to [S, B, D] it mixes tokens of different batches."""
    found = packed_qkv._projection(_flat_projection([2, 8, 32]))
    assert found is not None and found[0].name == "x" and found[2].shape == (32, 32) and found[3].shape == (32,)
    assert packed_qkv._projection(_flat_projection([8, 2, 32])) is None
