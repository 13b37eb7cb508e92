"""Norm + activation -> deployfuse.LayerNormGelu / GroupNormAct (GPU targets)."""

import pytest

from _export import check_case


@pytest.mark.parametrize("target", ["ort-cuda", "tensorrt"])
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_groupnorm_silu(exporter, target):
    check_case("unet_block", exporter, target, {"groupnorm_silu": 2}, {"deployfuse::GroupNormAct": 2, "InstanceNormalization": 0})


@pytest.mark.parametrize("target", ["ort-cuda", "tensorrt"])
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_layernorm_gelu(exporter, target):
    check_case("feature_encoder", exporter, target, {"layernorm_gelu": 1}, {"deployfuse::LayerNormGelu": 1, "LayerNormalization": 0})


def test_nothing_on_cpu():
    check_case("unet_block", "dynamo", "ort-cpu", {"groupnorm_silu": 0}, {"InstanceNormalization": 2})
