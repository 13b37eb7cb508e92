"""The fusion report: counts, JSON form, table, near misses, and rule tags on fused nodes."""

import json

import pytest
from _export import exported, feeds

from deployfuse.errors import UsageError
from deployfuse.rewrite import RULE_TAG, family_names, fuse


def test_report_and_tags():
    model = exported("bert", "dynamo")
    fused, report = fuse(model, "ort-cpu", feeds("bert", model), debug=True)
    data = json.loads(json.dumps(report.to_dict()))
    assert data["target"] == "ort-cpu"
    by_family = {f["family"]: f for f in data["families"]}
    assert by_family["skip_layernorm"]["fused"] == 4 and not by_family["skip_layernorm"]["rolled_back"]
    table = report.table()
    assert "skip_layernorm" in table and "bias_gelu" in table
    tags = {p.value for n in fused.graph.node for p in n.metadata_props if p.key == RULE_TAG}
    assert {"skip_layernorm", "bias_gelu"} <= tags
    skip_nodes = [n for n in fused.graph.node if n.op_type == "SkipLayerNormalization"]
    assert all({p.key: p.value for p in n.metadata_props}.get(RULE_TAG) == "skip_layernorm" for n in skip_nodes)


def test_near_misses_say_why():
    """The embedding LayerNorm's input is a 3-way sum with a broadcast position term: the
    skip rule's check explains why it refused, in debug mode only."""
    model = exported("bert", "dynamo")
    _, report = fuse(model, "ort-cpu", feeds("bert", model), debug=True)
    misses = [why for f in report.families for whys in f.near_misses.values() for why in whys]
    assert misses and all(isinstance(m, str) and m for m in misses)
    _, quiet = fuse(model, "ort-cpu", feeds("bert", model))
    assert not any(f.near_misses for f in quiet.families)


def test_family_selection():
    model = exported("resnet18", "dynamo")
    _, report = fuse(model, "ort-cpu", feeds("resnet18", model), families=["fused_conv"])
    assert [f.family for f in report.families] == ["fused_conv"]
    assert "fused_conv" in family_names() and family_names().index("layernorm") < family_names().index("skip_layernorm")
    with pytest.raises(UsageError, match="unknown fusion families"):
        fuse(model, "ort-cpu", feeds("resnet18", model), families=["nope"])
