"""RMSNorm -> SimplifiedLayerNormalization (ONNX Runtime, every opset) / RMSNormalization-23
(TensorRT, opset 23 on)."""

import functools

import onnx
import onnx.version_converter
import pytest
from _export import assert_same_outputs, check_case, exported, feeds, op_counts

from deployfuse.export import clean
from deployfuse.rewrite import fuse


@pytest.mark.parametrize(("target", "skips"), [("ort-cuda", 4), ("ort-cpu", 1)])
def test_llama_rmsnorm(target, skips):
    # 2 layers x 2 norms + the final norm = 5; 4 follow a residual add, whose sum LLaMA (pre-norm)
    # uses again: fused on CUDA; on CPU, where that form measured slower, only the final norm
    check_case("llama", "dynamo", target, {"rmsnorm": 5, "skip_rmsnorm": skips},
               {"SimplifiedLayerNormalization": 5 - skips, "com.microsoft::SkipSimplifiedLayerNormalization": skips, "ReduceMean": 0})


@pytest.mark.parametrize(("exporter", "opset"), [("dynamo", 18), ("torchscript", 18), ("torchscript", 17)])
def test_hand_written_rmsnorm(exporter, opset):
    """rsqrt as Reciprocal(Sqrt) (dynamo) and as Div(1, Sqrt) (TorchScript); at opset 17 the
    mean's axes are an attribute."""
    check_case("hand_norms", exporter, "ort-cpu", {"rmsnorm": 1}, {"SimplifiedLayerNormalization": 1, "ReduceMean": 0}, opset=opset)


def test_tensorrt_below_opset_23_keeps_rmsnorm_decomposed():
    check_case("llama", "dynamo", "tensorrt", {"rmsnorm": 0}, {"ReduceMean": 5})


@functools.cache
def at_opset_23(name: str) -> onnx.ModelProto:
    """The opset-18 dynamo export converted to opset 23: asked for 23, the dynamo exporter writes
    RMSNormalization itself (nothing left to fuse) and the TorchScript exporter stops at 20."""
    return clean(onnx.version_converter.convert_version(exported(name, "dynamo"), 23))


OPSET_23 = [
    ("ort-cpu", {"SimplifiedLayerNormalization": 4, "com.microsoft::SkipSimplifiedLayerNormalization": 1, "RMSNormalization": 0}),
    ("ort-cuda", {"SimplifiedLayerNormalization": 1, "com.microsoft::SkipSimplifiedLayerNormalization": 4, "RMSNormalization": 0}),
    ("tensorrt", {"SimplifiedLayerNormalization": 0, "com.microsoft::SkipSimplifiedLayerNormalization": 0, "RMSNormalization": 5}),
]


@pytest.mark.parametrize(("target", "norms"), OPSET_23)
def test_llama_at_opset_23(target, norms):
    """ONNX Runtime keeps SimplifiedLayerNormalization (which skip_rmsnorm takes); TensorRT gets RMSNormalization-23."""
    model = at_opset_23("llama")
    assert model.opset_import[0].version == 23 and op_counts(model)["ReduceMean"] == 5
    out, report = fuse(model, target, feeds("llama", model))
    assert not [f.family for f in report.families if f.rolled_back]
    assert report.counts()["rmsnorm"] == 5
    have = op_counts(out)
    assert {k: have.get(k, 0) for k in [*norms, "ReduceMean"]} == {**norms, "ReduceMean": 0}, have
    assert_same_outputs(model, out, "llama")


def test_exporters_rmsnormalization_left_alone():
    """At opset 23 the dynamo exporter writes RMSNormalization for the hand-written RMSNorm already."""
    check_case("hand_norms", "dynamo", "tensorrt", {"rmsnorm": 0}, {"RMSNormalization": 1, "LayerNormalization": 1, "ReduceMean": 0}, opset=23)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_fp16_with_float_statistics(exporter):
    check_case("upcast_norms_fp16", exporter, "ort-cuda", {"layernorm": 1, "rmsnorm": 1},
               {"SimplifiedLayerNormalization": 1, "LayerNormalization": 1, "Cast": 0}, rtol=2e-3)
