"""packed_mha: in an fp8 ort-cuda export every self-attention of a BERT and a GPT-2 (transformers,
tiny configs, random weights) reads Q, K and V straight out of its packed QKV GEMM as one
deployfuse.FusedMHA(P, P, P, mask, packed_qkv=1) on an Fp8GemmAct: no Split or MultiHeadAttention
left, and the artefact agrees with PyTorch fp32 on fresh inputs within the export's budget. An fp16 ort-cuda export (packed_qkv run first) keeps com.microsoft.Attention;
tensorrt gets no rule."""

from __future__ import annotations

import collections

import onnx
import pytest
import torch
import transformers
from _export import op_counts
from _forms import Form, exported
from test_split_qkv import _fused
from zoo import ZOO

import deployfuse
from deployfuse.rewrite.rules import packed_mha
from tests.quantize.test_fp8_generalise import _agreement

_COS, _REL = 0.99, 0.2
BUDGET = f"cos={_COS},rel={_REL}"


def _bert() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    config = transformers.BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256, max_position_embeddings=64)
    ids = torch.randint(0, config.vocab_size, (2, 16))
    mask = torch.ones_like(ids)
    mask[1, 11:] = 0  # padding: the attention bias is a real [B, 1, 1, S] mask
    return transformers.BertModel(config).eval(), {"input_ids": ids, "attention_mask": mask}


def _gpt2() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    config = transformers.GPT2Config(vocab_size=500, n_embd=64, n_layer=2, n_head=4, n_positions=64, use_cache=False)
    return transformers.GPT2Model(config).eval(), {"input_ids": torch.randint(0, config.vocab_size, (2, 16))}


@pytest.mark.parametrize("build", [_bert, _gpt2], ids=["bert", "gpt2"])
def test_fp8_export_reads_the_packed_qkv_in_place(build, tmp_path) -> None:
    torch.manual_seed(0)
    model, example = build()
    result = deployfuse.export(model, tmp_path / "model.onnx", example_inputs=example, target="ort-cuda", precision="fp8", accuracy_budget=BUDGET, seed=0, verify_draws=1)
    assert result.gate is not None and result.gate.passed
    (family,) = [f for f in result.fusion.families if f.family == packed_mha.FAMILY]
    layers = model.config.num_hidden_layers
    assert family.matches == {packed_mha.FAMILY: layers} and not family.rolled_back and not family.reverted, family
    artefact = onnx.load(result.onnx_path)
    ops = collections.Counter(n.op_type for n in artefact.graph.node)
    assert not {"Split", "MultiHeadAttention", "Attention"} & set(ops), ops
    fused = [n for n in artefact.graph.node if n.op_type == "FusedMHA"]
    assert len(fused) == layers, ops
    producers = {o: n for n in artefact.graph.node for o in n.output}

    def gemm_behind(name: str) -> str:  # GPT-2's Conv1D GEMM runs on the flattened tokens: a Reshape back in between
        node = producers[name]
        return gemm_behind(node.input[0]) if node.op_type == "Reshape" else node.op_type

    for node in fused:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["packed_qkv"] == 1 and attrs["num_heads"] == model.config.num_attention_heads, attrs
        assert node.input[0] == node.input[1] == node.input[2] and gemm_behind(node.input[0]) == "Fp8GemmAct", list(node.input)
    cos, rel = _agreement(model, example, artefact, batch=2, seed=123)  # fresh inputs
    assert cos >= _COS and rel <= _REL, (cos, rel)


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_fp16_export_keeps_attention(name: str) -> None:
    """packed_qkv (com.microsoft.Attention, a packed weight) takes every self-attention first: no Split
    is left for packed_mha, so the non-quantized ort-cuda export does not change."""
    layers = ZOO[name].layers
    model, report = _fused(name, exported(name, Form(precision="fp16")).model, ())
    assert report.counts()[packed_mha.FAMILY] == 0 and report.counts()["packed_qkv"] == layers, report.counts()
    have = op_counts(model)
    assert have["com.microsoft::Attention"] == layers and "deployfuse::FusedMHA" not in have, have


def test_only_ort_cuda_lowers_it() -> None:
    assert packed_mha.rules("ort-cuda") and packed_mha.rules("tensorrt") == [] and packed_mha.rules("ort-cpu") == []
