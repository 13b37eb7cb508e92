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
from deployfuse.ops.defs.skip_layer_norm_fp8 import EXAMPLE_VOCAB, reference_outputs
from deployfuse.ops.models import example_inputs, ort_feed, reference_output, single_op_model, torch_inputs
from deployfuse.ops.schema import to_element_type
from tests.ops.cases import draw

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


def _lookup_case(ids_shape: tuple[int, ...], skip: tuple[int, ...] | None, ids: bool) -> list:
    """Inputs with the outputs ids_shape + [48]: the example's table looked up by its Ids (ids False: X of that shape) and a
    Skip of shape `skip` (None: none) broadcast over the leading axes."""
    xs = example_inputs(OP, (*ids_shape, 48), mask="ids" if ids else None)
    if skip is not None:
        xs[5] = np.random.default_rng().standard_normal(skip, dtype=np.float32)
    return xs


@pytest.mark.parametrize(
    "ids_shape,skip,ids",
    [((3, 5), (5, 48), True), ((3, 5), (1, 5, 48), True), ((3, 5), (3, 5, 48), True), ((2, 3, 4), None, True), ((6,), (6, 48), True),
     ((3, 5), (5, 48), False), ((2, 3, 4), (1, 4, 48), False), ((2, 3, 4), (48,), False)],
    ids=["ids_skip_s", "ids_skip_1s", "ids_skip_full", "ids_rank2_no_skip", "ids_rank1", "skip_s", "skip_1s_rank3", "skip_row"],
)
@pytest.mark.parametrize("native", [False, True], ids=["function_body", "cpu_library"])
def test_lookups_and_broadcast_skip_match_reference(library, ids_shape, skip, ids, native):
    """With Ids, row r of the sum reads the table's row Ids[r] (the example's ids: one below -V and one at V, clamped, and -1,
    the last row), the outputs Ids.shape + [H]; a Skip of fewer rows broadcast over the leading axes."""
    xs = _lookup_case(ids_shape, skip, ids)
    model = _norm_model(xs, ("Y", "YQ", "Sum"), onnx.TensorProto.FLOAT)
    for out in model.graph.output:  # the outputs' rank: Ids' and H
        del out.type.tensor_type.shape.dim[:]
        out.type.tensor_type.shape.dim.extend(onnx.TensorShapeProto.Dimension(dim_param=f"{out.name}_{i}") for i in range(len(ids_shape) + 1))
    if native:
        del model.functions[:]
    got = run(session(model, optimize=native, custom_ops_library=library if native else None), ort_feed(OP, xs))
    y, yq, total = reference_outputs(*torch_inputs(xs), epsilon=1e-3)
    assert y.shape == (*ids_shape, 48)
    np.testing.assert_allclose(got["Y"], y.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got["Sum"], total.numpy(), rtol=1e-5, atol=1e-6)
    steps = np.abs(_bits(got["YQ"]).astype(np.int16) - yq.view(torch.uint8).numpy().astype(np.int16))
    assert steps.max() <= 1 and (steps > 0).mean() < 2e-2
    if ids:  # the rows the clamped and the negative ids read: 0, V - 1, V - 1
        skips = np.zeros_like(got["Sum"]) if xs[5] is None else np.broadcast_to(xs[5], got["Sum"].shape)
        for k, row in enumerate((0, EXAMPLE_VOCAB - 1, EXAMPLE_VOCAB - 1)):
            np.testing.assert_allclose(got["Sum"].reshape(-1, 48)[k], xs[0][row] + xs[3] + skips.reshape(-1, 48)[k], rtol=1e-5, atol=1e-6)


def test_skip_that_does_not_broadcast_over_leading_axes_is_refused(library):
    """A Skip whose rows are not the output's trailing dims fails in the CPU kernel instead of reading past it."""
    xs = _lookup_case((3, 5), (3, 48), True)
    model = _norm_model(xs, ("Y",), onnx.TensorProto.FLOAT)
    del model.functions[:]
    with pytest.raises(Exception, match="Skip must be the output's shape or broadcast to it"):
        run(session(model, optimize=True, custom_ops_library=library), ort_feed(OP, xs))


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
    xs = draw(op, shape, activation="gelu_tanh")
    model, feed = _fp8_x_model(op, xs)
    if native:
        del model.functions[:]
    got = run(session(model, optimize=native, custom_ops_library=library if native else None), feed)["Y"]
    dequantized = to_element_type(xs[0] / xs[1], "float8e4m3fn").astype(np.float32) * xs[1]
    want = reference_output(op, [dequantized, *xs[1:]])
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert not np.allclose(want, reference_output(op, [dequantized * 1.07, *xs[1:]]), atol=1e-3)  # X reaches Y: the check can fail
