"""Split QKV: where packed_qkv is skipped (an fp8 ort-cuda export), every self-attention layer of the
zoo's BERT (fp32 and fp16), ViT and Whisper encoder (scaled query, bias-free key) has its three
Q, K, V MatMuls and bias Adds replaced by one MatMul + Add on the packed weight and a Split feeding
MultiHeadAttention, with the numbers of the graph before the rule (ORT optimisations off) on fresh
inputs at two shapes; with packed_qkv run, an ort-cuda export is left as it was
(com.microsoft.Attention); a BERT decoder's cross-attention is refused with the reason; tensorrt
gets no rule."""

from __future__ import annotations

import zlib

import onnx
import pytest
from _export import feeds, op_counts
from _forms import Form, exported
from test_attention import assert_same_outputs
from test_packed_qkv import bert_decoder, decoder_feeds
from zoo import ZOO

from deployfuse.quantize.lowering import FP8_SKIPPED_FAMILIES
from deployfuse.rewrite import family_names, fuse, guard
from deployfuse.rewrite.report import FusionReport
from deployfuse.rewrite.rules import split_qkv


def _fused(name: str, model: onnx.ModelProto, skipped: tuple[str, ...]) -> tuple[onnx.ModelProto, FusionReport]:
    """`model` (zoo model `name`) fused for ort-cuda by every family but `skipped`, none rolled back."""
    out, report = fuse(model, "ort-cuda", feeds(name, model, seed=1), families=[f for f in family_names() if f not in skipped])
    assert not [f.family for f in report.families if f.rolled_back], [(f.family, f.reason) for f in report.families if f.rolled_back]
    return out, report


def _qkv_sources(model: onnx.ModelProto) -> list[set[str]]:
    """For each MultiHeadAttention, the op types producing its query, key and value."""
    producers = {o: n.op_type for n in model.graph.node for o in n.output}
    return [{producers.get(i, "") for i in n.input[:3]} for n in model.graph.node if n.op_type == "MultiHeadAttention"]


@pytest.mark.parametrize(("name", "precision", "removed"), [
    ("bert", "fp32", {"MatMul": 2, "Add": 2}),
    ("bert", "fp16", {"MatMul": 2, "Add": 2}),
    ("vit", "fp32", {"MatMul": 2, "Add": 2}),
    ("whisper_encoder", "fp32", {"MatMul": 2, "Add": 1, "Mul": 1}),  # K has no bias, Q's scale folds into the packed weight
])
def test_self_attention_becomes_one_gemm_and_a_split(name: str, precision: str, removed: dict[str, int]) -> None:
    """Fused as an fp8 ort-cuda export fuses (packed_qkv skipped): per layer `removed` ops fewer
    than without split_qkv, one Split more, Q, K, V all from it, and the same numbers."""
    layers, model = ZOO[name].layers, exported(name, Form(precision=precision)).model
    before, _ = _fused(name, model, (*FP8_SKIPPED_FAMILIES, "split_qkv", "packed_mha"))
    after, report = _fused(name, model, (*FP8_SKIPPED_FAMILIES, "packed_mha"))  # packed_mha would take the Split it leaves
    assert report.counts()["split_qkv"] == layers
    have, had = op_counts(after), op_counts(before)
    assert {op: had.get(op, 0) - have.get(op, 0) for op in (*removed, "Split")} == {**{op: n * layers for op, n in removed.items()}, "Split": -layers}, (had, have)
    assert _qkv_sources(after) == [{"Split"}] * layers and not [s for s in _qkv_sources(before) if "Split" in s]
    assert_same_outputs(before, after, seed=zlib.crc32(repr((name, precision)).encode()) % 1000)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_packed_qkv_still_takes_them_first(precision: str) -> None:
    """An fp32 or fp16 ort-cuda export (every family run) is unchanged: one Attention per layer, no Split."""
    layers = ZOO["bert"].layers
    model, report = _fused("bert", exported("bert", Form(precision=precision)).model, ())
    assert report.counts()["packed_qkv"] == layers and report.counts()["split_qkv"] == 0, report.counts()
    have = op_counts(model)
    assert have["com.microsoft::Attention"] == layers and "Split" not in have and "com.microsoft::MultiHeadAttention" not in have, have


def test_cross_attention_is_refused() -> None:
    """A BERT decoder: its self-attentions split, its cross-attentions (K, V from the encoder) do not."""
    model = bert_decoder()
    out, report = fuse(model, "ort-cpu", decoder_feeds(seed=1), debug=True, families=[f for f in family_names() if f != "packed_qkv"])
    (family,) = [f for f in report.families if f.family == "split_qkv"]
    assert not family.rolled_back and family.matches == {"split_qkv": 2}, family  # 2 layers x self-attention
    assert "Q, K, V are projections of different inputs (cross-attention)" in family.near_misses["split_qkv"], family.near_misses
    assert _qkv_sources(out).count({"Split"}) == 2 and op_counts(out)["com.microsoft::MultiHeadAttention"] == 4
    fresh = decoder_feeds(seed=5)
    guard.check(out, guard.run_outputs(model, fresh, ["CPUExecutionProvider"]), fresh, ["CPUExecutionProvider"])


def test_nothing_for_tensorrt() -> None:
    assert split_qkv.rules("tensorrt") == [] and split_qkv.rules("ort-cuda") and split_qkv.rules("ort-cpu")
