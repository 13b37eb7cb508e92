"""Attention + rotary fusion on the zoo, both exporters: exact counts, and outputs equal to the
unfused graph (ORT optimisations off) on fresh inputs at two shapes (batch and seq changed)."""

from __future__ import annotations

import functools
import io
import warnings
import zlib
from collections import Counter

import numpy as np
import onnx
import onnx_ir as ir
import onnxscript.optimizer
import pytest
import torch
from _export import EXPORTERS, _Positional, _axes, _trained_like, check_case, exported
from onnxscript.rewriter import pattern
from zoo import ZOO

from deployfuse.export import clean
from deployfuse.rewrite import fuse, guard
from deployfuse.rewrite.rules import attention, rotary

TRANSFORMERS = ("bert", "gpt2", "vit", "llama", "whisper_encoder")


@functools.cache
def export(name: str, exporter: str) -> onnx.ModelProto:
    """`exported`, except decoders under the TorchScript exporter get a padding mask input:
    without one transformers 5 traces `aten::diff` (packed-sequence detection), which that
    exporter cannot write. A padding mask is also the form those exports have in deployment."""
    if exporter == "dynamo" or name not in ("gpt2", "llama"):
        return exported(name, exporter)
    torch.manual_seed(0)
    module, inputs = ZOO[name].build()
    inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
    axes = {**_axes(name), "attention_mask": {0: "batch", 1: "seq"}}
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_Positional(module, list(inputs)), tuple(inputs.values()), buffer, dynamo=False, input_names=list(inputs), dynamic_axes=axes, opset_version=18)
    return clean(onnx.load_from_string(buffer.getvalue()))


def fused(model: onnx.ModelProto, rules: list[pattern.RewriteRule]) -> tuple[onnx.ModelProto, Counter]:
    """`rules` applied one after another (as the fuser does), dead nodes dropped, functions attached."""
    ir_model = ir.serde.deserialize_model(model)
    counts: Counter = Counter()
    for rule in rules:
        counts[rule.name] += pattern.RewriteRuleSet([rule]).apply_to_model(ir_model)
    onnxscript.optimizer.remove_unused_nodes(ir_model)
    out = ir.serde.serialize_model(ir_model)
    if any(n.domain == "deployfuse" for n in out.graph.node):
        from deployfuse.ops import attach_functions

        attach_functions(out)
    return out, counts


def fresh_feeds(model: onnx.ModelProto, seed: int) -> list[dict[str, np.ndarray]]:
    """Random inputs at the traced shape and at a larger batch / sequence (dynamic axes only)."""
    rng = np.random.default_rng(seed)
    out = []
    for sizes in ({"batch": 2, "seq": 16}, {"batch": 3, "seq": 11}):
        feed = {}
        for value in model.graph.input:
            dims = [d.dim_value or sizes.get(d.dim_param, sizes["batch"] if i == 0 else sizes["seq"]) for i, d in enumerate(value.type.tensor_type.shape.dim)]
            if value.type.tensor_type.elem_type == onnx.TensorProto.INT64:
                feed[value.name] = np.ones(dims, np.int64) if "mask" in value.name else rng.integers(0, 512, dims)
            else:
                feed[value.name] = rng.standard_normal(dims).astype(np.float32)
        out.append(feed)
    return out


def ops(model: onnx.ModelProto) -> Counter:
    return Counter(f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in model.graph.node)


def assert_same_outputs(before: onnx.ModelProto, after: onnx.ModelProto, seed: int) -> None:
    feeds = fresh_feeds(before, seed)
    reference = guard.run_outputs(before, feeds, ["CPUExecutionProvider"])
    guard.check(after, reference, feeds, ["CPUExecutionProvider"])  # raises GuardFailure with the reason


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", TRANSFORMERS)
def test_every_layer_fuses_to_multihead_attention(name: str, exporter: str) -> None:
    model = export(name, exporter)
    rotated, _ = fused(model, rotary.rules("ort-cpu"))  # the family before attention in the registry
    out, counts = fused(rotated, attention.rules("ort-cpu"))
    histogram = ops(out)
    assert histogram["com.microsoft::MultiHeadAttention"] == ZOO[name].layers, (counts, histogram)
    assert histogram["Softmax"] == 0
    if name == "llama":  # rotary on Q and K of every layer
        assert histogram["com.microsoft::RotaryEmbedding"] == 2 * ZOO[name].layers
    assert_same_outputs(model, out, seed=zlib.crc32(repr((name, exporter)).encode()) % 1000)


