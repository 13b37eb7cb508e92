"""Rotary embeddings whose cos / sin are tables, not computed angles: gathered from precomputed
caches at the position ids, or (static LLaMA exports) constant-folded by the exporter."""

import pytest
from _export import check_case
from _forms import Form, fused_ops


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_tables_gathered_by_position(exporter):
    check_case("cached_rotary", exporter, "ort-cpu", {"rotary_embedding": 1}, {"com.microsoft::RotaryEmbedding": 1})


@pytest.mark.parametrize("target", ["ort-cpu", "ort-cuda"])
def test_static_llama_keeps_rotary_and_attention(target):
    """Static shapes fold the rotary caches to constants and merge the grouped-head repeat into
    K's flattening: both used to stop the fusions (0 rotary, 0 attention)."""
    counts = fused_ops("llama", Form(shapes="static"), target)
    attention = "com.microsoft::GroupQueryAttention" if target == "ort-cpu" else "com.microsoft::MultiHeadAttention"
    assert counts.get("com.microsoft::RotaryEmbedding") == 4 and counts.get(attention) == 2, counts
