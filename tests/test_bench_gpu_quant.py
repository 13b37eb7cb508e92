"""bench/gpu_quant.py: its fairness to torchao (GPT-2's Conv1D projections become the `nn.Linear`
layers torchao's `quantize_` swaps, with the model's math unchanged), its ablations (the fp8
artefact with one fusion undone computes what the artefact computes), and the fp16 forms (the fp16
artefact with a family skipped runs the attention it names and computes the model)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
import transformers
from onnx import numpy_helper
from transformers.pytorch_utils import Conv1D

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from gpu_quant import ABLATIONS, FP16_FORMS, _fp16_forms, conv1d_as_linear  # noqa: E402

import deployfuse  # noqa: E402


def test_gpt2_conv1d_as_linear_keeps_the_outputs():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=32, vocab_size=97)
    model = transformers.GPT2Model(config).eval()
    with torch.no_grad():  # non-zero biases, so a dropped or misplaced bias shows
        for module in model.modules():
            if isinstance(module, Conv1D):
                module.bias.normal_()
    ids = torch.randint(0, config.vocab_size, (3, 11))
    with torch.no_grad():
        before = model(input_ids=ids).last_hidden_state
        swapped = conv1d_as_linear(model)
        after = swapped(input_ids=ids).last_hidden_state
    assert swapped is model
    assert not any(isinstance(m, Conv1D) for m in model.modules())
    assert sum(isinstance(m, torch.nn.Linear) for m in model.modules()) == 4 * config.n_layer  # c_attn, c_proj, c_fc, mlp.c_proj
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)


def test_each_ablation_undoes_its_fusion_and_keeps_the_outputs(tmp_path):
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256, max_position_embeddings=64)
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, config.vocab_size, (2, 16))
    result = deployfuse.export(model, tmp_path / "bert.onnx", example_inputs={"input_ids": ids, "attention_mask": torch.ones_like(ids)}, target="ort-cuda",
                               precision="fp8", accuracy_budget="cos=0.99,rel=0.2", seed=0, verify_draws=1)
    artefact = onnx.load(result.onnx_path)
    ops = [n.op_type for n in artefact.graph.node]
    assert ops.count("FusedMHA") == config.num_hidden_layers and "Split" not in ops, ops  # what split-mha undoes
    assert any(n.op_type == "SkipLayerNormFp8" and n.output[1] for n in artefact.graph.node), "what norm-unfused undoes"
    assert any(n.op_type == "FusedMHA" and len(n.output) > 1 and n.output[1] for n in artefact.graph.node), "what attn-out-unfused undoes"
    dims = {t.name: list(t.dims) for t in artefact.graph.initializer}
    empty = [i for n in artefact.graph.node if n.op_type in ("Fp8GemmAct", "Fp8Mlp") for i in n.input if dims.get(i) == [0]]
    assert len(empty) >= 2 * config.num_hidden_layers, "what zero-bias undoes: at least each layer's output projection and FC2 without a bias"
    ids = torch.randint(0, config.vocab_size, (2, 16))
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0  # a padded row: the attention bias reaches both forms
    feed = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL

    def run(m: onnx.ModelProto) -> np.ndarray:
        return ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feed)[0].astype(np.float32)

    expected = run(artefact)
    for name, (undo, _) in ABLATIONS.items():
        copy = onnx.ModelProto()
        copy.CopyFrom(artefact)
        ablated = undo(copy)
        ops = [n.op_type for n in ablated.graph.node]
        if name == "split-mha":
            assert ops.count("MultiHeadAttention") == ops.count("Split") == config.num_hidden_layers and "FusedMHA" not in ops, ops
        elif name == "attn-out-unfused":
            assert all(len(n.output) == 1 for n in ablated.graph.node if n.op_type == "FusedMHA"), "no FusedMHA writes YQ any more"
        elif name == "scales-not-pow2":
            before = {t.name: numpy_helper.to_array(t) for t in artefact.graph.initializer}
            after = {t.name: numpy_helper.to_array(t) for t in ablated.graph.initializer}
            scales = [n.input[4] for n in ablated.graph.node if n.op_type in ("SkipLayerNormFp8", "FusedMHA") and len(n.input) > 4]
            assert scales and all(math.frexp(float(before[s]))[0] == 0.5 for s in scales), "the artefact's activation scales are powers of two"
            assert all(math.frexp(float(after[s]))[0] != 0.5 for s in scales), "no activation scale is a power of two any more"
        elif name == "zero-bias":
            sizes = {t.name: list(t.dims) for t in ablated.graph.initializer}
            gemms = [n for n in ablated.graph.node if n.op_type in ("Fp8GemmAct", "Fp8Mlp")]
            assert not [i for n in gemms for i in n.input if sizes.get(i) == [0]], "no empty bias left"
        else:
            assert all(n.output[1] == "" for n in ablated.graph.node if n.op_type == "SkipLayerNormFp8"), "no norm writes YQ any more"
        np.testing.assert_allclose(run(ablated), expected, atol=2e-2 * float(np.abs(expected).max()), err_msg=name)


def test_fp16_fusedmha_form_runs_fusedmha_and_computes_the_model(tmp_path):
    torch.manual_seed(1)
    config = transformers.BertConfig(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256, max_position_embeddings=64)
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, config.vocab_size, (2, 16))
    mask = torch.ones_like(ids)
    mask[0, 11:] = 0
    made = _fp16_forms("bert", model, {"input_ids": ids, "attention_mask": mask}, tmp_path, "fp32")
    assert set(made) == set(FP16_FORMS)
    path = made["deployfuse-fusedmha"]
    assert isinstance(path, Path), path
    ops = [n.op_type for n in onnx.load(path).graph.node]
    assert ops.count("FusedMHA") == config.num_hidden_layers and "Attention" not in ops and "Split" not in ops, ops
    ids = torch.randint(0, config.vocab_size, (2, 16))  # fresh inputs, another padded row
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    got = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0]
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).last_hidden_state.numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