@pytest.mark.parametrize(("name", "exporter"), [("bert", "torchscript"), ("gpt2", "dynamo"), ("llama", "dynamo")])
def test_tensorrt_gets_fused_mha_and_no_contrib_op(name: str, exporter: str) -> None:
    model = export(name, exporter)
    out, _ = fused(model, attention.rules("tensorrt"))
    histogram = ops(out)
    assert histogram["deployfuse::FusedMHA"] == ZOO[name].layers
    assert not [op for op in histogram if op.startswith("com.microsoft")]
    assert_same_outputs(model, out, seed=7)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_rotary_family_alone_fuses_q_and_k(exporter: str) -> None:
    model = export("llama", exporter)
    out, _ = fused(model, rotary.rules("ort-cpu"))
    assert ops(out)["com.microsoft::RotaryEmbedding"] == 2 * ZOO["llama"].layers
    assert_same_outputs(model, out, seed=11)
    assert rotary.rules("tensorrt") == []


def test_models_without_attention_are_left_alone() -> None:
    model = export("resnet18", "dynamo")
    out, counts = fused(model, attention.rules("ort-cpu"))
    assert sum(counts.values()) == 0
    assert len(out.graph.node) == len(model.graph.node)


@pytest.mark.parametrize("target", ["ort-cpu", "tensorrt"])
@pytest.mark.parametrize("exporter", EXPORTERS)
def test_masked_fill_attention_fuses(exporter: str, target: str) -> None:
    """nanoGPT's hand-written attention, `masked_fill(tril == 0, -inf)` on the scores (Where(c, -inf, s)): the selection
    becomes the additive mask Where(c, lowest, 0), and the layer one fused attention (packed on ort-cpu), with the numbers
    of the unfused graph."""
    fused_ops = {"ort-cpu": {"com.microsoft::Attention": 1, "Softmax": 0}, "tensorrt": {"deployfuse::FusedMHA": 1, "Softmax": 0}}[target]
    check_case("masked_fill_attention", exporter, target, {}, fused_ops)


def test_a_selected_score_above_the_masking_fill_is_not_a_mask() -> None:
    """masked_fill(c, -100) leaves the selected scores a real weight in the softmax: no fused attention, and --debug says why."""
    model = exported("masked_fill_score", "dynamo")
    rng = np.random.default_rng()
    feeds = [{"x": rng.standard_normal((2, 8, 32)).astype(np.float32)}]
    out, report = fuse(model, "ort-cpu", feeds, debug=True, families=["attention"])
    (family,) = report.families
    assert family.matches["attention"] == 0 and ops(out)["Softmax"] == 1
    assert "the scores are selected against -100.0, above -10000.0: a score, not a mask" in family.near_misses["attention"]


