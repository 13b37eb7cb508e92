"""Fp8Mlp's native side without a GPU: its shape checks name the input that does not fit (the CPU kernel's numbers are
checked by test_ort_library over tests/ops/cases.py and by tests/rewrite/test_fp8_gemm.py against the Fp8GemmAct pair),
and the C ABI bench/fp8_gemm_gpu.py drives refuses what the CUDA launcher cannot run before any CUDA call, with the
scratch its layout says (its CUDA side is checked on a GPU by bench/fp8_gemm_gpu.sh)."""

from __future__ import annotations

import ctypes
import shutil

import numpy as np
import pytest

from deployfuse.backends.ort import run, session
from deployfuse.ops import ort_custom_ops_library
from deployfuse.ops.models import example_inputs, ort_feed, single_op_model
from deployfuse.ops.specs import SPECS

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


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no CUDA toolkit (nvcc): the C ABI library cannot compile")
def test_c_abi_refuses_what_the_launcher_cannot_run_and_sizes_its_scratch():
    """N1 not a multiple of 16 (H's float8 rows) answers cudaErrorNotSupported and K = 0 cudaErrorInvalidValue, both before
    any CUDA call; the scratch is X in float8 (rows of K rounded up to 16), 1/HScale, H [m, N1], then the larger of the
    GEMMs' own scratch (FC1: W1 padded to K rounded up; FC2: W2, B2 and Y padded where N2 is off 16 bytes of T) and the
    largest workspace, each part rounded up to 256 bytes."""
    from deployfuse.ops.native import build_plugins
    from deployfuse.rewrite.gemm_tuning import WORKSPACE_BYTES

    lib = ctypes.CDLL(str(build_plugins(cuda=True, tensorrt=True) / "libdeployfuse_ops_cuda.so"))
    P, I64, INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.df_fp8_mlp.argtypes = [INT, P, *[P] * 10, I64, I64, I64, I64, INT, INT, P, ctypes.c_size_t]
    lib.df_fp8_mlp_scratch_bytes.argtypes = [INT, I64, I64, I64, I64]
    lib.df_fp8_mlp_scratch_bytes.restype = ctypes.c_size_t
    fp16, not_supported, invalid_value = 1, 801, 1
    nulls = [None] * 11

    def call(m: int, k: int, n1: int, n2: int) -> int:
        return lib.df_fp8_mlp(fp16, *nulls, m, k, n1, n2, 0, 1, None, 0)

    assert call(5, 32, 40, 16) == not_supported
    assert call(5, 0, 32, 16) == invalid_value
    assert call(0, 32, 40, 16) == not_supported  # the shape is refused whatever the batch

    def up(n: int) -> int:
        return -(-n // 256) * 256

    m, k, n1, n2 = 5, 40, 64, 19  # K -> 48; N2 = 19 fp16 -> 24 columns
    fc1 = up(n1 * 48)  # W1 padded to [N1, 48]; X and H given in float8, H's N1 unpadded
    fc2 = up(24 * n1) + up(24 * 2) + up(m * 24 * 2)  # W2 [24, N1], B2 [24], Y [m, 24]
    assert lib.df_fp8_mlp_scratch_bytes(fp16, m, k, n1, n2) == up(m * 48) + 256 + up(m * n1) + max(fc1, fc2) + WORKSPACE_BYTES
