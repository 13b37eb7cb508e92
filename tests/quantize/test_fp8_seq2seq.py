"""The fp8 ort-cuda export of an encoder-decoder (BartForConditionalGeneration, `use_cache` on):
it is exported in fp16 around the fp8 GEMMs, where BART's fp16-only overflow branch used to stop
torch.export. Every weight GEMM becomes float8 (encoder, decoder self- and cross-attention, tied
LM head) and the artefact agrees with PyTorch fp32 on fresh inputs within the gate's budget
(ORT's CPU EP running the fp8 nodes' function bodies)."""

from __future__ import annotations

import zlib

import numpy as np
import onnx
import torch
import transformers

import deployfuse
from deployfuse.backends.ort import run, session
from deployfuse.export import flatten_outputs
from deployfuse.inputs import make_inputs, specs_of

_COS, _REL = 0.99, 0.2  # random weights: a loose budget, as in test_fp8_generalise


def test_bart_fp8_quantizes_every_weight_gemm_and_agrees_with_pytorch_fp32(tmp_path):
    config = transformers.BartConfig(d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
                                     encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=1000, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.BartForConditionalGeneration(config).eval()
    ids = torch.randint(3, config.vocab_size, (2, 16))
    example = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "decoder_input_ids": torch.randint(3, config.vocab_size, (2, 8))}
    result = deployfuse.export(model, tmp_path / "bart.onnx", example_inputs=example, target="ort-cuda", precision="fp8",
                               accuracy_budget=f"cos={_COS},rel={_REL}", seed=0, verify_draws=1)
    assert result.gate is not None and result.gate.passed and result.gate.fp32_layers == []
    artefact = onnx.load(result.onnx_path)
    weights = {t.name for t in artefact.graph.initializer}
    float_gemms = [n.name for n in artefact.graph.node if n.op_type in ("MatMul", "Gemm") and set(n.input[1:2]) & weights]
    assert float_gemms == [] and not {"QuantizeLinear", "DequantizeLinear"} & {n.op_type for n in artefact.graph.node}

    inputs = make_inputs(specs_of(example), model, zlib.crc32(b"bart-fp8"))
    with torch.inference_mode():
        want = flatten_outputs(model(**inputs))
    got = run(session(artefact), {k: v.numpy() for k, v in inputs.items()})
    for name, reference in want.items():
        w, g = reference.double().numpy().ravel(), got[name].astype(np.float64).ravel()
        cos, rel = float(w @ g / np.linalg.norm(w) / np.linalg.norm(g)), float(np.abs(g - w).max() / np.abs(w).max())
        assert cos >= _COS and rel <= _REL, (name, cos, rel)
