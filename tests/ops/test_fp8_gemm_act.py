"""Fp8GemmAct beyond the generic op cases: its quantization is the saturating float8 conversion's
to the bit (ties to even, saturation), scales of shape [1] work, the body runs in bfloat16 graphs on the CPU EP,
and the torch op exports to one node that ONNX Runtime runs to the eager numbers."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from ml_dtypes import bfloat16

from deployfuse.backends.ort import run, session
from deployfuse.ops import attach_functions
from deployfuse.ops.models import example_inputs, ort_feed, reference_output, single_op_model
from deployfuse.ops.schema import to_element_type
from deployfuse.ops.torch_ops import translation_table

OP = "Fp8GemmAct"


def _body(xs, **attrs) -> np.ndarray:
    return run(session(single_op_model(OP, xs, **attrs), optimize=False), ort_feed(OP, xs))["Y"]


def test_quantization_rounds_ties_to_even_and_saturates_like_quantize_linear():
    """With W = I and no bias, Y = dq(q(X, s)): the reference, the body (ONNX Runtime's saturating
    float8 Cast) and ml_dtypes' conversion agree on every code, ties and overflow included."""
    s = np.float32(2.0 ** np.random.default_rng().integers(-8, 4))  # a power of two: x / s is exact
    k = 16
    ties = [17.0, 19.0, 248.0, 2.0**-10, 3 * 2.0**-10, 0.5 + 2.0**-5]  # halfway between two float8 codes
    ratios = np.array([*ties, *(-t for t in ties), 464.0, -1e4, 0.0, 447.0], np.float32)[:k]
    x = (ratios * s)[None, :].astype(np.float32)
    eye = to_element_type(np.eye(k, dtype=np.float32), "float8e4m3fn")
    xs = [x, np.array(s, np.float32), eye, np.array(1.0, np.float32), np.zeros(k, np.float32)]
    want = to_element_type(ratios, "float8e4m3fn").astype(np.float32) * s
    np.testing.assert_array_equal(reference_output(OP, xs), want[None, :])
    np.testing.assert_array_equal(_body(xs), want[None, :])
    assert list(want[:3] / s) == [16.0, 20.0, 256.0] and want[12] / s == 448.0 and want[13] / s == -448.0


def test_scales_of_shape_one():
    xs = example_inputs(OP, (6, 40, 24))
    xs[1], xs[3] = xs[1].reshape(1), xs[3].reshape(1)
    np.testing.assert_allclose(_body(xs, activation="relu"), reference_output(OP, xs, activation="relu"), rtol=1e-5, atol=1e-6)


def test_body_runs_in_bfloat16_on_the_cpu_ep():
    """The body quantizes in float32 (Cast in, CastLike out), so bf16 graphs get the reference's
    numbers on ONNX Runtime's CPU EP."""
    xs = example_inputs(OP, (4, 33, 9), dtype=bfloat16)
    model = single_op_model(OP, xs, activation="gelu_tanh")
    model.graph.node.append(onnx.helper.make_node("Cast", ["Y"], ["Y32"], to=onnx.TensorProto.FLOAT))  # ORT returns no bf16 arrays
    model.graph.output[0].CopyFrom(onnx.helper.make_tensor_value_info("Y32", onnx.TensorProto.FLOAT, None))
    got = run(session(model, optimize=False), ort_feed(OP, xs))["Y32"]
    ref = reference_output(OP, xs, activation="gelu_tanh").astype(np.float32)
    np.testing.assert_allclose(got, ref, rtol=2**-7, atol=1e-6)  # the same float32 math, one bf16 rounding apart at most


class _Fp8Linear(torch.nn.Module):
    """A linear layer whose weight is stored as float8 [N, K], as the rewrite rule stores it."""

    def __init__(self, k: int, n: int) -> None:
        super().__init__()
        weight = torch.randn(n, k) / k**0.5
        self.register_buffer("w_scale", weight.abs().max() / 448)
        self.register_buffer("w", to_element_type(weight / self.w_scale, "float8e4m3fn"))
        self.register_buffer("x_scale", torch.tensor(3.0 / 448))
        self.bias = torch.nn.Parameter(torch.randn(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.deployfuse.fp8_gemm_act(x, self.x_scale, self.w, self.w_scale, self.bias, "gelu_tanh")


def test_torch_op_exports_to_one_node_that_ort_runs():
    model = _Fp8Linear(16, 24).eval()
    program = torch.onnx.export(model, (torch.randn(2, 5, 16),), dynamo=True, custom_translation_table=translation_table(),
                                input_names=["x"], opset_version=20, verbose=False)
    proto = program.model_proto
    assert [(n.domain, n.op_type) for n in proto.graph.node] == [("deployfuse", OP)]
    attach_functions(proto)
    onnx.checker.check_model(proto, full_check=True)
    x = torch.randn(2, 5, 16) * 2
    (got,) = run(session(proto, optimize=False), {"x": x.numpy()}).values()
    np.testing.assert_allclose(got, model(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_models_older_than_opset_19_are_refused():
    with pytest.raises(ValueError, match="Fp8GemmAct needs ONNX opset >= 19; the model uses 18"):
        single_op_model(OP, example_inputs(OP, (2, 8, 4)), opset=18)
