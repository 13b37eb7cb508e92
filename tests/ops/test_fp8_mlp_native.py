"""Fp8Mlp's native side without a GPU: its shape checks name the input that does not fit (the CPU kernel's numbers are
checked by test_ort_library over tests/ops/cases.py and by tests/rewrite/test_fp8_gemm.py against the Fp8GemmAct pair),
and the C ABI bench/fp8_gemm_gpu.py drives refuses what the CUDA launcher cannot run before any CUDA call, with the
scratch its layout says (its CUDA side is checked on a GPU by bench/fp8_gemm_gpu.sh)."""

from __future__ import annotations

import ctypes
import shutil

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from deployfuse.backends.ort import run, session
from deployfuse.ops import ort_custom_ops_library
from deployfuse.ops.models import example_inputs, ort_feed, single_op_model
from deployfuse.ops.specs import SPECS
from tests.ops.cases import draw

OP = "Fp8Mlp"


@pytest.mark.parametrize("bad,why", [
    ("W1", r"X must be \[\.\.\., K\] and W1 \[N1, K\]"),
    ("W2", r"W2 must be \[N2, N1\] for W1's N1"),
    ("B1", "B1 must have W1's N1 elements"),
    ("B2", "B2 must have W2's N2 elements"),
    ("HScale", "XScale, W1Scale, HScale and W2Scale must be scalars"),
])
def test_shape_checks_name_the_input_that_does_not_fit(bad, why):
    xs = example_inputs(OP, (3, 16, 32, 8))
    model = single_op_model(OP, xs)
    del model.functions[:]  # only the library's kernel can run the node
    feed = dict(zip(SPECS[OP].inputs, xs))
    feed[bad] = np.repeat(feed[bad], 2) if bad == "HScale" else np.ascontiguousarray(feed[bad][..., :-1])
    with pytest.raises(Exception, match=why):
        run(session(model, custom_ops_library=ort_custom_ops_library()), ort_feed(OP, list(feed.values())))


def test_algo_attributes_leave_the_cpu_kernel_as_it_is_and_a_bad_one_is_refused():
    """algo1 / algo2 pick CUDA kernels only: the CPU kernel's output with a candidate pair set equals its output without, and
    equals the function body's; an index below -1 is refused by name."""
    xs = draw(OP, (2, 3, 24, 32, 8), activation="gelu_tanh")
    plain = single_op_model(OP, xs, activation="gelu_tanh")
    library = ort_custom_ops_library()
    got = {}
    for algos in ({}, {"algo1": 3, "algo2": 0}):
        body = single_op_model(OP, xs, activation="gelu_tanh", **algos)
        kernel = single_op_model(OP, xs, activation="gelu_tanh", **algos)
        del kernel.functions[:]  # only the library's kernel can run the node
        got[f"body {algos}"] = run(session(body, optimize=False), ort_feed(OP, xs))["Y"]
        got[f"kernel {algos}"] = run(session(kernel, optimize=False, custom_ops_library=library), ort_feed(OP, xs))["Y"]
    want = run(session(plain, optimize=False), ort_feed(OP, xs))["Y"]
    assert np.abs(want).max() > 0
    for what, y in got.items():
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6 * np.abs(want).max(), err_msg=what)
    np.testing.assert_array_equal(got["kernel {'algo1': 3, 'algo2': 0}"], got["kernel {}"])
    bad = single_op_model(OP, xs, algo2=-2)
    del bad.functions[:]
    with pytest.raises(Exception, match="algo1 and algo2 must be -1"):
        run(session(bad, custom_ops_library=library), ort_feed(OP, xs))


