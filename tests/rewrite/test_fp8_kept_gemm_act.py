"""fp8_gemm.float_gemms: in an fp8 ort-cuda export, the GEMMs left in fp16 become deployfuse.GemmAct (bias in the epilogue).

Tiny GPT2Model / BertModel (random, trained-like biases). Exported in fp8 with a budget tight enough that the accuracy gate keeps
layers in fp16, and lowered with every GEMM kept (the fused fp16 graph an fp8 export quantizes, no Q/DQ): no float GEMM with a
constant weight is left that GemmAct takes (a bare MatMul, whose bias SkipLayerNormalization took, and a bias add feeding an
exact-erf GELU stay, as `rules.gemm_act` leaves them), and the outputs are those of the same lowering without the pass, on fresh
random inputs (ONNX Runtime CPU, optimisations off, function bodies), up to fp16 roundings.
"""

from __future__ import annotations

import collections
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import transformers
from _export import _trained_like
from onnx import helper

import deployfuse
from deployfuse.backends.ort import run, session
from deployfuse.ops import attach_functions
from deployfuse.quantize.lowering import FP8_SKIPPED_FAMILIES
from deployfuse.rewrite.rules import fp8_gemm

_ROOT = tempfile.TemporaryDirectory(prefix="deployfuse-fp8-kept-gemm-act.")
BUDGETS = {"gpt2": "cos=0.999985,rel=0.05"}
"""About halfway (in 1 - cosine) between the all-fp8 artefact (0.999978) and the gate's bound of 4 of its 8 layers in fp16
(0.9999916): the gate must keep some, and can."""
LAYERS = 2
_MODELS = {
    "bert": lambda: transformers.BertModel(transformers.BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=LAYERS, num_attention_heads=4,
                                                                     intermediate_size=128, max_position_embeddings=64), add_pooling_layer=False),
    "gpt2": lambda: transformers.GPT2Model(transformers.GPT2Config(vocab_size=500, n_embd=64, n_layer=LAYERS, n_head=4, n_positions=64, use_cache=False)),
}


def _module(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    module = _MODELS[name]()
    _trained_like(module)  # a zero bias is dropped by the exporter: no bias form left to fuse
    return module.eval()


def _example() -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 500, (2, 16), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _users(model: onnx.ModelProto, value: str) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if value in n.input]


def _left_float_gemms(model: onnx.ModelProto) -> dict[str, str]:
    """Each float Gemm / MatMul with a constant 2-D weight left in `model`, by name, with why GemmAct does not take it; raises
    AssertionError for one it takes (a bias it could hold in its epilogue, no exact GELU after it)."""
    weights = {t.name for t in model.graph.initializer if len(t.dims) == 2 and t.data_type == onnx.TensorProto.FLOAT16}
    constants = {t.name for t in model.graph.initializer}
    left = {}
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type not in ("Gemm", "MatMul") or node.input[1] not in weights:
            continue
        if node.op_type == "Gemm":
            trans_b = any(a.name == "transB" and a.i for a in node.attribute)
            assert trans_b or len(node.input) < 3 or not node.input[2], f"{node.name}: a Gemm with a bias left"
            left[node.name] = "Gemm without a bias or with transB"
            continue
        adds = [u for u in _users(model, node.output[0]) if u.op_type == "Add" and set(u.input) & constants]
        if not adds:
            left[node.name] = "bare MatMul"
            continue
        readers = [u for a in adds for u in _users(model, a.output[0])]
        exact = [u for u in readers if u.op_type == "Gelu" and next((a.s for a in u.attribute if a.name == "approximate"), b"none") == b"none"]
        assert exact and len(exact) == len(readers), f"{node.name}: MatMul + bias left without an exact GELU after it: {[u.op_type for u in readers]}"
        left[node.name] = "bias add into exact-erf GELU"
    return left


def _gemm_acts(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.domain == "deployfuse" and n.op_type == "GemmAct"]


def _assert_same_outputs(with_pass: onnx.ModelProto, without: onnx.ModelProto, inputs: dict[str, torch.Tensor]) -> None:
    """Equal outputs on fresh random ids (ORT CPU, optimisations off, function bodies) up to fp16 roundings: GemmAct's body is
    MatMul + Add [+ tanh GELU] in fp16, the bias bit for bit as ORT's Gemm or MatMul + Add adds it, the GELU by the body's fp16 ops
    instead of com.microsoft FastGelu's CPU kernel (GPT-2 with its FC1s GemmAct: at most two fp16 steps of the output's scale, 0.04 of
    one on average)."""
    rng = np.random.default_rng()
    ids = rng.integers(0, 500, tuple(inputs["input_ids"].shape))
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    feed = {v.name: feed[v.name] for v in with_pass.graph.input}
    want, got = run(session(without, optimize=False), feed), run(session(with_pass, optimize=False), feed)
    assert set(got) == set(want)
    for output, value in want.items():
        diff = np.abs(got[output].astype(np.float64) - value)
        step = float(np.spacing(np.abs(value).max()))  # one fp16 step at the output's scale
        assert diff.max() <= 4 * step and diff.mean() <= 0.2 * step, (output, diff.max(), diff.mean(), step)


