"""fp16 / bf16 lowering: the graph stays valid, the interface stays float32, the math stays close."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto

from deployfuse.engine.precision import lower_precision


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)


def _feeds(batch: int, seq: int) -> dict[str, np.ndarray]:
    ids = np.random.default_rng().integers(0, 512, (batch, seq), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_lowered_graph_is_valid_with_float32_interface(bert_onnx, precision):
    model = onnx.load(bert_onnx)
    assert lower_precision(model, precision) > 0
    onnx.checker.check_model(model, full_check=True)  # strict type inference: no fp32/fp16 mix left
    assert all(o.type.tensor_type.elem_type == TensorProto.FLOAT for o in model.graph.output)
    low = {"fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}[precision]
    assert not any(t.data_type == TensorProto.FLOAT for t in model.graph.initializer)
    assert any(t.data_type == low for t in model.graph.initializer)


def test_fp16_matches_fp32_within_fp16_rounding(bert_onnx):
    """ONNX Runtime's CPU kernels run the fp16 graph; compare with the fp32 graph on fresh inputs."""
    reference_model = onnx.load(bert_onnx)
    model = onnx.load(bert_onnx)
    lower_precision(model, "fp16")
    feeds = _feeds(3, 11)
    for ref, out in zip(_run(reference_model, feeds), _run(model, feeds)):
        assert out.dtype == np.float32
        assert np.abs(out - ref).max() <= 5e-3 * max(1.0, np.abs(ref).max())
