"""Residual add + LayerNorm -> SkipLayerNormalization: exactly two per transformer layer."""

import pytest
from _export import check_case

CASES = [("bert", "dynamo"), ("bert", "torchscript"), ("gpt2", "dynamo"), ("vit", "dynamo"), ("vit", "torchscript"), ("whisper_encoder", "torchscript")]
PRE_NORM = {"gpt2", "vit", "whisper_encoder"}


@pytest.mark.parametrize(("name", "exporter"), CASES)
def test_two_skip_layernorms_per_layer(name, exporter):
    # 2 layers: 4 residual norms; the one norm without a residual stays LayerNormalization, except BERT's
    # embedding norm, which embed_layer_norm makes one EmbedLayerNormalization with its lookups
    embedding = int(name == "bert")
    check_case(name, exporter, "ort-cuda", {"skip_layernorm": 4}, {"com.microsoft::SkipLayerNormalization": 4, "LayerNormalization": 1 - embedding,
                                                                   "com.microsoft::EmbedLayerNormalization": embedding})


@pytest.mark.parametrize(("name", "exporter"), CASES)
def test_cpu_fuses_post_norm_only(name, exporter):
    """Pre-norm residual streams (sum used after the norm) measured slower fused on CPU; only
    their final norm, after the last residual add, has a sum nothing else reads."""
    n = 1 if name in PRE_NORM else 4
    check_case(name, exporter, "ort-cpu", {"skip_layernorm": n}, {"com.microsoft::SkipLayerNormalization": n, "LayerNormalization": 5 - n})


def test_tensorrt_keeps_layernormalization():
    check_case("bert", "dynamo", "tensorrt", {"skip_layernorm": 0}, {"LayerNormalization": 5})
