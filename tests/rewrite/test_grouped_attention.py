"""GroupQueryAttention from K/V heads the model repeats: exact counts, outputs equal to the
unfused graph, and the model's own masking kept (causal = 0 plus its bias), so a bidirectional
encoder stays bidirectional and LLaMA's causal mask still applies."""

from __future__ import annotations

import pytest
from _export import check_case, fused

from deployfuse.rewrite.rules.grouped_attention import ort_runs_bidirectional_gqa

GQA, MHA = "com.microsoft::GroupQueryAttention", "com.microsoft::MultiHeadAttention"


def test_this_onnxruntime_runs_bidirectional_gqa():
    """The rule needs onnxruntime >= 1.32's causal attribute and attention_bias input."""
    assert ort_runs_bidirectional_gqa()


def test_llama_gets_one_grouped_attention_per_layer():
    model = check_case("llama", "dynamo", "ort-cpu", {"grouped_attention": 2}, {GQA: 2, MHA: 0})
    for node in model.graph.node:
        if node.op_type == "GroupQueryAttention":
            attrs = {a.name: a.i for a in node.attribute if a.name in ("num_heads", "kv_num_heads", "causal")}
            assert attrs == {"num_heads": 4, "kv_num_heads": 2, "causal": 0}
            assert node.input[10], "the model's mask is passed on as attention_bias"


def test_a_bidirectional_grouped_encoder_stays_bidirectional():
    """No mask: GQA's default causal masking would change every output row but the last."""
    check_case("grouped_encoder", "dynamo", "ort-cpu", {"attention": 1, "grouped_attention": 1}, {GQA: 1, MHA: 0})


@pytest.mark.parametrize("target", ["ort-cuda", "tensorrt"])
def test_other_targets_keep_the_repeated_heads(target):
    model, counts, rolled = fused("llama", "dynamo", target)
    assert counts.get("grouped_attention", 0) == 0 and not rolled
    assert not [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