def test_hscale_as_a_constant_initializer_or_a_feed_gives_the_function_bodys_output():
    """The kernel instance reads at creation whether HScale is a constant initializer (the CUDA kernel then keeps 1/HScale on the
    device): the node with HScale an initializer and with HScale fed, through the library's kernel, equals the function body."""
    xs = draw(OP, (2, 3, 32, 48, 16), activation="relu")
    library = ort_custom_ops_library()
    want = run(session(single_op_model(OP, xs, activation="relu"), optimize=False), ort_feed(OP, xs))["Y"]
    assert np.abs(want).max() > 0
    fed = single_op_model(OP, xs, activation="relu")
    del fed.functions[:]  # only the library's kernel can run the node
    constant = onnx.ModelProto.FromString(fed.SerializeToString())
    h_scale = xs[SPECS[OP].inputs.index("HScale")]
    constant.graph.initializer.append(numpy_helper.from_array(np.asarray(h_scale, np.float32), "HScale"))
    constant.graph.input.remove(next(i for i in constant.graph.input if i.name == "HScale"))
    for model, feed in ((fed, ort_feed(OP, xs)), (constant, {k: v for k, v in ort_feed(OP, xs).items() if k != "HScale"})):
        y = run(session(model, optimize=False, custom_ops_library=library), feed)["Y"]
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no CUDA toolkit (nvcc): the C ABI library cannot compile")
def test_c_abi_refuses_what_the_launcher_cannot_run_and_sizes_its_scratch():
    """N1 not a multiple of 16 (H's float8 rows) answers cudaErrorNotSupported and K = 0 cudaErrorInvalidValue, both before
    any CUDA call, from the launch (whatever its algo1, algo2) and from the candidate count (which then writes no count); the
    scratch is X in float8 (rows of K rounded up to 16), 1/HScale, H [m, N1], then the larger of the
    GEMMs' own scratch (FC1: W1 padded to K rounded up; FC2: W2, B2 and Y padded where N2 is off 16 bytes of T), each part
    rounded up to 256 bytes: no cuBLASLt workspace (plugins/fp8_gemm_act/fp8_gemm_act.cu says why)."""
    from deployfuse.ops.native import build_plugins
    from deployfuse.rewrite.gemm_tuning import load_library

    lib = load_library(build_plugins(cuda=True, tensorrt=True) / "libdeployfuse_ops_cuda.so")  # the tuner's declarations
    fp16, not_supported, invalid_value = 1, 801, 1
    nulls = [None] * 11

    def call(m: int, k: int, n1: int, n2: int, algo1: int = -1, algo2: int = -1) -> int:
        return lib.df_fp8_mlp(fp16, *nulls, m, k, n1, n2, 0, algo1, algo2, 1, None, 0, None)

    def candidates(m: int, k: int, n1: int, n2: int) -> tuple[int, int, int]:
        counts = (ctypes.c_int(-7), ctypes.c_int(-7))
        rc = lib.df_fp8_mlp_candidates(fp16, *nulls[:9], m, k, n1, n2, 0, 1, *(ctypes.byref(c) for c in counts))
        return rc, counts[0].value, counts[1].value

    assert call(5, 32, 40, 16) == not_supported
    assert call(5, 32, 40, 16, 3, 0) == not_supported
    assert call(5, 0, 32, 16) == invalid_value
    assert call(0, 32, 40, 16) == not_supported  # the shape is refused whatever the batch
    assert candidates(5, 32, 40, 16) == (not_supported, -7, -7)
    assert candidates(5, 0, 32, 16) == (invalid_value, -7, -7)

    def up(n: int) -> int:
        return -(-n // 256) * 256

    m, k, n1, n2 = 5, 40, 64, 19  # K -> 48; N2 = 19 fp16 -> 24 columns
    fc1 = up(n1 * 48)  # W1 padded to [N1, 48]; X and H given in float8, H's N1 unpadded
    fc2 = up(24 * n1) + up(24 * 2) + up(m * 24 * 2)  # W2 [24, N1], B2 [24], Y [m, 24]
    assert lib.df_fp8_mlp_scratch_bytes(fp16, m, k, n1, n2) == up(m * 48) + 256 + up(m * n1) + max(fc1, fc2)
