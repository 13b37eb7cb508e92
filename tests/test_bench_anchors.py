"""bench/anchors.py's onnxscript file: where onnxscript's MHA fusion leaves GPT-2's attention output
projection (a Gemm) reading the rank-3 attention, the file is repaired, keeps the fusion, loads in ORT
and computes the plain export; where nothing needs repair (BERT) it is `optimize_for_ort`'s own file."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from anchors import onnxscript_file, trained_like  # noqa: E402


def _plain_export(module: torch.nn.Module, inputs: dict[str, torch.Tensor], path: Path) -> Path:
    """The export `variants` makes its files from."""
    with torch.no_grad():
        torch.onnx.export(module, (), str(path), kwargs=inputs, dynamo=True, opset_version=20, optimize=True)
    return path


def _unoptimized_session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # ORT's fusions cannot hide a broken graph
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def test_gpt2_onnxscript_file_loads_keeps_attention_fusion_and_computes_the_export(tmp_path):
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=512, n_embd=64, n_layer=2, n_head=4, n_positions=64, use_cache=False)
    module = trained_like(transformers.GPT2Model(config).eval())  # non-zero biases: the projections export as Gemm
    plain = _plain_export(module, {"input_ids": torch.randint(0, config.vocab_size, (2, 16))}, tmp_path / "gpt2_plain.onnx")

    path = onnxscript_file(plain, tmp_path / "gpt2_onnxscript")

    # as the benchmark loads it (ORT's optimizations on): "Gemm ... Input 0 expected to have rank 2 but has rank 3" before the repair
    ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert path.name == "gpt2_onnxscript_flattened.onnx", f"{path.name}: no attention output projection was repaired"
    ops = [n.op_type for n in onnx.load(str(path)).graph.node]
    assert ops.count("MultiHeadAttention") == config.n_layer, f"the attention fusion was lost: {ops}"
    assert ops.count("SkipLayerNormalization") == 2 * config.n_layer, f"the skip-norm fusion was lost: {ops}"
    ids = np.random.default_rng(1).integers(0, config.vocab_size, (2, 16), dtype=np.int64)
    expected = _unoptimized_session(plain).run(None, {"input_ids": ids})[0]
    np.testing.assert_allclose(_unoptimized_session(path).run(None, {"input_ids": ids})[0], expected, rtol=1e-4, atol=1e-4)


def test_bert_onnxscript_file_is_optimize_for_orts_own(tmp_path):
    import onnx_ir as ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    module = trained_like(transformers.BertModel(config, add_pooling_layer=False).eval())
    ids = torch.randint(0, config.vocab_size, (2, 16))
    plain = _plain_export(module, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, tmp_path / "bert_plain.onnx")

    path = onnxscript_file(plain, tmp_path / "bert_onnxscript")

    assert path.name == "bert_onnxscript.onnx", f"{path.name}: BERT needs no repair"
    model = ir.load(str(plain))
    optimize_for_ort(model)
    ir.save(model, str(tmp_path / "bert_optimize_for_ort.onnx"))
    assert path.read_bytes() == (tmp_path / "bert_optimize_for_ort.onnx").read_bytes(), "the repair changed a graph that needed none"
