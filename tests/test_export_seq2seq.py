"""Encoder-decoder transformers export as users build them (`use_cache` on, the default):

- BART in fp16 for ort-cuda: its layers end with an fp16-only branch on tensor values (the
  overflow clamp) that torch.export refused; the artefact now agrees with PyTorch fp32 on fresh
  inputs, through ORT's CPU EP, within the fp16 tolerance;
- the same model through the TorchScript exporter is refused at the export step with the reason
  (its fp16 attention writes fp32 constants), not by ONNX Runtime in a later step;
- T5ForConditionalGeneration, which only the TorchScript exporter exports: the cleaned graph loads
  (onnxscript's optimizer used to leave a Reshape reading an undefined shape) and agrees with PyTorch.
"""

from __future__ import annotations

import zlib

import numpy as np
import onnx
import pytest
import torch
import transformers

import deployfuse
from deployfuse.backends.ort import run, session
from deployfuse.errors import DeployfuseError
from deployfuse.export import clean, flatten_outputs, to_onnx
from deployfuse.inputs import make_inputs, specs_of
from deployfuse.loading import load_model
from deployfuse.verify import DEFAULT_RTOL, compare_outputs

_BART = dict(d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
             encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=1000, max_position_embeddings=64)


def _seq2seq(cls: type, config: transformers.PretrainedConfig) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    ids = torch.randint(3, config.vocab_size, (2, 16))
    return cls(config).eval(), {"input_ids": ids, "attention_mask": torch.ones_like(ids), "decoder_input_ids": torch.randint(3, config.vocab_size, (2, 8))}


def _fresh(model: torch.nn.Module, example: dict[str, torch.Tensor], seed: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """New inputs of the example's shapes (the pipeline's own draws use other seeds) and PyTorch fp32's outputs."""
    inputs = make_inputs(specs_of(example), model, seed)
    with torch.inference_mode():
        return inputs, flatten_outputs(model(**inputs))


def test_bart_fp16_for_ort_cuda_agrees_with_pytorch_fp32(tmp_path):
    model, example = _seq2seq(transformers.BartForConditionalGeneration, transformers.BartConfig(**_BART))
    assert model.config.use_cache  # the cache object it returns is no output of the export
    result = deployfuse.export(model, tmp_path / "bart.onnx", example_inputs=example, target="ort-cuda", precision="fp16", verify_draws=1, seed=1)
    assert result.report.exporter == "dynamo"
    artefact = onnx.load(result.onnx_path)
    assert [i.type.tensor_type.elem_type for i in artefact.graph.output] == [onnx.TensorProto.FLOAT16] * 2
    assert {"Clip", "Where"} <= {n.op_type for n in artefact.graph.node}  # the overflow clamp, computed for every input
    inputs, want = _fresh(model, example, zlib.crc32(b"bart-fp16"))
    got = run(session(artefact), {k: v.numpy() for k, v in inputs.items()})
    assert list(got) == ["logits", "encoder_last_hidden_state"]
    checks = compare_outputs(want, got, DEFAULT_RTOL["fp16"])
    assert all(c.passed for c in checks), [c.to_dict() for c in checks]


def test_bart_fp16_through_torchscript_is_refused_with_the_reason():
    model, example = _seq2seq(transformers.BartModel, transformers.BartConfig(**_BART))
    loaded = load_model(model.half())
    with pytest.raises(DeployfuseError, match=r"torchscript: DeployfuseError: it wrote a graph that mixes element types \(LayerNormalization .*float and float16\)"):
        to_onnx(loaded, example, (), ["last_hidden_state", "encoder_last_hidden_state"], 18, ("torchscript",))


def test_t5_for_conditional_generation_cleans_into_a_graph_that_runs():
    config = transformers.T5Config(vocab_size=500, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4)
    model, example = _seq2seq(transformers.T5ForConditionalGeneration, config)
    # TorchScript: torch.export fails to decompose T5's attention reshape (a view of a transposed tensor)
    model_proto, attempts = to_onnx(load_model(model), example, (), ["logits", "encoder_last_hidden_state"], 18, ("torchscript",))
    assert attempts[-1].error is None
    cleaned = clean(model_proto)
    inputs, want = _fresh(model, example, zlib.crc32(b"t5"))
    got = run(session(cleaned), {k: v.numpy() for k, v in inputs.items()})
    for name, reference in want.items():
        np.testing.assert_allclose(got[name], reference.numpy(), rtol=1e-4, atol=1e-4 * float(reference.abs().max()))
