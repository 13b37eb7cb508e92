"""compare blames no fusion when the ONNX file is not an export of MODEL (issue 18, section 5):
the weights hash the export records, then the unfused graph against PyTorch and the graphs
outside the fused nodes, are checked before a rule is named."""

from __future__ import annotations

import json

import onnx
import pytest
import torch
import transformers

import deployfuse
from deployfuse import metadata
from deployfuse.compare import compare
from deployfuse.compare.localize import fused_nodes

from .conftest import perturb


def _without_hash(model: onnx.ModelProto) -> onnx.ModelProto:
    """The file as an older deployfuse or another tool would have written it."""
    stripped = onnx.ModelProto()
    stripped.CopyFrom(model)
    for prop in list(stripped.metadata_props):
        if prop.key == metadata.WEIGHTS_SHA256:
            stripped.metadata_props.remove(prop)
    return stripped


@pytest.fixture(scope="module")
def other_bert(bert_files, tmp_path_factory):
    """A BERT like bert_files' one with other weights (MODEL), and bert_files' fused export
    without its weights hash: compared with it, every ONNX file of bert_files comes from other weights."""
    import zoo

    root = tmp_path_factory.mktemp("other")
    torch.manual_seed(1234)
    module, _ = zoo.ZOO["bert"].build()
    torch.save(module, root / "other.pt")
    onnx.save(_without_hash(onnx.load(str(bert_files["fused"]))), str(root / "nohash.onnx"))
    return {"model": root / "other.pt", "nohash": root / "nohash.onnx"}


def test_export_records_a_deterministic_weights_hash(bert_files):
    recorded = metadata.read(onnx.load(str(bert_files["fused"])), metadata.WEIGHTS_SHA256)
    module = torch.load(bert_files["model"], weights_only=False)
    assert recorded == metadata.weights_digest(module) == metadata.weights_digest(torch.load(bert_files["model"], weights_only=False))
    with torch.no_grad():
        module.pooler.dense.bias[0] += 1e-6
    assert metadata.weights_digest(module) != recorded


def test_onnx_from_other_weights_is_named_by_the_hash(cli, bert_files, other_bert, tmp_path):
    out = tmp_path / "cmp.json"
    code, stdout, _ = cli("compare", other_bert["model"], bert_files["fused"], "--trust-pickle", "--example-inputs", bert_files["inputs"],
                          "--iterations", "0", "--json", out)
    assert code == 1
    report = json.loads(out.read_text())
    assert report["first_divergence"] is None and report["localization"]["not_this_model"]
    assert "exported from other weights than MODEL" in report["localization"]["note"]
    assert "exported from other weights than MODEL" in stdout and "rule" not in stdout.split("localisation:")[1]


def test_without_a_hash_the_weights_of_unfused_nodes_tell(bert_files, other_bert):
    result = compare(other_bert["model"], other_bert["nohash"], example_inputs=bert_files["inputs"], trust_pickle=True, iterations=0)
    assert not result.passed and result.first_divergence is None
    assert result.localization.not_this_model and "weights of unfused nodes differ" in result.localization.note
    assert "not exported from this model / these weights" in result.localization.note


def test_an_unfused_reference_that_differs_from_the_model_blames_no_rule(bert_files, other_bert):
    """The fused file and its unfused reference agree with each other, not with MODEL."""
    result = compare(other_bert["model"], other_bert["nohash"], example_inputs=bert_files["inputs"], trust_pickle=True, iterations=0,
                     reference_onnx=bert_files["unfused"])
    assert not result.passed and result.first_divergence is None
    assert result.localization.note.startswith("the unfused export already differs from MODEL")


def test_a_change_before_the_first_fused_node_blames_no_rule(bert_files, tmp_path):
    """An unfused node early in the graph reads changed weights (under a new name, so no weight
    comparison sees it): the first fused node downstream differs, but so do its inputs."""
    fused = onnx.load(str(bert_files["fused"]))
    rules = {n.name for n, _ in fused_nodes(fused)}
    first_norm = next(n.name for n in fused.graph.node if n.op_type == "LayerNormalization" and n.name not in rules)
    broken = tmp_path / "broken.onnx"
    onnx.save(perturb(fused, first_norm, 1, delta=0.5, scale=1.5), str(broken))
    result = compare(bert_files["model"], broken, example_inputs=bert_files["inputs"], trust_pickle=True, iterations=0,
                     reference_onnx=bert_files["unfused"])
    assert not result.passed and result.first_divergence is None
    assert "already differ" in result.localization.note and "first fused node that differs" in result.localization.note


def test_an_unrelated_onnx_blames_no_rule(tmp_path):
    """The README's tiny BERT against a GPT-2 export (no hash): before, a Reshape of rule
    'attention' was named as the first divergence."""
    config = transformers.GPT2Config(vocab_size=1000, n_embd=128, n_layer=1, n_head=4, n_positions=64, use_cache=False, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    gpt2 = transformers.GPT2Model(config).eval()
    ids = torch.randint(0, 1000, (2, 32))
    path = tmp_path / "gpt2.onnx"
    deployfuse.export(gpt2, path, example_inputs={"input_ids": ids, "attention_mask": torch.ones_like(ids)}, verify=False)
    assert fused_nodes(onnx.load(str(path))), "the GPT-2 export has fused nodes a rule could be blamed for"
    onnx.save(_without_hash(onnx.load(str(path))), str(path))
    result = compare("examples.tiny_bert:build", path, iterations=0)
    assert not result.passed and result.first_divergence is None
    assert result.localization.not_this_model and "not exported from this model" in result.localization.note
