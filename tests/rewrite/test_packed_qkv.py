"""Packed QKV: every self-attention layer of the zoo's BERT and ViT (both exporters) and Whisper
encoder, for ort-cpu and ort-cuda, becomes one com.microsoft.Attention in place of
MultiHeadAttention and the projection MatMuls / bias Adds / query scale, with the numbers of the
unfused graph (ORT optimisations off) on fresh inputs at two shapes; a BERT decoder's
cross-attention stays MultiHeadAttention."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import onnx
import pytest
import torch
from _export import EXPORTERS, _trained_like, exported, feeds, fused, op_counts
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
def test_whisper_scaled_query_and_bias_free_key_pack(target: str) -> None:
    """Whisper: Q = (x·Wq + bq)·s, K = x·Wk (no bias), V = x·Wv + bv."""
    check_packed("whisper_encoder", "dynamo", target, {"MatMul": 3, "Add": 2, "Mul": 1})


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
