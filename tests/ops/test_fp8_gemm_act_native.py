"""Fp8GemmAct's native side on the CPU: the CPU kernel of libdeployfuse_ort quantizes X to the bit as
the reference does (float8e4m3fn in software: ties to even, subnormals, saturation, infinities,
NaN), the library registers the spec's fixed input types (a float W finds no kernel), its shape
checks name the input that does not fit, and the generated header carries the types and leaves the
op out of the TensorRT list (its CUDA side is checked on a GPU by bench/fp8_gemm_gpu.sh)."""

from __future__ import annotations

import ctypes
import importlib.util
import re
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from deployfuse.backends.ort import run, session
from deployfuse.ops import ort_custom_ops_library
from deployfuse.ops.models import example_inputs, ort_feed, reference_output, single_op_model
from deployfuse.ops.schema import E4M3_MAX, to_element_type
from deployfuse.ops.specs import SPECS
from deployfuse.rewrite.gemm_tuning import ACT_CODES

OP = "Fp8GemmAct"
PLUGINS = Path(__file__).resolve().parents[2] / "plugins"


@pytest.fixture(scope="module")
def library():
    return ort_custom_ops_library()


def _native(library, xs, **attrs) -> np.ndarray:
    model = single_op_model(OP, xs, **attrs)
    del model.functions[:]  # only the library's kernel can run the node
    return run(session(model, optimize=False, custom_ops_library=library), ort_feed(OP, xs))["Y"]


def _awkward_ratios(rng: np.random.Generator) -> np.ndarray:
    """Values of x / s: every float8 code, the midpoints between neighbours (ties), random
    magnitudes from below the smallest subnormal to past saturation, infinities and -0."""
    codes = np.arange(256, dtype=np.uint8).view(to_element_type(np.zeros(1), "float8e4m3fn").dtype).astype(np.float32)
    finite = np.unique(codes[np.isfinite(codes)])
    mids = (finite[1:] + finite[:-1]) / 2
    randoms = rng.choice([-1, 1], 2000) * np.exp2(rng.uniform(-14, 10, 2000))
    return np.concatenate([finite, mids, randoms, [np.inf, -np.inf, 1e30, -0.0, E4M3_MAX + 16, -(E4M3_MAX + 15.9)]]).astype(np.float32)


