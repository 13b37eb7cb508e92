"""Decomposed LayerNorm -> LayerNormalization-17, on every target, both exporters."""

import pytest

from _export import EXPORTERS, check_case
from deployfuse.rewrite import TARGETS


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
