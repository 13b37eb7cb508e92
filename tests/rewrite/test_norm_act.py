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


@pytest.mark.parametrize("target", ["ort-cuda", "tensorrt"])
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_layernorm_transpose_gelu(exporter, target):
    """GELU after transposing the normalised view back (wav2vec2's conv layers): GELU commutes
    with the transpose, so the LayerNorm and the GELU still become one LayerNormGelu."""
    check_case("transposed_norm_gelu", exporter, target, {"layernorm_transpose_gelu": 1}, {"deployfuse::LayerNormGelu": 1, "LayerNormalization": 0, "Transpose": 2})


def test_nothing_on_cpu():
    check_case("unet_block", "dynamo", "ort-cpu", {"groupnorm_silu": 0}, {"InstanceNormalization": 2})


def test_debug_names_a_near_miss_of_the_family():
    """A transposed GELU whose input is not a LayerNorm: --debug says where the structure stopped."""
    import torch
    import torch.nn.functional as F
    from _export import exported, feeds
    from _models import BLOCKS

    from deployfuse.rewrite import fuse

    class ShiftedNormGelu(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm, self.shift = torch.nn.LayerNorm(16), torch.nn.Parameter(torch.randn(16))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.gelu((self.norm(x) + self.shift).transpose(-2, -1))

    BLOCKS["shifted_norm_gelu"] = lambda: (ShiftedNormGelu().eval(), {"x": torch.randn(2, 8, 16)})
    model = exported("shifted_norm_gelu", "dynamo")
    _, report = fuse(model, "ort-cuda", feeds("shifted_norm_gelu", model), debug=True, families=["gelu", "norm_act"])
    family = report.families[-1]
    assert family.fused == 0
    assert any("stops matching after 2 of" in line for line in family.near_misses.get("layernorm_transpose_gelu", [])), family.near_misses