def _dynamic_text_export(module: torch.nn.Module) -> onnx.ModelProto:
    """`module` (input_ids, attention_mask) dynamo-exported with dynamic batch and sequence, cleaned."""
    ids = torch.randint(0, 512, (2, 16))
    auto = {0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(module, (), kwargs={"input_ids": ids, "attention_mask": torch.ones_like(ids)}, dynamo=True,
                                    dynamic_shapes={"input_ids": auto, "attention_mask": auto}, opset_version=18, optimize=True, verbose=False)
    return clean(program.model_proto)


@functools.cache
def gpt_neo(half: bool = False) -> onnx.ModelProto:
    """A 2-layer GPTNeoModel (global attention), dynamo-exported with dynamic batch and sequence, fp16 when `half`: its
    scores are torch.where(causal, q @ kᵀ, finfo.min) plus the padding mask, unscaled, computed in float32 (Q and K
    cast up, P cast back to V's dtype: in fp16 a float32 attention core between Casts)."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPTNeoConfig(vocab_size=512, hidden_size=64, num_layers=2, num_heads=4, attention_types=[[["global"], 2]],
                                    max_position_embeddings=64, use_cache=False)
    module = transformers.GPTNeoModel(cfg).eval()
    _trained_like(module)
    return _dynamic_text_export(module.half() if half else module)


def padded_feeds() -> list[dict[str, np.ndarray]]:
    """Fresh token ids at two shapes, right padding in one row (every query keeps a key: a fully masked row differs,
    `_attention_core`)."""
    rng = np.random.default_rng()
    feeds = []
    for batch, seq in ((2, 16), (3, 9)):
        mask = np.ones((batch, seq), np.int64)
        mask[1, seq - seq // 3:] = 0
        feeds.append({"input_ids": rng.integers(0, 512, (batch, seq)), "attention_mask": mask})
    return feeds


def test_gpt_neo_selection_under_the_padding_mask_fuses() -> None:
    """GPT-Neo: Where(causal, s, lowest) + padding mask → one packed Attention a layer (scale 1), with the numbers of the
    unfused graph at two shapes, a padded row among them."""
    model, feeds = gpt_neo(), padded_feeds()
    out, report = fuse(model, "ort-cpu", feeds[:1])
    counts, histogram = report.counts(), ops(out)
    assert counts["attention"] == 2 and counts["packed_qkv"] == 2, counts
    assert histogram["com.microsoft::Attention"] == 2 and histogram["Softmax"] == 0, histogram
    # the head merge's sequence length is computed (sym_min) and kept: one Reshape of the fused output, no Transpose
    merges = [n for n in out.graph.node if n.op_type == "Reshape" and n.input[0] in {o for a in out.graph.node if a.op_type == "Attention" for o in a.output}]
    assert len(merges) == 2 and histogram["Transpose"] == 0, histogram
    assert {a.f for n in out.graph.node if n.op_type == "Attention" for a in n.attribute if a.name == "scale"} == {1.0}
    guard.check(out, guard.run_outputs(model, feeds, ["CPUExecutionProvider"]), feeds, ["CPUExecutionProvider"])


def test_fp16_gpt_neo_keeps_its_float32_attention_fused() -> None:
    """GPT-Neo in fp16 computes attention in float32 between Casts: one float32 MultiHeadAttention a layer (Q and K
    cast as the model casts them, V cast up, the output cast back), no Softmax left, and the numbers of the unfused
    graph at two shapes, a padded row among them."""
    model, feeds = gpt_neo(half=True), padded_feeds()
    out, report = fuse(model, "ort-cpu", feeds[:1])
    counts, histogram = report.counts(), ops(out)
    assert counts["attention"] == 2 and histogram["com.microsoft::MultiHeadAttention"] == 2 and histogram["Softmax"] == 0, (counts, histogram)
    graph = ir.from_proto(out).graph
    for node in graph:
        if node.op_type == "MultiHeadAttention":
            assert {v.dtype for v in node.inputs[:3]} | {node.outputs[0].dtype} == {ir.DataType.FLOAT}, node
            (user, _), = node.outputs[0].uses()
            assert user.op_type == "Reshape" or (user.op_type == "Cast" and user.attributes.get_int("to") == ir.DataType.FLOAT16), user
    guard.check(out, guard.run_outputs(model, feeds, ["CPUExecutionProvider"]), feeds, ["CPUExecutionProvider"])


@functools.cache
def bloom() -> onnx.ModelProto:
    """A 2-layer BloomModel, dynamo-exported with dynamic batch and sequence: its core runs on heads flat in the batch,
    Q·Kᵀ as [B·H, S, L] plus ALiBi's [B·H, 1, L] bias (baddbmm), reshaped to [B, H, S, L] for the padding mask."""
    import transformers

    torch.manual_seed(0)
    module = transformers.BloomModel(transformers.BloomConfig(vocab_size=512, hidden_size=64, n_layer=2, n_head=4, use_cache=False)).eval()
    _trained_like(module)
    return _dynamic_text_export(module)


@pytest.mark.parametrize("target", ["ort-cpu", "tensorrt"])
def test_bloom_flat_heads_and_alibi_fuse(target: str) -> None:
    """BLOOM: attention on [B·H, S, D] views with ALiBi added to the flat scores → one fused attention a layer (ALiBi
    reshaped to [B, H, 1, L] into its mask), no Softmax left, with the numbers of the unfused graph at two shapes, a
    padded row among them."""
    model, feeds = bloom(), padded_feeds()
    out, report = fuse(model, target, feeds[:1])
    fused = "com.microsoft::MultiHeadAttention" if target == "ort-cpu" else "deployfuse::FusedMHA"
    counts, histogram = report.counts(), ops(out)
    assert counts["attention"] == 2 and histogram[fused] == 2 and histogram["Softmax"] == 0, (counts, histogram)
    guard.check(out, guard.run_outputs(model, feeds, ["CPUExecutionProvider"]), feeds, ["CPUExecutionProvider"])
