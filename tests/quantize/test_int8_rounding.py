"""GPTQ rounding of int8 weights (deployfuse.quantize.rounding): the same scales and range as ONNX
Runtime's per-column int8, a smaller layer output error than rounding to nearest on activations
it was not fitted to, and Gram matrices equal to X^T X of the tensors ONNX Runtime computes."""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from deployfuse.backends.ort import run, session
from deployfuse.quantize.rounding import grams, int8_per_column


def _activations(generator: torch.Generator, size: int, *rows: int) -> list[torch.Tensor]:
    """Sets of correlated, shifted activations of one distribution (as after GELU), not white noise."""
    mixing, shift = torch.randn(size, size, generator=generator) / size**0.5, 0.5 * torch.randn(size, generator=generator)
    return [torch.nn.functional.gelu(torch.randn(n, size, generator=generator) @ mixing + shift) for n in rows]


def test_gptq_keeps_the_scales_and_lowers_the_output_error_on_fresh_activations():
    generator = torch.Generator().manual_seed(0)
    size, columns = 256, 96
    weight = (torch.randn(size, columns, generator=generator) * 0.02).numpy()
    fitted, fresh = _activations(generator, size, 2048, 512)
    nearest, nearest_scale = int8_per_column(weight)
    gptq, gptq_scale = int8_per_column(weight, (fitted.T @ fitted).double().numpy())
    assert gptq.dtype == np.int8 and gptq.shape == weight.shape and np.abs(gptq.astype(int)).max() <= 127
    np.testing.assert_array_equal(gptq_scale, nearest_scale)
    np.testing.assert_allclose(nearest_scale, np.abs(weight).max(axis=0) / 127, rtol=1e-6)
    assert np.array_equal(nearest, np.clip(np.rint(weight / nearest_scale), -127, 127))
    exact = fresh @ torch.from_numpy(weight)

    def error(q: np.ndarray) -> float:
        return float((fresh @ torch.from_numpy(q.astype(np.float32) * nearest_scale) - exact).norm() / exact.norm())

    assert error(gptq) < 0.85 * error(nearest), (error(gptq), error(nearest))
    assert (gptq != nearest).mean() > 0.05  # it moved weights, not a copy of nearest rounding


def test_grams_are_x_transpose_x_of_the_tensors_onnx_runtime_computes():
    generator = np.random.default_rng(1)
    w1, w2 = (generator.standard_normal(shape).astype(np.float32) for shape in ((8, 16), (16, 4)))
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3, 8])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = [{"x": generator.standard_normal((2, 3, 8)).astype(np.float32)} for _ in range(3)]
    got = grams(model, ["x", "r"], feeds)
    sess = session(onnx.ModelProto.FromString(model.SerializeToString()))
    assert list(run(sess, feeds[0])) == ["y"]
    relu = [np.maximum(f["x"] @ w1, 0).reshape(-1, 16) for f in feeds]
    x = [f["x"].reshape(-1, 8) for f in feeds]
    np.testing.assert_allclose(got["x"], sum(a.T @ a for a in x), rtol=1e-5)
    np.testing.assert_allclose(got["r"], sum(a.T @ a for a in relu), rtol=1e-5)