@pytest.mark.parametrize("power_of_two", [True, False], ids=["exact-ties", "any-scale"])
def test_cpu_kernel_quantizes_x_bit_for_bit_like_the_reference(library, power_of_two):
    """W = I, WScale = 1, Bias = 0: Y = dq(q(X, XScale)) exactly, one NaN in the last row making
    that row NaN (0 · NaN in the sum); with a power-of-two scale x / s hits the ties exactly."""
    rng = np.random.default_rng()
    s = np.float32(2.0 ** rng.integers(-6, 4) if power_of_two else rng.uniform(0.01, 3.0))
    k = 64
    ratios = _awkward_ratios(rng)
    rows = -(-ratios.size // k) + 1
    x = np.zeros(rows * k, np.float32)
    x[: ratios.size] = ratios * s
    x = x.reshape(rows, k)
    x[-1] = x[0, ::-1]
    x[-1, 5] = np.nan
    xs = [x, np.array(s, np.float32), to_element_type(np.eye(k, dtype=np.float32), "float8e4m3fn"), np.array(1.0, np.float32), np.zeros(k, np.float32)]
    got, want = _native(library, xs), reference_output(OP, xs)
    np.testing.assert_array_equal(got, want)  # NaN for NaN
    assert np.isnan(got[-1]).all() and not np.isnan(got[:-1]).any()
    assert np.nanmax(np.abs(got)) == np.float32(E4M3_MAX) * s, "saturation reached"  # float32 product (numpy 1.x would widen to float64)


def test_cpu_kernel_matches_the_reference_at_a_bert_shape(library):
    xs = example_inputs(OP, (2, 16, 768, 96))
    np.testing.assert_allclose(_native(library, xs, activation="gelu_tanh"), reference_output(OP, xs, activation="gelu_tanh"), rtol=1e-4, atol=1e-5)


def test_cpu_kernel_accumulates_in_fp32_at_either_fast_accum_and_refuses_other_values(library):
    """fast_accum picks the CUDA GEMM's accumulation only: the CPU kernel gives the same numbers
    (bit for bit) at 0 and 1, and a value outside {0, 1} is refused by name."""
    xs = example_inputs(OP, (5, 37, 19))
    full, fast = _native(library, xs, fast_accum=0), _native(library, xs, fast_accum=1)
    np.testing.assert_array_equal(full, fast)
    np.testing.assert_allclose(fast, reference_output(OP, xs), rtol=1e-4, atol=1e-5)
    with pytest.raises(Exception, match="fast_accum"):
        _native(library, xs, fast_accum=2)


def test_library_registers_the_fixed_input_types(library):
    """W declared float32 instead of float8e4m3fn: no kernel of the library matches the node (the
    registration gives each input the spec's type, not T)."""
    model = single_op_model(OP, example_inputs(OP, (3, 16, 8)))
    del model.functions[:]
    session(model, custom_ops_library=library)  # as the spec declares it: a kernel is found
    w = next(vi for vi in model.graph.input if vi.name == "W")
    w.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    with pytest.raises(Exception, match=OP):
        session(model, custom_ops_library=library)


@pytest.mark.parametrize("bad,why", [
    ("W", r"X must be \[\.\.\., K\] and W \[N, K\]"),
    ("Bias", "Bias must have W's N elements"),
    ("XScale", "XScale and WScale must be scalars"),
])
def test_shape_checks_name_the_input_that_does_not_fit(library, bad, why):
    xs = example_inputs(OP, (3, 16, 8))
    model = single_op_model(OP, xs)
    del model.functions[:]
    feed = dict(zip(SPECS[OP].inputs, xs))
    if bad == "XScale":
        feed[bad] = np.repeat(feed[bad], 2)
    else:
        feed[bad] = np.ascontiguousarray(feed[bad][..., :-1])
    with pytest.raises(Exception, match=why):
        run(session(model, custom_ops_library=library), ort_feed(OP, list(feed.values())))


def test_generated_header_carries_input_types_and_the_trt_list_leaves_the_op_out():
    loader = importlib.util.spec_from_file_location("gen_op_specs", PLUGINS / "gen_op_specs.py")
    gen = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(gen)
    files = gen.generated_files()
    native = {"T": "kT", "float": "kFloat", "float8e4m3fn": "kFloat8E4M3FN", "int64": "kInt64"}
    for name, spec in SPECS.items():
        block = re.search(rf"struct {name} \{{(.*?)\n\}};", files["deployfuse_op_specs.h"], flags=re.S)[1]
        types = re.search(r"kInputTypes\[\] = \{(.*?)\};", block)[1]
        assert types == ", ".join(f"InputType::{native[spec.input_type(i)]}" for i in spec.inputs), name
        assert f"kTrtPlugin = {'true' if spec.trt_plugin else 'false'};" in block, name
    trt = re.search(r"using Registered = OpList<(.*)>;", files["deployfuse_trt_ops.h"])[1]
    assert OP not in trt and not SPECS[OP].trt_plugin
    assert re.search(rf"\b{OP}\b", re.search(r"using Registered = OpList<(.*)>;", files["deployfuse_ort_ops.h"])[1])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no CUDA toolkit (nvcc): the C ABI library cannot compile")
def test_c_abi_refuses_what_the_fp8_gemm_cannot_run_before_any_cuda_call():
    """df_fp8_gemm_act (bench/fp8_gemm_gpu.py's entry) answers cudaErrorInvalidValue for K = 0 and for an
    activation no cuBLASLt epilogue computes, without touching a GPU, at either fast_accum; its scratch
    says the padded plan: X's float8 copy (rows of K rounded up to 16 bytes), a copy of W padded likewise,
    and where N is off 16 bytes of T (cuBLASLt's fp8 kernels want D's rows themselves, not only its
    leading dimension, of 16 bytes) W, the bias and Y padded to N rounded up; each part rounded up to 256
    bytes, then the largest workspace."""
    from deployfuse.ops.native import build_plugins

    lib = ctypes.CDLL(str(build_plugins(cuda=True, tensorrt=True) / "libdeployfuse_ops_cuda.so"))
    P, I64, INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.df_fp8_gemm_act.argtypes = [INT, P, P, P, P, P, P, P, I64, I64, I64, INT, INT, INT, P, ctypes.c_size_t]
    lib.df_fp8_gemm_act_candidates.argtypes = [INT, P, P, P, P, P, I64, I64, I64, INT, INT]
    lib.df_fp8_gemm_act_scratch_bytes.argtypes = [INT, I64, I64, I64]
    lib.df_fp8_gemm_act_scratch_bytes.restype = ctypes.c_size_t
    invalid_value = 1

    def run(k: int, act: int, fast_accum: int) -> int:
        return lib.df_fp8_gemm_act(1, None, None, None, None, None, None, None, 4, 16, k, act, -1, fast_accum, None, 0)

    for fast_accum in (0, 1):
        assert run(0, ACT_CODES["none"], fast_accum) == invalid_value
        assert run(48, 2, fast_accum) == invalid_value  # Act::kGelu (exact erf): no epilogue
        assert lib.df_fp8_gemm_act_candidates(1, None, None, None, None, None, 4, 16, 0, ACT_CODES["relu"], fast_accum) == -invalid_value

    def scratch(dtype: int, m: int, n: int, k: int) -> int:  # no cuBLASLt workspace (plugins/fp8_gemm_act/fp8_gemm_act.cu says why)
        return lib.df_fp8_gemm_act_scratch_bytes(dtype, m, n, k)

    fp16, bf16 = 1, 2
    assert scratch(fp16, 100, 64, 48) == 4864  # fp16 rows of 128 bytes, K = 48: only X's float8 copy
    assert scratch(fp16, 100, 24, 48) == 4864  # 48-byte rows: a multiple of 16, written in place
    assert scratch(fp16, 100, 64, 40) == 4864 + 3072  # K = 40: X and W in rows of 48 bytes
    # N = 60 (120-byte rows): computed as 64 columns, W [64, 48] (3072), bias [64] (128 -> 256), Y [100, 64] (12800)
    assert scratch(fp16, 100, 60, 48) == 4864 + 3072 + 256 + 12800
    # N = 19, K = 37 (the GPU check's odd shape): X [3, 48] (144 -> 256), W [24, 48] (1152 -> 1280), bias [24], Y [3, 24]
    for dtype in (fp16, bf16):
        assert scratch(dtype, 3, 19, 37) == 256 + 1280 + 256 + 256
