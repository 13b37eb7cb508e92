"""FusedMHA's YQ form (tests/ops/cases.py YQ_CASES: YScale given, Y written or not, with and without a Mask, the absent one
named ""): through the function bodies (ONNX Runtime optimisations off) and the CPU custom-op library, on fresh random
inputs, Y matches the PyTorch reference, YQ is bit for bit q(Y, YScale) of the Y the node wrote, and within one float8
step of the reference's YQ (Y's float32 rounding may cross a midpoint). The generic op tests check Y only. TensorRT's
plugin (the C ABI over its adapter) refuses YScale."""

from __future__ import annotations

import ctypes
import shutil

import numpy as np
import onnx
import pytest
import torch

from deployfuse.backends.ort import run, session
from deployfuse.ops import SPECS, ort_custom_ops_library
from deployfuse.ops.defs.fused_mha import reference_outputs
from deployfuse.ops.models import example_inputs, ort_feed, single_op_model, torch_inputs
from deployfuse.ops.schema import E4M3_MAX, to_element_type
from tests.ops.cases import YQ_CASES, case_id

OP = "FusedMHA"


@pytest.fixture(scope="module")
def library():
    return ort_custom_ops_library()


def _model(xs: list, outputs: tuple[str, ...], **attrs) -> onnx.ModelProto:
    """The one-node model writing the outputs asked for, as `rules.fp8_attention_out` leaves the node."""
    types = {"Y": onnx.TensorProto.FLOAT, "YQ": onnx.TensorProto.FLOAT8E4M3FN}
    return single_op_model(OP, xs, opset=20, outputs={name: types[name] for name in outputs}, **attrs)


def _bits(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array).view(np.uint8)


@pytest.mark.parametrize("native", [False, True], ids=["function_body", "cpu_library"])
@pytest.mark.parametrize("case", YQ_CASES, ids=case_id)
def test_yq_is_the_quantized_y(library, case, native):
    _, shape, attrs = case
    attrs = dict(attrs)
    xs = example_inputs(OP, shape, **attrs)
    outputs = attrs.pop("outputs")
    attrs.pop("mask", None)
    # YScale = half this draw's max|Y| / 448: its largest values saturate, those under half do not (the example's
    # max|V|-based scale left a one-query case with none saturated once)
    y_max = reference_outputs(*torch_inputs(xs), **attrs)[0].abs().max().item()
    xs[4] = np.asarray(y_max * 0.5 / E4M3_MAX, dtype=np.float32)
    model = _model(xs, ("Y", "YQ"), **attrs)  # Y too: what YQ must be the quantized copy of
    alone = _model(xs, outputs, **attrs)
    if native:
        del model.functions[:], alone.functions[:]  # only the native kernel can run the nodes now
    lib = library if native else None
    got = run(session(model, optimize=False, custom_ops_library=lib), ort_feed(OP, xs))
    y, yq = reference_outputs(*torch_inputs(xs), **attrs)
    np.testing.assert_allclose(got["Y"], y.numpy(), rtol=1e-4, atol=1e-5)
    requantized = to_element_type(torch.from_numpy(got["Y"]) / torch.from_numpy(xs[4]), "float8e4m3fn").view(torch.uint8).numpy()
    assert np.array_equal(_bits(got["YQ"]), requantized), "YQ = q(Y, YScale) of the Y written, bit for bit"
    steps = np.abs(_bits(got["YQ"]).astype(np.int16) - yq.view(torch.uint8).numpy().astype(np.int16))
    assert steps.max() <= 1 and (steps > 0).mean() < 2e-2, "within one float8 step of the reference's YQ"
    assert 0 < (np.abs(requantized.astype(np.int16) & 0x7F) == 0x7E).sum() < requantized.size, "some values saturate, not all"
    only = run(session(alone, optimize=False, custom_ops_library=lib), ort_feed(OP, xs))
    assert set(only) == set(outputs) and np.array_equal(_bits(only["YQ"]), _bits(got["YQ"])), "the same YQ whether Y is written or not"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no CUDA toolkit (nvcc): the C ABI library cannot compile")
def test_tensorrt_plugin_refuses_yscale(capfd):
    """The TensorRT plugin has one output, so it never writes YQ: given YScale it refuses before any CUDA call, saying why."""
    from deployfuse.ops.native import build_plugins

    lib = ctypes.CDLL(str(build_plugins(cuda=True, tensorrt=True) / "libdeployfuse_ops_cuda.so"))
    shapes = [(1, 4, 8)] * 3 + [(1, 1, 1, 4), ()]
    dims = [(ctypes.c_int64 * max(len(s), 1))(*s) for s in shapes]
    dim_ptrs = (ctypes.POINTER(ctypes.c_int64) * 5)(*[ctypes.cast(d, ctypes.POINTER(ctypes.c_int64)) for d in dims])
    numbers = [{"num_heads": 2.0}.get(name, 0.0) for name in SPECS[OP].attrs]
    rc = lib.df_run(b"FusedMHA", 0, None, 5, (ctypes.c_void_p * 5)(), dim_ptrs, (ctypes.c_int * 5)(*map(len, shapes)), None,
                    (ctypes.c_double * len(numbers))(*numbers), (ctypes.c_char_p * len(numbers))())
    assert rc == 1, "cudaErrorInvalidValue"  # as TensorRT's enqueue answers
    assert "YScale (the float8 output YQ) has no TensorRT plugin" in capfd.readouterr().err
