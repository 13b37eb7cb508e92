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
from _export import EXPORTERS, _Positional, _axes, exported
from onnxscript.rewriter import pattern
from zoo import ZOO

from deployfuse.export import clean
from deployfuse.rewrite import guard
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
