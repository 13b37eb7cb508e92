"""Decomposed LayerNorm -> LayerNormalization-17 on every target, both exporters, opsets 16-18
(ONNX Runtime's own LayerNormalization below 17)."""

import pytest
from _export import EXPORTERS, check_case, exported, feeds, op_counts

from deployfuse.rewrite import TARGETS, check_model, fuse


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("exporter", EXPORTERS)
def test_hand_written_layernorm(exporter, target):
    model = check_case("hand_norms", exporter, target, {"layernorm": 1})
    assert not any(n.op_type == "Sub" for n in model.graph.node)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_exporter_layernorm_left_alone(exporter):
    """The exporters already write LayerNormalization for nn.LayerNorm: nothing to rebuild."""
    check_case("convnext", exporter, "ort-cpu", {"layernorm": 0}, {"LayerNormalization": 5})


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_fp16_with_float_statistics(exporter):
    """x.float() -> LayerNorm math -> .to(fp16): LayerNormalization on the fp16 input (stash_type 1)."""
    model = check_case("upcast_norms_fp16", exporter, "tensorrt", {"layernorm": 1}, {"LayerNormalization": 1, "Sub": 0}, rtol=2e-3)
    ln = next(n for n in model.graph.node if n.op_type == "LayerNormalization")
    assert ln.input[0] == model.graph.input[0].name  # the upcast Cast is gone


@pytest.mark.parametrize(("target", "means_left"), [("ort-cpu", 0), ("ort-cuda", 0), ("tensorrt", 1)])
def test_opset_17_axes_attribute(target, means_left):
    """Before opset 18 ReduceMean takes its axes as an attribute (TorchScript at opset 17; the
    dynamo exporter writes opset 18 whatever it is asked). TensorRT keeps the RMSNorm's mean:
    RMSNormalization needs opset 23."""
    check_case("hand_norms", "torchscript", target, {"layernorm": 1}, {"LayerNormalization": 1, "Sub": 0, "ReduceMean": means_left}, opset=17)


@pytest.mark.parametrize("target", ["ort-cpu", "ort-cuda"])
def test_opset_16_gets_onnx_runtimes_own_layernorm(target):
    """Below opset 17 TorchScript writes BERT's LayerNorms decomposed, and the export cleanup
    drops their ε (1e-12) as an add of zero. ONNX Runtime gets its own ONNX-domain
    LayerNormalization (registered for opsets 1-16) with ε 0, which skip_layernorm then takes. On ort-cuda the
    embeddings' one is taken by embed_layer_norm (with its lookups) instead."""
    embedding = int(target == "ort-cuda")
    model = check_case("bert", "torchscript", target, {"layernorm": 5, "skip_layernorm": 4},
                       {"LayerNormalization": 1 - embedding, "com.microsoft::EmbedLayerNormalization": embedding,
                        "com.microsoft::SkipLayerNormalization": 4, "ReduceMean": 0}, opset=16)
    assert model.opset_import[0].version == 16
    check_model(model)  # ORT's own op checked as such, everything else by onnx.checker


def test_tensorrt_below_opset_17_keeps_layernorm_decomposed():
    """LayerNormalization is not a standard op before 17 and TensorRT has no ORT ops: a near miss, not a fusion."""
    model = exported("bert", "torchscript", 16)
    out, report = fuse(model, "tensorrt", feeds("bert", model), debug=True, families=["layernorm"])
    (family,) = report.families
    assert report.counts() == {"layernorm": 0} and not family.rolled_back
    assert family.near_misses["layernorm"] == ["tensorrt has no kernel for ai.onnx::LayerNormalization on float (opset 16)"]
    assert op_counts(out)["ReduceMean"] == 10