@pytest.mark.parametrize("name", list(_MODELS))
def test_every_gemm_kept_becomes_gemm_act_where_it_takes_one(name):
    """The fused fp16 graph an fp8 export quantizes, lowered with no layer quantized (the gate keeping all): GPT-2's Conv1D Gemms
    (+ Reshape, FC1's FastGelu in the epilogue) all become GemmAct; BERT's packed QKV MatMul + Add does, its FC1's bias add into the
    exact GELU stays, and its output projection and FC2 stay bare MatMuls (SkipLayerNormalization holds their bias)."""
    module, example = _module(name), _example()
    path = Path(_ROOT.name) / f"{name}_fp16.onnx"
    deployfuse.export(module, path, example_inputs=example, target="ort-cuda", precision="fp16", skip_fusions=FP8_SKIPPED_FAMILIES, verify=False)
    fused = onnx.load(path)
    lowered, count = fp8_gemm.lower(fused, "ort-cuda")
    assert count == 0, "no Q/DQ: nothing in float8"
    acts = collections.Counter(helper.get_attribute_value(next(a for a in n.attribute if a.name == "activation")).decode() for n in _gemm_acts(lowered))
    left = collections.Counter(_left_float_gemms(lowered).values())
    if name == "gpt2":
        assert acts == {"none": 3 * LAYERS, "gelu_tanh": LAYERS} and not left
    else:
        assert acts == {"none": LAYERS}, "each packed QKV"
        assert left == {"bare MatMul": 2 * LAYERS, "bias add into exact-erf GELU": LAYERS}
    _assert_same_outputs(lowered, fused, example)


@pytest.mark.parametrize("name", ["gpt2"])
def test_fp8_export_layers_kept_in_fp16_become_gemm_act(name, monkeypatch):
    """An fp8 export gated at `BUDGETS`: the gate keeps layers in fp16; each that has a bias outside a SkipLayerNormalization is a
    GemmAct in the artefact, no float GEMM GemmAct takes is left, and the artefact computes what the same lowering without
    `float_gemms` computes (the gate's own attempt, recorded before the pass). GPT-2 only: at its budget BERT's gate keeps its
    two bare MatMuls (their bias in SkipLayerNormalization), so there the test passed with the pass off too; BERT's GemmAct
    is checked with every layer kept, above."""
    before: list[tuple[onnx.ModelProto, onnx.ModelProto]] = []
    original = fp8_gemm.float_gemms

    def recorded(model: onnx.ModelProto, target: str) -> tuple[onnx.ModelProto, int]:
        copy = onnx.ModelProto.FromString(model.SerializeToString())
        out = original(model, target)
        before.append((copy, out[0]))
        return out

    monkeypatch.setattr(fp8_gemm, "float_gemms", recorded)
    module, example = _module(name), _example()
    result = deployfuse.export(module, Path(_ROOT.name) / f"{name}_fp8.onnx", example_inputs=example, target="ort-cuda", precision="fp8",
                               accuracy_budget=BUDGETS[name], seed=0, verify_draws=1)
    assert result.gate is not None and result.gate.passed
    kept = {layer.node for layer in result.gate.fp32_layers}
    assert kept, "the budget keeps some layer in fp16"
    artefact = onnx.load(result.onnx_path)
    left = _left_float_gemms(artefact)
    assert set(left) <= kept, "only the kept layers are float"
    assert len(_gemm_acts(artefact)) == len(kept - set(left)), "every other kept layer is a GemmAct"
    if name == "gpt2":
        assert not left and _gemm_acts(artefact), "every GPT-2 GEMM (Gemm with its bias) becomes one"
    signature = [(n.op_type, list(n.output)) for n in artefact.graph.node]
    without = next(m for m, lowered in reversed(before) if [(n.op_type, list(n.output)) for n in lowered.graph.node] == signature)
    attach_functions(without)
    assert not _gemm_acts(without)
    _assert_same_outputs(artefact, without, example)
