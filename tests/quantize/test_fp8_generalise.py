"""The fp8 ort-cuda export on architectures its rules were not developed on (the bench zoo is BERT,
GPT-2 and ViT): each GEMM the config implies becomes a float8 one, in the form its architecture
allows, and the artefact agrees with PyTorch fp32 on fresh inputs within the gate's budget.

- BertForMaskedLM: the tied decoder reads the embedding table through a Transpose (4 GEMMs a
  layer, the head's transform and decoder: 4L + 2), dynamic batch checked at another batch;
- LLaMA: a gated (SwiGLU) MLP is no FC1 -> FC2 chain, so no Fp8Mlp; Q, K, V stay three GEMMs
  (rotary sits between them and the attention): 7 Fp8GemmAct a layer;
- Swin: window attention whose output projection reads a computed Reshape (K unknown to shape
  inference), NHWC-ish 4-D Linear layers, the patch merging's bias-free reduction and the patch
  embedding's Conv as a GEMM;
- T5 encoder: ReLU MLP and projections without biases.

Self-attentions on one packed QKV GEMM end as deployfuse.FusedMHA reading it in place (packed_mha).
Random weights, so the budget is loose (cos=0.99,rel=0.2); the gate keeps none of these in fp16
under it, which makes the counts exact.
"""

from __future__ import annotations

import collections
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
import pytest
import torch
import transformers

import deployfuse
from deployfuse.backends.ort import run, session
from deployfuse.export import flatten_outputs
from deployfuse.inputs import DynamicAxis, InputSpec, make_inputs

_COS, _REL = 0.99, 0.2
BUDGET = f"cos={_COS},rel={_REL}"


@dataclass(frozen=True)
class Case:
    """A model from its config, its example inputs, and the fp8 nodes its config implies."""

    build: Callable[[], tuple[torch.nn.Module, dict[str, torch.Tensor]]]
    expect: Callable[[transformers.PretrainedConfig], dict[str, int]]  # op -> count, and "quantized" GEMMs
    dynamic_batch: bool = False


def _text(cls: type, config: transformers.PretrainedConfig) -> Callable[[], tuple[torch.nn.Module, dict[str, torch.Tensor]]]:
    def build() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
        torch.manual_seed(0)
        ids = torch.randint(0, config.vocab_size, (2, 16))
        return cls(config).eval(), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    return build


class _LastHiddenState(torch.nn.Module):
    """A user's wrapper returning one tensor, not the model's output dataclass."""

    def __init__(self, model: transformers.PreTrainedModel) -> None:
        super().__init__()
        self.model, self.config = model, model.config

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def _t5_encoder() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    model, example = _text(transformers.T5EncoderModel, _T5)()
    return _LastHiddenState(model).eval(), example


def _swin() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    config = transformers.SwinConfig(image_size=32, patch_size=4, embed_dim=32, depths=[1, 1], num_heads=[2, 4], window_size=4)
    return transformers.SwinModel(config).eval(), {"pixel_values": torch.randn(1, 3, 32, 32)}


_BERT = transformers.BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256, max_position_embeddings=64)
_LLAMA = transformers.LlamaConfig(vocab_size=500, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                                  max_position_embeddings=64, use_cache=False)
_T5 = transformers.T5Config(vocab_size=500, d_model=64, d_kv=16, d_ff=256, num_layers=2, num_heads=4, use_cache=False)


def _blocks(config: transformers.PretrainedConfig) -> int:
    """Transformer blocks: Swin's over its stages, the others' layers (T5's num_layers under the common name)."""
    return sum(config.depths) if hasattr(config, "depths") else config.num_hidden_layers


CASES = {
    "bert_mlm_tied_head": Case(_text(transformers.BertForMaskedLM, _BERT),
                               lambda c: {"quantized": 4 * _blocks(c) + 2, "Fp8GemmAct": 2 * _blocks(c) + 2, "Fp8Mlp": _blocks(c), "MultiHeadAttention": 0, "FusedMHA": _blocks(c)},
                               dynamic_batch=True),
    "llama_gated_mlp": Case(_text(transformers.LlamaModel, _LLAMA),
                            lambda c: {"quantized": 7 * _blocks(c), "Fp8GemmAct": 7 * _blocks(c), "Fp8Mlp": 0, "MultiHeadAttention": _blocks(c), "FusedMHA": 0}),
    # + len(depths): the patch merges between stages and the patch embedding's GEMM (patch_embed)
    "swin_window_attention": Case(_swin, lambda c: {"quantized": 4 * _blocks(c) + len(c.depths), "Fp8GemmAct": 2 * _blocks(c) + len(c.depths),
                                                    "Fp8Mlp": _blocks(c), "MultiHeadAttention": 0, "FusedMHA": _blocks(c)}),
    "t5_encoder_relu_unbiased": Case(_t5_encoder,
                                     lambda c: {"quantized": 4 * _blocks(c), "Fp8GemmAct": 2 * _blocks(c), "Fp8Mlp": _blocks(c), "MultiHeadAttention": 0, "FusedMHA": _blocks(c)}),
}


def _agreement(model: torch.nn.Module, example: dict[str, torch.Tensor], artefact: onnx.ModelProto, batch: int, seed: int) -> tuple[float, float]:
    """The worst cosine and max|error| / max|reference| of the artefact (ORT's CPU EP, the fp8
    nodes' function bodies) against PyTorch fp32 over the outputs, on fresh inputs at `batch`."""
    specs = [InputSpec(name, (batch, *t.shape[1:]), t.dtype) for name, t in example.items()]
    inputs = make_inputs(specs, model, seed)
    with torch.inference_mode():
        want = flatten_outputs(model(**inputs))
    got = run(session(artefact), {k: v.numpy().astype(np.float16) if v.is_floating_point() else v.numpy() for k, v in inputs.items()})
    assert list(got) == list(want)
    cos, rel = 1.0, 0.0
    for name, reference in want.items():
        w, g = reference.double().numpy().ravel(), got[name].astype(np.float64).ravel()
        cos = min(cos, float(w @ g / np.linalg.norm(w) / np.linalg.norm(g)))
        rel = max(rel, float(np.abs(g - w).max() / np.abs(w).max()))
    return cos, rel


@pytest.mark.parametrize("name", list(CASES))
def test_every_gemm_the_config_implies_is_fp8_and_agrees_with_pytorch(name, tmp_path):
    case = CASES[name]
    model, example = case.build()
    dynamic = [DynamicAxis(k, 0, "batch") for k in example] if case.dynamic_batch else []
    result = deployfuse.export(model, tmp_path / "model.onnx", example_inputs=example, target="ort-cuda", precision="fp8", accuracy_budget=BUDGET,
                               dynamic=dynamic, seed=0, verify_draws=1)
    assert result.gate is not None and result.gate.passed and result.gate.fp32_layers == []
    artefact = onnx.load(result.onnx_path)
    ops = collections.Counter(n.op_type for n in artefact.graph.node)
    expect = case.expect(model.config)
    assert {"quantized": result.gate.quantized_layers, **{op: ops[op] for op in expect if op != "quantized"}} == expect, ops
    assert not {"QuantizeLinear", "DequantizeLinear", "MatMul", "Gemm"} & set(ops), ops  # no GEMM left in fp16 or in Q/DQ
    seed = zlib.crc32(name.encode())
    for batch in (3, 1) if case.dynamic_batch else (next(iter(example.values())).shape[0],):
        cos, rel = _agreement(model, example, artefact, batch, seed + batch)
        assert cos >= _COS and rel <= _REL, (batch, cos, rel)
