"""SkipLayerNormFp8's three outputs (Y, its float8 copy YQ, the residual Sum), and Fp8GemmAct / Fp8Mlp fed an X already in
float8, through the function bodies (ONNX Runtime optimisations off) and the CPU custom-op library, against the PyTorch
reference on fresh random inputs. The generic op tests (tests/ops/cases.py) check Y only."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from deployfuse.backends.ort import run, session
from deployfuse.ops import attach_functions, ort_custom_ops_library
from deployfuse.ops.defs.skip_layer_norm_fp8 import reference_outputs
from deployfuse.ops.models import example_inputs, ort_feed, reference_output, single_op_model, torch_inputs
from deployfuse.ops.schema import to_element_type

OP = "SkipLayerNormFp8"
F8 = onnx.TensorProto.FLOAT8E4M3FN


@pytest.fixture(scope="module")
def library():
    return ort_custom_ops_library()


def _norm_model(xs: list, outputs: tuple[str, ...], dtype: int) -> onnx.ModelProto:
    """The one-node model of the op with the outputs asked for (the others left out, as the rule leaves them)."""
    types = {"Y": dtype, "YQ": F8, "Sum": dtype}
    return single_op_model(OP, xs, opset=20, outputs={name: types[name] for name in outputs}, epsilon=1e-3)


def _bits(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array).view(np.uint8)


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("outputs", [("Y", "YQ", "Sum"), ("YQ", "Sum"), ("YQ",)])
@pytest.mark.parametrize("native", [False, True], ids=["function_body", "cpu_library"])
def test_outputs_match_reference(library, skip, outputs, native):
    xs = example_inputs(OP, (2, 7, 48), mask=skip)
    model = _norm_model(xs, outputs, onnx.TensorProto.FLOAT)
    if native:
        del model.functions[:]  # only the native kernel can run the node now
    got = run(session(model, optimize=native, custom_ops_library=library if native else None), ort_feed(OP, xs))
    y, yq, total = reference_outputs(*torch_inputs(xs), epsilon=1e-3)
    want = {"Y": y.numpy(), "YQ": yq.view(torch.uint8).numpy(), "Sum": total.numpy()}
    assert set(got) == set(outputs)
    for name, value in got.items():
        if name == "YQ":  # float8 bytes (ORT hands them over as uint8): equal, or one float8 step off where Y sits within a
            # float32 rounding of a midpoint (the CPU kernel's statistics are in double)
            steps = np.abs(_bits(value).astype(np.int16) - want["YQ"].astype(np.int16))
            assert steps.max() <= 1 and (steps > 0).mean() < 1e-2, name
        else:
            np.testing.assert_allclose(value, want[name], rtol=1e-4, atol=1e-5, err_msg=name)


def test_yq_is_the_quantize_pass_it_replaces():
    """In float16, YQ equals q(Y) as Fp8GemmAct's own pass computes it from the Y the node writes (the same float8 bytes)."""
    xs = example_inputs(OP, (4, 64), dtype=np.float16, mask=True)
    got = run(session(_norm_model(xs, ("Y", "YQ"), onnx.TensorProto.FLOAT16), optimize=False), ort_feed(OP, xs))
    scale = torch.from_numpy(xs[4])
    requantized = to_element_type(torch.from_numpy(got["Y"]).float() / scale, "float8e4m3fn")
    assert np.array_equal(_bits(got["YQ"]), requantized.view(torch.uint8).numpy())
    y, _, _ = reference_outputs(*torch_inputs(xs), epsilon=1e-3)
    np.testing.assert_allclose(got["Y"].astype(np.float32), y.float().numpy(), rtol=2e-2, atol=2e-2)


def _fp8_x_model(op: str, xs: list) -> tuple[onnx.ModelProto, dict]:
    """The op's one-node model with X given in float8 (q(X, XScale)), and its feed."""
    quantized = to_element_type(xs[0] / xs[1], "float8e4m3fn")
    model = single_op_model(op, xs)
    model.graph.input[0].type.tensor_type.elem_type = F8
    attach_functions(model)
    return model, ort_feed(op, [quantized, *xs[1:]])


@pytest.mark.parametrize("op,shape", [("Fp8GemmAct", (3, 5, 32, 19)), ("Fp8Mlp", (2, 3, 48, 32, 9))])
@pytest.mark.parametrize("native", [False, True], ids=["function_body", "cpu_library"])
def test_fp8_gemms_take_x_in_float8(library, op, shape, native):
    """Fed q(X) instead of X, the op computes what it computes on dq(q(X)) = float(q(X))·XScale: no second rounding."""
    xs = example_inputs(op, shape, activation="gelu_tanh")
    model, feed = _fp8_x_model(op, xs)
    if native:
        del model.functions[:]
    got = run(session(model, optimize=native, custom_ops_library=library if native else None), feed)["Y"]
    dequantized = to_element_type(xs[0] / xs[1], "float8e4m3fn").astype(np.float32) * xs[1]
    want = reference_output(op, [dequantized, *xs[1:]])
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert not np.allclose(want, reference_output(op, [dequantized * 1.07, *xs[1:]]), atol=1e-3)  # X reaches Y: the check can fail
