"""GPU check and benchmark of Fp8GemmAct (X quantized to float8e4m3fn by one kernel, then a cuBLASLt fp8 GEMM with
the bias / ReLU / tanh-GELU epilogue) through the C ABI (df_fp8_gemm_act) and, where onnxruntime has its CUDA
provider, ONNX Runtime's CUDA EP with the custom-op library.

Correctness, outputs poisoned with NaN before each launch: ||out - ref|| / ||ref|| against a float64 reference of
the same quantization (X / XScale in float32 rounded to e4m3 as the spec's quantize_e4m3, then float64 products
and sums), fp16 and bf16, every activation, odd M, N a multiple of 16, of 8 only, and neither, K a multiple of 16 and not
(the padded copies of Y, X and W), X off 16-byte alignment (the scalar quantize path); the quantization bit for bit
(W = identity, power-of-two scales: Y = dq(q(X)) exactly, ties, subnormals, saturation, infinities, NaN); every
candidate (the heuristic's and the variants around them); a CUDA-graph replay = the eager launch; fp32 (cuBLASLt's fp8
kernels want a bf16 bias with an fp32 output: the op answers cudaErrorNotSupported, reported either way). Every
check runs with full fp32 accumulation (fast_accum=0, TOL) and with cuBLASLt's fast accumulation (fast_accum=1, the
op's default, TOL_FAST: its coarser rounding of the sum over K); the largest fast-accum error is printed.

Speed (fp16, GPU ms per call from CUDA events around CUDA-graph replays of 20 calls) at the BERT/ViT/GPT-2 GEMM
shapes: torch fp16 addmm, torch._scaled_mm on an X already in fp8 (with full and with fast accumulation) and with
torch's own quantize pass, Fp8GemmAct's quantize kernel alone (df_fp8_quantize_e4m3, with the bandwidth it reaches:
fp16 X read + fp8 copy written; its replays find X in the 60 MB L2 where X fits, so it can pass HBM's bandwidth
there, while inside the op the GEMM's output has evicted it), and Fp8GemmAct (quantize + GEMM) at the heuristic's
choice and its fastest candidate, with full (fast_accum=0) and fast accumulation (fast_accum=1). The ratio columns
divide Fp8GemmAct at the heuristic's choice (algo=-1, what an artefact exported without --autotune runs) by torch fp16
addmm, itself at cuBLAS's heuristic; the fastest candidate is what --autotune (deployfuse.rewrite.gemm_tuning) stores.

Tuning (with a GPU): gemm_tuning on a one-node model of BERT's FC1 (Fp8GemmAct) and one of BERT's MLP (Fp8Mlp) at 8x128
tokens, as --autotune runs it on an fp8 export: the problem it finds, the algo (algo1, algo2) it stores, and that setting's
output against the reference and the heuristic's (within TOL_FAST, TOL_MLP_FAST).

Fp8Mlp (FC1's fp8 GEMM writing the hidden activation H in float8, FC2's reading it: df_fp8_mlp) is checked the same way
against a float64 reference of its quantization (X and H rounded to e4m3 as the spec does; fp16 and bf16, each activation, odd M,
K not a multiple of 16, N2 not of 8, BERT's FC1 -> FC2, full and fast accumulation; N1 not a multiple of 16 refused with
cudaErrorNotSupported), every candidate of FC1 and of FC2 (algo1, algo2; df_fp8_mlp_candidates counts them) paired with the
other GEMM's last one, a CUDA-graph replay = the eager launch, and through ONNX Runtime's CUDA EP, plain and with its CUDA
graph; and timed against its two Fp8GemmAct calls (FC1 writing H in fp16, FC2 quantizing it again) at BERT's MLP shapes.
FC1's D scale 1/HScale given (h_scale_inverse) = computed by the launch, Y bit for bit with X in T and in float8, the one-thread
reciprocal kernel (torch's profiler counts it) launched only where computed with X in float8; through ORT, X in float8: HScale a
constant initializer launches it once in three runs (the kernel instance keeps it), HScale fed three times, the same Y.

SkipLayerNormFp8 (the norm writing the float8 X of the GEMMs it feeds) and Fp8GemmAct / Fp8Mlp fed that float8 X: the stages and
the timing table of bench/skip_layer_norm_fp8_gpu.py.

    python bench/fp8_gemm_gpu.py plugins/build/gpu/libdeployfuse_ops_cuda.so [--ort plugins/build/gpu/libdeployfuse_ort.so]
    python bench/fp8_gemm_gpu.py LIB --check-only --small    # the small checks (under compute-sanitizer)
    python bench/fp8_gemm_gpu.py --dry-run                   # no GPU: every check through the CPU kernel (ORT CPU EP)
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import math
import sys
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
import skip_layer_norm_fp8_gpu as norm_gpu  # noqa: E402 (SkipLayerNormFp8 and the float8-X launches: stages of this check)
from gemm_gpu import gpu_ms  # noqa: E402 (GemmAct's check: median GPU ms per call from CUDA-graph replays)

from deployfuse.ops.defs import fp8_mlp  # noqa: E402
from deployfuse.ops.defs.fp8_gemm_act import quantize_e4m3  # noqa: E402
from deployfuse.ops.schema import DOMAIN, E4M3_MAX, apply_activation, to_element_type  # noqa: E402
from deployfuse.rewrite.gemm_tuning import ACT_CODES, FP8_X_OPTION, load_library  # noqa: E402

OP = "Fp8GemmAct"
DT = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
# fast_accum=1: cuBLASLt's fast fp8 accumulation rounds the sum over K more coarsely (Hopper: partial sums not promoted
# to fp32 as often). Measured on the H200 (cuBLASLt of CUDA 13, these checks): fp16 largest rel_l2 8.2e-4 at K = 3072
# (full accumulation 2.3e-4), 3.9e-4 at K = 768; bf16 1.9e-3, its own rounding (full 1.9e-3). About 5x that in fp16.
TOL_FAST = {torch.float32: 1e-2, torch.float16: 4e-3, torch.bfloat16: TOL[torch.bfloat16]}
ONNX_TYPE = {torch.float32: onnx.TensorProto.FLOAT, torch.float16: onnx.TensorProto.FLOAT16, torch.bfloat16: onnx.TensorProto.BFLOAT16}
NOT_SUPPORTED = 801  # cudaErrorNotSupported

# (leading dims of X, K, N, activation, X off 16-byte alignment)
CHECKS = [
    ((3, 5), 32, 16, "none", False),
    ((3, 5), 32, 24, "relu", False),
    ((7,), 64, 48, "gelu_tanh", False),
    ((1,), 768, 768, "gelu_tanh", False),
    ((4, 33), 128, 264, "relu", False),
    ((2, 3, 5), 16, 40, "none", False),
    ((5,), 64, 32, "gelu_tanh", True),
    ((3,), 48, 19, "none", False),
    ((9,), 32, 33, "relu", False),
    ((6,), 40, 24, "relu", False),
    ((3, 7), 37, 19, "gelu_tanh", False),
    ((2, 5), 37, 24, "none", True),
    ((8, 128), 768, 3072, "gelu_tanh", False),
    ((8, 128), 3072, 768, "none", False),
    ((64, 197), 768, 2304, "none", False),
]
SMALL = 1 << 22  # --small: the checks of at most this many multiply-adds
# Without a bias (Bias empty: the epilogue adds none, as the output projections and FC2 of an fp8 export run), fast accumulation:
# N padded (the bias copy skipped), BERT-base's output projection, an activation without a bias
NO_BIAS_CHECKS = [((3, 5), 48, 19, "gelu_tanh", False), ((8, 128), 768, 768, "none", False), ((2, 64), 768, 3072, "relu", False)]

# Fp8Mlp: (leading dims of X, K, N1, N2, FC1's activation). Odd M; K not a multiple of 16 (X's padded float8 rows, W1's padded
# copy); N2 not a multiple of 8 (FC2's padded Y); BERT-base's MLP.
MLP_CHECKS = [
    ((7,), 64, 48, 24, "none"),
    ((3, 5), 32, 32, 19, "relu"),
    ((9,), 40, 64, 32, "gelu_tanh"),
    ((33,), 128, 256, 64, "gelu_tanh"),
    ((8, 128), 768, 3072, 768, "gelu_tanh"),
]
# Full accumulation: Y's own rounding (and a hidden value the float64 reference and the GPU's fp32 sum round to neighbouring e4m3
# values, rare). Fast accumulation's coarser sums move such hidden values often enough to count: each one a float8 step (6-12 %
# of the value), so its tolerance is wider; the largest is printed.
TOL_MLP = {torch.float16: 3e-3, torch.bfloat16: TOL[torch.bfloat16]}
TOL_MLP_FAST = {torch.float16: 3e-2, torch.bfloat16: 3e-2}
MLP_BENCH = [(f"b{batch} bert mlp", 128 * batch, 768, 3072, 768) for batch in (8, 64)]  # (name, M, K, N1, N2)

# (name, M, K, N): the GEMMs of BERT-base / GPT-2 (seq 128) and ViT-B/16 (197 tokens) at batch 8 and 64
BENCH = [(f"{tokens} {gemm}", m, k, n) for tokens, m in (("b8 bert/gpt2", 1024), ("b8 vit", 1576), ("b64 bert/gpt2", 8192), ("b64 vit", 12608))
         for gemm, (k, n) in (("qkv|o", (768, 768)), ("fc1", (768, 3072)), ("fc2", (3072, 768)), ("gpt2 c_attn", (768, 2304)))]


def with_bias(y: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """y + bias in y's dtype, or y for an empty bias (none)."""
    return y + bias.to(y.dtype) if bias.numel() else y


def pointer(t: torch.Tensor) -> int | None:
    """t's device address, or None (NULL: none) for an empty bias, as the ORT adapters pass an empty Bias."""
    return t.data_ptr() if t.numel() else None


class Problem:
    """One Fp8GemmAct call: inputs as the spec's example_inputs makes them (XScale = 0.8·amax(X)/448, so the largest
    |X| saturate; W quantized from a random weight), an output, the scratch, and the float64 reference."""

    def __init__(self, lead: tuple[int, ...], k: int, n: int, act: str, dtype: torch.dtype, device: str, misalign: bool = False,
                 fast_accum: int = 0, bias: bool = True) -> None:
        self.lead, self.m, self.n, self.k, self.act, self.dtype = lead, math.prod(lead), n, k, act, dtype
        self.fast_accum = fast_accum
        x = torch.randn(*lead, k, device=device).to(dtype)
        if misalign:  # storage one element off 16-byte alignment
            x = torch.cat([x.new_zeros(1), x.flatten()])[1:].view(x.shape)
        weight = torch.randn(n, k, device=device) / k**0.5
        self.x = x
        self.x_scale = (x.float().abs().max() * (0.8 / E4M3_MAX)).reshape(())
        self.w_scale = (weight.abs().max() / E4M3_MAX).reshape(())
        self.w = to_element_type(weight / self.w_scale, "float8e4m3fn")
        self.bias = torch.randn(n if bias else 0, device=device).to(dtype)  # empty: none (the op's Bias [0])
        self.y = torch.empty(*lead, n, device=device, dtype=dtype)

    def reference(self) -> torch.Tensor:
        xs, ws = self.x_scale.double(), self.w_scale.double()
        x_dq = quantize_e4m3(self.x, self.x_scale).double() * xs
        return apply_activation(with_bias(x_dq @ (self.w.double() * ws).T, self.bias), self.act)

    def error(self, run: Any, algo: int = -1) -> tuple[int, float, int]:
        """(return code, relative L2 error, NaN count) of one launch into a NaN-poisoned output."""
        return poisoned_error(self.y, lambda: run(self, algo), self.reference)


def rel_l2(got: torch.Tensor, ref: torch.Tensor) -> float:
    """||got - ref|| / ||ref|| (in got's and ref's dtype; ||ref|| floored at 1e-30)."""
    return float(torch.linalg.vector_norm(got - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-30))


def poisoned_error(y: torch.Tensor, launch: Any, reference: Any) -> tuple[int, float, int]:
    """(return code of launch(), rel_l2 of y against reference(), NaN count of y) with y filled with NaN before the launch."""
    y.fill_(float("nan"))
    rc = launch()
    if rc != 0:
        return rc, float("nan"), 0
    got = y.double()
    return 0, rel_l2(got, reference()), int(torch.isnan(got).sum())


def exact_problem(dtype: torch.dtype, device: str) -> Problem:
    """Y = dq(q(X)) exactly: W = the identity, WScale = 1, XScale = 1/8, Bias = 0, no activation; X holds e4m3 values,
    the midpoints between neighbours (ties to even), subnormals and their midpoints, values past 448·XScale
    (saturation), ±inf, -0 and one NaN row (a NaN reaches its whole output row through the GEMM)."""
    codes = torch.arange(256, device=device, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    finite = codes[torch.isfinite(codes)].unique()
    mids = (finite[1:] + finite[:-1]) / 2
    special = torch.tensor([460.0, 464.0, 470.0, 1e4, float("inf"), float("-inf"), -0.0, -464.0, 2.0**-10, 3 * 2.0**-10], device=device)
    values = torch.cat([finite, mids, special])
    rows = -(-values.numel() // 64) + 1
    p = Problem((rows,), 64, 64, "none", dtype, device)
    x = torch.zeros(rows * 64, device=device)
    x[: values.numel()] = values
    x = (x / 8).view(rows, 64)
    x[-1] = x[0].flip(0)
    x[-1, 7] = float("nan")
    p.x.copy_(x.to(dtype))  # fp16 / bf16 hold every value: e4m3 needs 4 significant bits, a midpoint 5 (bf16 has 8)
    p.x_scale.fill_(0.125)
    p.w_scale.fill_(1.0)
    p.w.copy_(torch.eye(64, device=device).to(torch.float8_e4m3fn))
    p.bias.zero_()
    return p


def exact_match(p: Problem, run: Any) -> tuple[bool, str]:
    """(Y = the reference rounded to T bit for bit, and the NaN row all NaN; what differs). The NaN row reaches Y
    through the GEMM's 0 · NaN products, so it is counted apart: a GPU whose fp8 MMA did not propagate NaN would
    show there, not in the quantization."""
    p.y.fill_(0.0)
    rc = run(p, -1)
    if rc != 0:
        return False, f"rc={rc}"
    ref = p.reference().to(p.dtype)
    finite = ~torch.isnan(ref[:-1]).any(dim=-1)
    mismatches = int((p.y[:-1][finite] != ref[:-1][finite]).sum())
    nan_row = bool(torch.isnan(p.y[-1]).all())
    return mismatches == 0 and nan_row, f"{mismatches} mismatches in the finite rows, NaN row {'all NaN' if nan_row else 'NOT all NaN'}"


class MlpProblem:
    """One Fp8Mlp call: inputs as the spec's example_inputs makes them (XScale and HScale at 0.8·amax / 448, so the largest
    |X| and hidden values saturate), an output, and the float64 reference of the same quantization."""

    def __init__(self, lead: tuple[int, ...], k: int, n1: int, n2: int, act: str, dtype: torch.dtype, device: str, fast_accum: int = 0,
                 empty: str = "") -> None:
        self.lead, self.m, self.k, self.n1, self.n2, self.act, self.dtype, self.fast_accum = lead, math.prod(lead), k, n1, n2, act, dtype, fast_accum

        def rand(*shape: int, scale: float = 1.0, shift: float = 0.0) -> Any:  # torch tensors for the spec's RandFn
            return (torch.randn(*shape, device=device) * scale + shift).to(dtype)

        # X, XScale, W1, W1Scale, B1, HScale, W2, ...; `empty` ("no_b1", "no_b2", both): those biases given empty (none)
        self.inputs: list[torch.Tensor] = fp8_mlp.example_inputs((*lead, k, n1, n2), rand, {"mask": empty})
        self.y = torch.empty(*lead, n2, device=device, dtype=dtype)

    def reference(self) -> torch.Tensor:
        x, xs, w1, w1s, b1, hs, w2, w2s, b2 = self.inputs
        x_dq = quantize_e4m3(x, xs).double() * xs.double()
        hidden = apply_activation(with_bias(x_dq @ (w1.double() * w1s.double()).T, b1), self.act)
        h_dq = quantize_e4m3(hidden, hs).double() * hs.double()  # from the float64 sum rounded to fp32, as the GEMM's fp32 result
        return with_bias(h_dq @ (w2.double() * w2s.double()).T, b2)

    def error(self, run: Any, algos: tuple[int, int] = (-1, -1)) -> tuple[int, float, int]:
        """(return code, relative L2 error, NaN count) of one launch with FC1's and FC2's candidates `algos` into a NaN-poisoned output."""
        return poisoned_error(self.y, lambda: run(self, algos), self.reference)


class CApi:
    """The library's Fp8GemmAct and Fp8Mlp entries on torch tensors (the process's runner: plans shared across calls), declared
    by the tuner's own `load_library` (so these checks also check its declarations), and the quantize pass alone."""

    def __init__(self, path: str) -> None:
        self.lib = load_library(path)
        P, I64, INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
        self.lib.df_fp8_quantize_e4m3.argtypes = [INT, P, P, P, P, I64, I64]
        self.scratch: dict[int, torch.Tensor] = {}  # by size

    def _scratch(self, p: Problem | MlpProblem) -> torch.Tensor:
        if isinstance(p, MlpProblem):
            bytes_ = self.lib.df_fp8_mlp_scratch_bytes(DT[p.dtype], p.m, p.k, p.n1, p.n2)
        else:
            bytes_ = self.lib.df_fp8_gemm_act_scratch_bytes(DT[p.dtype], p.m, p.n, p.k)
        if bytes_ not in self.scratch:
            self.scratch[bytes_] = torch.empty(bytes_, dtype=torch.uint8, device="cuda")
        return self.scratch[bytes_]

    def run(self, p: Problem, algo: int = -1, x: torch.Tensor | None = None, options: int = 0) -> int:
        """df_fp8_gemm_act on p (its X, or the tensor `x` with extra `options` bits: bench/skip_layer_norm_fp8_gpu.py's X given in
        float8)."""
        s = self._scratch(p)
        x = p.x if x is None else x
        return self.lib.df_fp8_gemm_act(DT[p.dtype], torch.cuda.current_stream().cuda_stream, x.data_ptr(), p.x_scale.data_ptr(), p.w.data_ptr(),
                                        p.w_scale.data_ptr(), pointer(p.bias), p.y.data_ptr(), p.m, p.n, p.k, ACT_CODES[p.act], algo,
                                        p.fast_accum | options, s.data_ptr(), s.numel())

    def run_mlp(self, p: MlpProblem, algos: tuple[int, int] = (-1, -1), x: torch.Tensor | None = None, options: int = 0,
                h_scale_inverse: torch.Tensor | None = None) -> int:
        """df_fp8_mlp on p (its X, or the tensor `x` with extra `options` bits, as `run`; 1/HScale computed by the launch, or given
        on the device as the ORT adapter keeps it for a constant HScale)."""
        s = self._scratch(p)
        x = p.inputs[0] if x is None else x
        inverse = None if h_scale_inverse is None else h_scale_inverse.data_ptr()
        return self.lib.df_fp8_mlp(DT[p.dtype], torch.cuda.current_stream().cuda_stream, x.data_ptr(), *(pointer(t) for t in p.inputs[1:]),
                                   p.y.data_ptr(), p.m, p.k, p.n1, p.n2, ACT_CODES[p.act], *algos, p.fast_accum | options, s.data_ptr(), s.numel(),
                                   inverse)

    def mlp_candidates(self, p: MlpProblem) -> tuple[int, int]:
        """FC1's and FC2's candidate counts (df_fp8_mlp_candidates); raises on an error code."""
        counts = (ctypes.c_int(), ctypes.c_int())
        rc = self.lib.df_fp8_mlp_candidates(DT[p.dtype], *(pointer(t) for t in p.inputs[1:]), p.y.data_ptr(), p.m, p.k, p.n1, p.n2, ACT_CODES[p.act],
                                            p.fast_accum, *(ctypes.byref(c) for c in counts))
        if rc != 0:
            raise RuntimeError(f"df_fp8_mlp_candidates: CUDA error {rc}")
        return counts[0].value, counts[1].value

    def candidates(self, p: Problem) -> int:
        return self.lib.df_fp8_gemm_act_candidates(DT[p.dtype], p.x_scale.data_ptr(), p.w.data_ptr(), p.w_scale.data_ptr(), pointer(p.bias),
                                                   p.y.data_ptr(), p.m, p.n, p.k, ACT_CODES[p.act], p.fast_accum)

    def quantize(self, p: Problem, q: torch.Tensor) -> int:
        """The launch's quantize pass alone: q [m, k rounded up to 16] = e4m3(X / XScale)."""
        return self.lib.df_fp8_quantize_e4m3(DT[p.dtype], torch.cuda.current_stream().cuda_stream, p.x.data_ptr(), p.x_scale.data_ptr(),
                                             q.data_ptr(), p.m, p.k)


def one_node_model(p: Problem) -> onnx.ModelProto:
    """Fp8GemmAct on input X [m, k]; XScale, W (float8e4m3fn), WScale and Bias as initializers; no function body,
    so only the custom-op library can run the node."""
    w = helper.make_tensor("W", onnx.TensorProto.FLOAT8E4M3FN, list(p.w.shape), p.w.view(torch.uint8).cpu().numpy().tobytes(), raw=True)
    inits = [numpy_helper.from_array(np.asarray(p.x_scale.cpu().numpy(), np.float32), "XScale"), w,
             numpy_helper.from_array(np.asarray(p.w_scale.cpu().numpy(), np.float32), "WScale"),
             numpy_helper.from_array(p.bias.float().cpu().numpy(), "Bias")]
    if p.dtype != torch.float32:  # Bias in T
        inits[3] = helper.make_tensor("Bias", ONNX_TYPE[p.dtype], [p.bias.numel()], p.bias.cpu().view(torch.int16).numpy().tobytes(), raw=True)
    node = helper.make_node(OP, ["X", "XScale", "W", "WScale", "Bias"], ["Y"], domain=DOMAIN, activation=p.act, fast_accum=p.fast_accum)
    graph = helper.make_graph([node], "fp8", [helper.make_tensor_value_info("X", ONNX_TYPE[p.dtype], [p.m, p.k])],
                              [helper.make_tensor_value_info("Y", ONNX_TYPE[p.dtype], [p.m, p.n])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid(DOMAIN, 1)], ir_version=10)


class OrtCpu:
    """The CPU kernel through ONNX Runtime's CPU EP (the dry run): fp32 only, so X, Bias and Y go through float32."""

    def __init__(self, library: str) -> None:
        self.library = library

    def run(self, p: Problem, algo: int = -1) -> int:
        import onnxruntime as ort

        wide = Problem.__new__(Problem)
        wide.__dict__.update(p.__dict__, dtype=torch.float32, bias=p.bias.float())
        options = ort.SessionOptions()
        options.register_custom_ops_library(self.library)
        sess = ort.InferenceSession(one_node_model(wide).SerializeToString(), options, providers=["CPUExecutionProvider"])
        y = sess.run(None, {"X": p.x.float().reshape(p.m, p.k).numpy()})[0]
        p.y.copy_(torch.from_numpy(y).view(p.y.shape).to(p.dtype))
        return 0


def mlp_node_model(p: MlpProblem, dtype: torch.dtype, algos: tuple[int, int] = (-1, -1)) -> onnx.ModelProto:
    """Fp8Mlp on input X [m, k] in `dtype` with FC1's and FC2's candidates `algos`; the other inputs as initializers (B1, B2 in
    `dtype`); no function body."""
    names = fp8_mlp.SPEC.inputs
    inits = []
    for name, t in zip(names[1:], p.inputs[1:]):
        if t.dtype == torch.float8_e4m3fn:
            inits.append(helper.make_tensor(name, onnx.TensorProto.FLOAT8E4M3FN, list(t.shape), t.view(torch.uint8).cpu().numpy().tobytes(), raw=True))
        elif t.dtype == torch.float32 or dtype == torch.float32:  # the scales (and fp32 biases)
            inits.append(numpy_helper.from_array(np.asarray(t.float().cpu().numpy(), np.float32), name))
        else:  # B1, B2 in T (16-bit)
            inits.append(helper.make_tensor(name, ONNX_TYPE[dtype], list(t.shape), t.to(dtype).cpu().view(torch.int16).numpy().tobytes(), raw=True))
    node = helper.make_node("Fp8Mlp", list(names), ["Y"], domain=DOMAIN, activation=p.act, fast_accum=p.fast_accum, algo1=algos[0], algo2=algos[1])
    graph = helper.make_graph([node], "fp8_mlp", [helper.make_tensor_value_info("X", ONNX_TYPE[dtype], [p.m, p.k])],
                              [helper.make_tensor_value_info("Y", ONNX_TYPE[dtype], [p.m, p.n2])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid(DOMAIN, 1)], ir_version=10)


def ort_cpu_mlp(library: str) -> Any:
    """Fp8Mlp's CPU kernel through ONNX Runtime's CPU EP (the dry run), in float32 as OrtCpu."""

    def run(p: MlpProblem, algos: tuple[int, int]) -> int:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.register_custom_ops_library(library)
        sess = ort.InferenceSession(mlp_node_model(p, torch.float32, algos).SerializeToString(), options, providers=["CPUExecutionProvider"])
        y = sess.run(None, {"X": p.inputs[0].float().reshape(p.m, p.k).numpy()})[0]
        p.y.copy_(torch.from_numpy(y).view(p.y.shape).to(p.dtype))
        return 0

    return run


def check_mlp(run: Any, device: str, small: bool, dtypes: tuple[torch.dtype, ...]) -> bool:
    """Fp8Mlp against its float64 reference: every MLP_CHECKS shape in each dtype, full and fast accumulation."""
    ok, worst_fast = True, dict[torch.dtype, float]()
    shapes = [c for c in MLP_CHECKS if not small or math.prod(c[0]) * c[1] * c[2] <= SMALL]
    for dtype, fast_accum, (lead, k, n1, n2, act) in itertools.product(dtypes, (0, 1), shapes):
        rc, err, nan = MlpProblem(lead, k, n1, n2, act, dtype, device, fast_accum).error(run)
        good = rc == 0 and nan == 0 and err <= (TOL_MLP_FAST if fast_accum else TOL_MLP)[dtype]
        ok &= good
        if fast_accum:
            worst_fast[dtype] = max(worst_fast.get(dtype, 0.0), err)
        print(f"{'ok  ' if good else 'FAIL'} Fp8Mlp {str(dtype)[6:]:8} X{list(lead) + [k]} N1={n1} N2={n2} {act:9} fast_accum={fast_accum} rc={rc} "
              f"rel_l2={err:.2e} nan={nan}")
    for dtype, worst in worst_fast.items():
        print(f"     Fp8Mlp {str(dtype)[6:]:8} fast_accum=1: largest rel_l2 {worst:.2e} (tolerance {TOL_MLP_FAST[dtype]:.1e})")
    no_bias = [((3, 5), 32, 32, 19, "relu", "no_b1,no_b2"), ((8, 128), 768, 3072, 768, "gelu_tanh", "no_b2")]  # FC2's bias in the norm after it
    for dtype, (lead, k, n1, n2, act, empty) in itertools.product(dtypes, [c for c in no_bias if not small or math.prod(c[0]) * c[1] * c[2] <= SMALL]):
        rc, err, nan = MlpProblem(lead, k, n1, n2, act, dtype, device, 1, empty).error(run)
        good = rc == 0 and nan == 0 and err <= TOL_MLP_FAST[dtype]
        ok &= good
        print(f"{'ok  ' if good else 'FAIL'} Fp8Mlp {str(dtype)[6:]:8} X{list(lead) + [k]} N1={n1} N2={n2} {act:9} {empty} fast_accum=1 rc={rc} "
              f"rel_l2={err:.2e} nan={nan}")
    return ok


def check_mlp_algos(run: Any, counts_of: Any, device: str, small: bool, dtypes: tuple[torch.dtype, ...]) -> bool:
    """Fp8Mlp off the heuristic's choice: each FC1 candidate with FC2's last and each FC2 candidate with FC1's last (counts_of(p):
    FC1's and FC2's candidate counts) against the float64 reference, full accumulation (TOL_MLP), BERT's MLP (--small: 128 tokens,
    256 -> 512 -> 256)."""
    ok = True
    lead, k, n1, n2 = ((2, 64), 256, 512, 256) if small else ((8, 128), 768, 3072, 768)
    for dtype in dtypes:
        p = MlpProblem(lead, k, n1, n2, "gelu_tanh", dtype, device)
        c1, c2 = counts_of(p)
        pairs = list(dict.fromkeys([*((a, c2 - 1) for a in range(c1)), *((c1 - 1, b) for b in range(c2))]))
        errs = {pair: p.error(run, pair) for pair in pairs}
        bad = {pair: e for pair, e in errs.items() if not (e[0] == 0 and e[2] == 0 and e[1] <= TOL_MLP[dtype])}
        good = c1 > 0 and c2 > 0 and not bad
        ok &= good
        worst = max((e[1] for e in errs.values()), default=float("nan"))
        print(f"{'ok  ' if good else 'FAIL'} Fp8Mlp {str(dtype)[6:]:8} {p.m}x{k}x{n1}x{n2}: {c1} FC1 and {c2} FC2 candidates, {len(pairs)} (algo1, algo2) "
              f"pairs, max rel_l2={worst:.2e} (TOL_MLP {TOL_MLP[dtype]:g}){f'; failing (rc, rel_l2, nan): {bad}' if bad else ''}")
    return ok


def check(run: Any, device: str, small: bool, dtypes: tuple[torch.dtype, ...]) -> bool:
    """The checks every backend passes: the CUDA launcher through the C ABI, the CPU kernel in the dry run (which
    ignores fast_accum: it accumulates in fp32 either way)."""
    ok = True
    shapes = [c for c in CHECKS if not small or math.prod(c[0]) * c[1] * c[2] <= SMALL]
    worst_fast: dict[torch.dtype, float] = {}
    for dtype, fast_accum, (lead, k, n, act, misalign) in itertools.product(dtypes, (0, 1), shapes):
        rc, err, nan = Problem(lead, k, n, act, dtype, device, misalign, fast_accum).error(run)
        name = f"{str(dtype)[6:]:8} X{list(lead) + [k]} N={n} {act:9}"
        good = rc == 0 and nan == 0 and err <= (TOL_FAST if fast_accum else TOL)[dtype]
        ok &= good
        if fast_accum:
            worst_fast[dtype] = max(worst_fast.get(dtype, 0.0), err)
        print(f"{'ok  ' if good else 'FAIL'} {name} misaligned={int(misalign)} fast_accum={fast_accum} rc={rc} rel_l2={err:.2e} nan={nan}")
    for dtype, worst in worst_fast.items():
        print(f"     {str(dtype)[6:]:8} fast_accum=1: largest rel_l2 {worst:.2e} (tolerance {TOL_FAST[dtype]:.1e}; full accumulation {TOL[dtype]:.1e})")
    for dtype, (lead, k, n, act, misalign) in itertools.product(dtypes, [c for c in NO_BIAS_CHECKS if not small or math.prod(c[0]) * c[1] * c[2] <= SMALL]):
        rc, err, nan = Problem(lead, k, n, act, dtype, device, misalign, 1, bias=False).error(run)
        good = rc == 0 and nan == 0 and err <= TOL_FAST[dtype]
        ok &= good
        print(f"{'ok  ' if good else 'FAIL'} {str(dtype)[6:]:8} X{list(lead) + [k]} N={n} {act:9} no bias, fast_accum=1 rc={rc} rel_l2={err:.2e} nan={nan}")
    for dtype in dtypes:
        same, what = exact_match(exact_problem(dtype, device), run)
        ok &= same
        print(f"{'ok  ' if same else 'FAIL'} {str(dtype)[6:]:8} quantization bit for bit (ties, subnormals, saturation, inf, NaN): {what}")
    return ok


def check_quantize_entry(api: CApi) -> bool:
    """df_fp8_quantize_e4m3 (the timing table's quantize column) writes the spec's e4m3 bytes, zeros past K: the
    vectorised kernel (K = 64) and the row kernel (K = 40, rows of 48 bytes)."""
    ok = True
    for dtype, k in itertools.product((torch.float16, torch.bfloat16), (64, 40)):
        p = Problem((37,), k, 16, "none", dtype, "cuda")
        p.x_scale.fill_(2.0**-6)  # a power of two: x / s = x · (1/s) exactly, so the kernel's reciprocal cannot differ at a tie
        q = torch.full((p.m, -(-k // 16) * 16), 0x7F, dtype=torch.uint8, device="cuda")  # NaN codes: every byte must be written
        rc = api.quantize(p, q)
        torch.cuda.synchronize()
        want = quantize_e4m3(p.x, p.x_scale).to(torch.float8_e4m3fn).view(torch.uint8).reshape(p.m, k)
        good = rc == 0 and torch.equal(q[:, :k], want) and not q[:, k:].any()
        ok &= good
        print(f"{'ok  ' if good else 'FAIL'} {str(dtype)[6:]:8} df_fp8_quantize_e4m3 X[{p.m}, {k}]: rc={rc}, bytes {'equal' if good else 'DIFFER'}")
    return ok


def replay_equals_eager(launch: Any, y: torch.Tensor) -> bool:
    """A CUDA graph captured from launch() (its plan made before), replayed into a NaN-poisoned y, writes what an eager launch does."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # captured, not run
        launch()
    launch()
    eager = y.clone()
    y.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    return bool(torch.equal(y, eager))


def check_gpu(api: CApi, small: bool) -> bool:
    ok = check(api.run, "cuda", small, (torch.float16, torch.bfloat16))
    ok &= check_quantize_entry(api)
    for dtype in (torch.float16, torch.bfloat16):
        lead, k, n = ((2, 64), 256, 256) if small else ((8, 128), 768, 768)
        p = Problem(lead, k, n, "gelu_tanh", dtype, "cuda")
        count = api.candidates(p)
        errs = [p.error(api.run, a) for a in range(max(count, 0))]
        good = count > 0 and all(rc == 0 and nan == 0 and e <= TOL[dtype] for rc, e, nan in errs)
        ok &= good
        worst = max((e for _, e, _ in errs), default=float("nan"))
        print(f"{'ok  ' if good else 'FAIL'} {str(dtype)[6:]:8} every candidate of {p.m}x{k}x{n} gelu_tanh: {count} candidates, max rel_l2={worst:.2e}")
        same = replay_equals_eager(lambda p=p: api.run(p), p.y)  # the plan exists already (the candidates above)
        ok &= same
        print(f"{'ok  ' if same else 'FAIL'} {str(dtype)[6:]:8} CUDA-graph capture (quantize + GEMM) and replay = eager launch")
    ok &= check_mlp_gpu(api, small)
    p = Problem((64,), 256, 128, "relu", torch.float32, "cuda")
    rc, err, nan = p.error(api.run)
    if rc == 0:
        good = nan == 0 and err <= TOL[torch.float32]
        ok &= good
        print(f"{'ok  ' if good else 'FAIL'} float32  cuBLASLt takes fp32 output with an fp32 bias: rel_l2={err:.2e}")
    else:  # not a failure: ONNX Runtime's CUDA EP does not take the op in fp32 (fp8_gemm_act_ort.h takes_on_cuda)
        why = "cudaErrorNotSupported, as documented: fp32 output wants a bf16 bias" if rc == NOT_SUPPORTED else "not cudaErrorNotSupported: look"
        print(f"n/a  float32  cuBLASLt refused fp32 output with an fp32 bias: rc={rc} ({why})")
    return ok


def check_tuning(api: CApi, library: str, small: bool) -> bool:
    """deployfuse.rewrite.gemm_tuning on this GPU as `--autotune` runs it on an fp8 export: one-node fp16 models of BERT's FC1
    (Fp8GemmAct) and of BERT's MLP (Fp8Mlp, FC1 -> FC2) at 8x128 tokens (tanh GELU, fast accumulation: the ops' default), each
    problem found, its settings timed, the node's algorithm attributes set where a setting beat the heuristic's choice; that
    setting's output equals the reference and the heuristic's output within TOL_FAST (Fp8Mlp: TOL_MLP_FAST)."""
    from deployfuse.rewrite.gemm_tuning import Fp8GemmProblem, Fp8MlpProblem

    fp16, lead, k, n, n2 = onnx.TensorProto.FLOAT16, *(((2, 64), 256, 512, 256) if small else ((8, 128), 768, 3072, 768))
    p = Problem(lead, k, n, "gelu_tanh", torch.float16, "cuda", fast_accum=1)
    ok = tuned_node_check(one_node_model(p), p.x.reshape(p.m, p.k), Fp8GemmProblem(p.m, n, k, fp16, "gelu_tanh", 1), library,
                          lambda algos: p.error(api.run, *algos), p.y, TOL_FAST[torch.float16])
    q = MlpProblem(lead, k, n, n2, "gelu_tanh", torch.float16, "cuda", 1)
    ok &= tuned_node_check(mlp_node_model(q, torch.float16), q.inputs[0].reshape(q.m, q.k), Fp8MlpProblem(q.m, k, n, n2, fp16, "gelu_tanh", 1), library,
                           lambda algos: q.error(api.run_mlp, algos), q.y, TOL_MLP_FAST[torch.float16])
    return ok


def tuned_node_check(model: onnx.ModelProto, x: torch.Tensor, want: Any, library: str, error: Any, y: torch.Tensor, tol: float) -> bool:
    """gemm_tuning.tune on a one-node model with input X: it finds `want`, says it tuned, and the stored setting (error(algos):
    (rc, rel_l2 against the reference, NaN count) of a launch into y) is as accurate as the heuristic's and close to its output."""
    from deployfuse.ops import attach_functions
    from deployfuse.rewrite.gemm_tuning import gemm_problems, tune

    attach_functions(model)  # the problem comes from a CPU run of the function body
    feed = {"X": x.cpu().numpy()}
    found = gemm_problems(model, feed)
    ok = found == {"Y": want}
    print(f"{'ok  ' if ok else 'FAIL'} float16  tuning finds the {want.op_type} problem: {found}")
    line = tune(model, feed, Path(library))
    algos = tuple(next((helper.get_attribute_value(a) for a in model.graph.node[0].attribute if a.name == name), -1) for name in want.algo_attrs)
    good = "algorithms tuned on" in line
    ok &= good
    print(f"{'ok  ' if good else 'FAIL'} float16  {line}; stored {dict(zip(want.algo_attrs, algos))}")
    outputs = []
    for choice in ((-1,) * len(algos), algos):
        rc, err, nan = error(choice)
        outputs.append(y.double().clone())
        good = rc == 0 and nan == 0 and err <= tol
        ok &= good
        print(f"{'ok  ' if good else 'FAIL'} float16  {want.op_type} {choice}: rc={rc} rel_l2={err:.2e} (tolerance {tol:g})")
    apart = rel_l2(outputs[1], outputs[0])
    good = apart <= tol
    ok &= good
    print(f"{'ok  ' if good else 'FAIL'} float16  the tuned {want.op_type} setting's output against the heuristic's: rel_l2={apart:.2e}")
    return ok


def check_mlp_gpu(api: CApi, small: bool) -> bool:
    """Fp8Mlp through the C ABI: the reference checks, N1 not a multiple of 16 refused, a CUDA-graph replay = the eager launch."""
    ok = check_mlp(api.run_mlp, "cuda", small, (torch.float16, torch.bfloat16))
    ok &= check_mlp_algos(api.run_mlp, api.mlp_candidates, "cuda", small, (torch.float16, torch.bfloat16))
    rc = api.run_mlp(MlpProblem((5,), 32, 40, 16, "relu", torch.float16, "cuda"))
    refused = rc == NOT_SUPPORTED
    ok &= refused
    print(f"{'ok  ' if refused else 'FAIL'} Fp8Mlp N1=40 (not a multiple of 16): rc={rc} (want cudaErrorNotSupported)")
    for dtype in (torch.float16, torch.bfloat16):
        p = MlpProblem((2, 64) if small else (8, 128), 256 if small else 768, 512 if small else 3072, 256 if small else 768, "gelu_tanh", dtype, "cuda", 1)
        api.run_mlp(p)  # the plans and the scratch exist before the capture
        torch.cuda.synchronize()
        same = replay_equals_eager(lambda p=p: api.run_mlp(p), p.y)
        ok &= same
        print(f"{'ok  ' if same else 'FAIL'} Fp8Mlp {str(dtype)[6:]:8} CUDA-graph capture (quantize + FC1 to float8 + FC2) and replay = eager launch")
    return ok & check_mlp_h_scale_inverse(api, small)


RECIPROCAL_KERNEL = "reciprocal_kernel"
"""fp8_mlp.cu's one-thread kernel writing 1/HScale (X given in float8, no h_scale_inverse; once per constant HScale in ORT)."""


def cuda_kernels(launch: Any) -> list[str]:
    """The names of the CUDA kernels launch() runs, as torch's profiler records them (CUPTI: every kernel of the process, those of
    this library and of ONNX Runtime included)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        launch()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset"))]


def ieee_inverse(scale: torch.Tensor) -> torch.Tensor:
    """1 / scale in float32 rounded to nearest (numpy's IEEE division, as CUDA's `1.f / s` without fast math), on scale's device."""
    return torch.from_numpy(np.asarray(np.float32(1) / scale.cpu().numpy().astype(np.float32), np.float32)).to(scale.device)


def mlp_launch_with_h_scale(api: CApi, p: MlpProblem, x: torch.Tensor, options: int, inverse: torch.Tensor | None) -> tuple[int, int, torch.Tensor]:
    """(return code, reciprocal kernels launched, Y) of one df_fp8_mlp launch into a NaN-poisoned Y, 1/HScale `inverse` or computed."""
    rc = [-1]

    def launch() -> None:
        rc[0] = api.run_mlp(p, x=x, options=options, h_scale_inverse=inverse)

    p.y.fill_(float("nan"))
    reciprocals = sum(RECIPROCAL_KERNEL in name for name in cuda_kernels(launch))
    return rc[0], reciprocals, p.y.clone()


def check_mlp_h_scale_inverse(api: CApi, small: bool) -> bool:
    """Fp8Mlp with 1/HScale given (h_scale_inverse, as the ORT adapter keeps it for a constant HScale) against the launch computing
    it: Y bit for bit, X in T and given in float8, fp16 and bf16; the launch runs the reciprocal kernel only with X in float8 and
    nothing given; a CUDA-graph replay with it given = the eager launch."""
    ok = True
    lead, k, n1, n2 = ((2, 64), 256, 512, 256) if small else ((8, 128), 768, 3072, 768)
    for dtype, x_fp8 in itertools.product((torch.float16, torch.bfloat16), (0, 1)):
        p = MlpProblem(lead, k, n1, n2, "gelu_tanh", dtype, "cuda", 1)
        x = quantize_e4m3(p.inputs[0], p.inputs[1]).to(torch.float8_e4m3fn) if x_fp8 else p.inputs[0]
        options, inverse = FP8_X_OPTION if x_fp8 else 0, ieee_inverse(p.inputs[5])
        rc_computed, computed_reciprocals, computed = mlp_launch_with_h_scale(api, p, x, options, None)
        rc_given, given_reciprocals, given = mlp_launch_with_h_scale(api, p, x, options, inverse)
        same = bool(torch.equal(given, computed)) and not bool(torch.isnan(given).any())
        replay = replay_equals_eager(lambda p=p, x=x, o=options, i=inverse: api.run_mlp(p, x=x, options=o, h_scale_inverse=i), p.y)
        good = rc_computed == rc_given == 0 and same and (computed_reciprocals, given_reciprocals) == (x_fp8, 0) and replay
        ok &= good
        print(f"{'ok  ' if good else 'FAIL'} Fp8Mlp {str(dtype)[6:]:8} X in {'float8' if x_fp8 else 'T     '} 1/HScale given = computed bit for bit: "
              f"{same} (rc {rc_computed}, {rc_given}); reciprocal kernels computed {computed_reciprocals} (want {x_fp8}), given "
              f"{given_reciprocals} (want 0); CUDA-graph replay with it given = eager: {replay}")
    return ok


def ort_cuda_output(library: str, model: onnx.ModelProto, x: torch.Tensor, n: int, graph: str) -> torch.Tensor:
    """Y [m, n] of a one-node fp16 model run on ONNX Runtime's CUDA EP with the library, X bound on the device; graph "1": with
    ORT's CUDA graph (which ORT refuses unless every node is on the CUDA EP), captured by the first runs, replayed by the last."""
    import onnxruntime as ort

    y = torch.full((x.shape[0], n), float("nan"), device="cuda", dtype=torch.float16)
    options = ort.SessionOptions()
    options.register_custom_ops_library(library)
    cuda = {"enable_cuda_graph": graph, "user_compute_stream": str(torch.cuda.current_stream().cuda_stream), "has_user_compute_stream": "1"}
    sess = ort.InferenceSession(model.SerializeToString(), options, providers=[("CUDAExecutionProvider", cuda)])
    binding = sess.io_binding()
    binding.bind_input("X", "cuda", 0, np.float16, tuple(x.shape), x.data_ptr())
    binding.bind_output("Y", "cuda", 0, np.float16, tuple(y.shape), y.data_ptr())
    for _ in range(3):
        sess.run_with_iobinding(binding)
    torch.cuda.synchronize()
    return y


def check_ort(library: str) -> bool:
    """Through ONNX Runtime's CUDA EP with the library (fp16; a bf16 X has no numpy type to bind), plain and with ORT's
    CUDA graph: the output against the reference, and the CUDA graph's run against a plain run on the same inputs (the same bits:
    a replay computes what the launch does). X[37, 64] N=24 with the graph failed at rel_l2 3.97e-3 on one draw, its plain run
    the same bits: the quantize pass's x · (1/s), not the graph; with x / s it measures 2.04e-4 (h200_quant.md sections 13, 15)."""
    ok = True
    cases = (((8, 128), 768, 3072, "gelu_tanh", True), ((37,), 64, 24, "relu", True), ((8, 128), 768, 768, "none", False))  # last: no bias
    for (lead, k, n, act, bias), graph in itertools.product(cases, ("0", "1")):
        p = Problem(lead, k, n, act, torch.float16, "cuda", bias=bias)
        model, x = one_node_model(p), p.x.reshape(p.m, p.k)
        y = ort_cuda_output(library, model, x, p.n, graph)
        ref = p.reference().reshape(p.m, p.n)
        err = rel_l2(y.double(), ref)
        good = not torch.isnan(y).any() and err <= TOL[torch.float16]
        same = ""
        if graph == "1":  # no new draw: the cases' random inputs stay those of the earlier logs
            equal = torch.equal(y, ort_cuda_output(library, model, x, p.n, "0"))
            good &= equal
            same = f", = a plain run on the same inputs bit for bit: {equal}"
        ok &= good
        print(f"{'ok  ' if good else 'FAIL'} ORT CUDA EP{' + CUDA graph' if graph == '1' else ''}, fp16 X{list(lead) + [k]} N={n} {act}"
              f"{'' if bias else ' (Bias empty)'}: rel_l2={err:.2e}{same}")
    return ok


def check_ort_mlp(library: str) -> bool:
    """Fp8Mlp through ONNX Runtime's CUDA EP with the library (fp16), plain and with ORT's CUDA graph, against the reference."""
    ok = True
    cases = (((8, 128), 768, 3072, 768, "gelu_tanh", ""), ((37,), 64, 48, 24, "relu", ""), ((8, 128), 768, 3072, 768, "gelu_tanh", "no_b2"))
    for (lead, k, n1, n2, act, empty), graph in itertools.product(cases, ("0", "1")):
        p = MlpProblem(lead, k, n1, n2, act, torch.float16, "cuda", empty=empty)
        y = ort_cuda_output(library, mlp_node_model(p, torch.float16), p.inputs[0].reshape(p.m, p.k), p.n2, graph)
        ref = p.reference().reshape(p.m, p.n2)
        err = rel_l2(y.double(), ref)
        good = not torch.isnan(y).any() and err <= TOL_MLP[torch.float16]
        ok &= good
        print(f"{'ok  ' if good else 'FAIL'} ORT CUDA EP{' + CUDA graph' if graph == '1' else ''}, Fp8Mlp fp16 X{list(lead) + [k]} N1={n1} N2={n2} {act} {empty}: "
              f"rel_l2={err:.2e}")
    return ok & check_ort_mlp_constant_h_scale(library)


def mlp_fp8_x_models(p: MlpProblem) -> dict[str, onnx.ModelProto]:
    """Fp8Mlp on input X in float8e4m3fn [m, k] (fp16 B1, B2 and Y), its other inputs initializers ("constant"), or HScale a graph
    input too ("fed")."""
    constant = mlp_node_model(p, torch.float16)
    constant.graph.input[0].type.tensor_type.elem_type = onnx.TensorProto.FLOAT8E4M3FN
    fed = onnx.ModelProto.FromString(constant.SerializeToString())
    h_scale = next(t for t in fed.graph.initializer if t.name == "HScale")
    fed.graph.input.append(helper.make_tensor_value_info("HScale", h_scale.data_type, list(h_scale.dims)))
    fed.graph.initializer.remove(h_scale)
    return {"constant": constant, "fed": fed}


def check_ort_mlp_constant_h_scale(library: str, runs: int = 3) -> bool:
    """Fp8Mlp fed X in float8 through ONNX Runtime's CUDA EP, HScale a constant initializer (as every fp8 export writes it) and
    HScale fed: the same Y bit for bit, within TOL_MLP_FAST of the reference, and over `runs` runs the fed node launches the
    reciprocal kernel each run, the constant one once (its first run keeps 1/HScale on the device)."""
    import onnxruntime as ort

    p = MlpProblem((8, 128), 768, 3072, 768, "gelu_tanh", torch.float16, "cuda", 1)
    xq = quantize_e4m3(p.inputs[0], p.inputs[1]).to(torch.float8_e4m3fn).reshape(p.m, p.k)
    x = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(xq.view(torch.uint8).cpu().numpy(), onnx.TensorProto.FLOAT8E4M3FN)
    options = ort.SessionOptions()
    options.register_custom_ops_library(library)
    ys, reciprocals = {}, {}
    for name, model in mlp_fp8_x_models(p).items():
        sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CUDAExecutionProvider"])
        feed = {"X": x, **({"HScale": p.inputs[5].cpu().numpy()} if name == "fed" else {})}

        def launch(sess: Any = sess, feed: dict[str, Any] = feed, name: str = name) -> None:
            for _ in range(runs):
                ys[name] = sess.run(None, feed)[0]

        reciprocals[name] = sum(RECIPROCAL_KERNEL in kernel for kernel in cuda_kernels(launch))
    same = bool(np.array_equal(ys["constant"], ys["fed"]))
    err = rel_l2(torch.from_numpy(ys["constant"].astype(np.float64)), p.reference().reshape(p.m, p.n2).cpu())
    good = same and err <= TOL_MLP_FAST[torch.float16] and reciprocals == {"constant": 1, "fed": runs}
    print(f"{'ok  ' if good else 'FAIL'} ORT CUDA EP, Fp8Mlp fp16 X in float8, HScale constant = fed bit for bit: {same}, rel_l2={err:.2e}; "
          f"reciprocal kernels in {runs} runs: constant {reciprocals['constant']} (want 1), fed {reciprocals['fed']} (want {runs})")
    return good


def fastest(api: CApi, p: Problem) -> tuple[float, float, int, int]:
    """(heuristic ms, fastest candidate's ms, its index, candidates) of Fp8GemmAct on p at p.fast_accum."""
    count = api.candidates(p)
    if count <= 0:
        raise RuntimeError(f"refused (rc {-count}) at fast_accum={p.fast_accum}")
    per_algo = [gpu_ms(lambda a=a: api.run(p, a)) for a in range(count)]
    best = min(range(count), key=per_algo.__getitem__)
    return gpu_ms(lambda: api.run(p, -1)), per_algo[best], best, count


def bench_row(api: CApi, name: str, m: int, k: int, n: int) -> str:
    """One table row: the alternatives, the quantize pass alone and Fp8GemmAct (heuristic, every candidate; full and
    fast accumulation) on one fp16 problem; the ratios at the heuristic's choice, as torch's are."""
    p = Problem((m,), k, n, "none", torch.float16, "cuda")
    w16 = (p.w.float() * p.w_scale).to(torch.float16).t()
    xq = quantize_e4m3(p.x, p.x_scale).to(torch.float8_e4m3fn)
    wt = p.w.t()  # column-major [K, N], as _scaled_mm wants its second operand

    def scaled_mm(a: torch.Tensor) -> torch.Tensor:
        return torch._scaled_mm(a, wt, scale_a=p.x_scale, scale_b=p.w_scale, bias=p.bias, out_dtype=torch.float16)

    def quantize_then_scaled_mm() -> torch.Tensor:
        return scaled_mm((p.x / p.x_scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn))

    fp16 = gpu_ms(lambda: torch.addmm(p.bias, p.x, w16))
    pre = gpu_ms(lambda: scaled_mm(xq))
    fast = gpu_ms(lambda: torch._scaled_mm(xq, wt, scale_a=p.x_scale, scale_b=p.w_scale, bias=p.bias, out_dtype=torch.float16, use_fast_accum=True))
    quant = gpu_ms(quantize_then_scaled_mm)
    q = torch.empty(m, -(-k // 16) * 16, dtype=torch.uint8, device="cuda")
    alone = gpu_ms(lambda: api.quantize(p, q))
    tbps = (p.x.numel() * p.x.element_size() + q.numel()) / (alone * 1e-3) / 1e12
    heuristic, best_ms, best, count = fastest(api, p)
    p.fast_accum = 1
    fast_heuristic, fast_ms, fast_best, _ = fastest(api, p)
    return (f"| {name} | {m}x{k}x{n} | {fp16:.4f} | {pre:.4f} | {fast:.4f} | {quant:.4f} | {alone:.4f} ({tbps:.1f} TB/s) | {heuristic:.4f} | "
            f"{best_ms:.4f} ({best}) | {fast_heuristic:.4f} | {fast_ms:.4f} ({fast_best}) | {count} | {heuristic / fp16:.2f} | "
            f"{fast_heuristic / fp16:.2f} |")


def bench(api: CApi) -> None:
    print("\nfp16, GPU ms per call (CUDA events around CUDA-graph replays); fp8/fp16 = Fp8GemmAct at the heuristic's choice (algo=-1, "
          "as exported) / torch fp16 addmm, full and fast accumulation; best (algo): the fastest candidate, a what-if; quantize alone: "
          "Fp8GemmAct's quantize kernel (TB/s: fp16 X read + fp8 copy written)")
    print("| GEMM | M x K x N | torch fp16 addmm | _scaled_mm (X in fp8) | _scaled_mm fast accum | torch quantize + _scaled_mm | "
          "Fp8GemmAct quantize alone | Fp8GemmAct heuristic | Fp8GemmAct best (algo) | Fp8GemmAct fast accum heuristic | "
          f"Fp8GemmAct fast accum best (algo) | candidates | fp8/fp16 | fp8 fast/fp16 |\n|{'---|' * 14}")
    for name, m, k, n in BENCH:
        try:
            print(bench_row(api, name, m, k, n))
        except Exception as exc:  # noqa: BLE001 (one failed row does not cost the others)
            print(f"| {name} | {m}x{k}x{n} | FAILED: {str(exc).splitlines()[0][:200]} |")


def bench_mlp(api: CApi) -> None:
    """Fp8Mlp against its two Fp8GemmAct calls (FC1 with GELU writing H in fp16, FC2 quantizing it again), fp16, both at the
    heuristic's choice and the op's default fast accumulation."""
    print("\nFp8Mlp vs 2 x Fp8GemmAct (fp16, gelu_tanh FC1, fast_accum=1, GPU ms per call from CUDA-graph replays)")
    print("| MLP | M x K x N1 x N2 | 2 x Fp8GemmAct | Fp8Mlp | Fp8Mlp / pair |\n|---|---|---|---|---|")
    for name, m, k, n1, n2 in MLP_BENCH:
        try:
            p = MlpProblem((m,), k, n1, n2, "gelu_tanh", torch.float16, "cuda", 1)
            x, xs, w1, w1s, b1, hs, w2, w2s, b2 = p.inputs
            fc1, fc2 = Problem.__new__(Problem), Problem.__new__(Problem)
            fc1.__dict__.update(lead=(m,), m=m, n=n1, k=k, act="gelu_tanh", dtype=torch.float16, fast_accum=1, x=x, x_scale=xs, w=w1, w_scale=w1s, bias=b1,
                                y=torch.empty(m, n1, device="cuda", dtype=torch.float16))
            fc2.__dict__.update(lead=(m,), m=m, n=n2, k=n1, act="none", dtype=torch.float16, fast_accum=1, x=fc1.y, x_scale=hs, w=w2, w_scale=w2s, bias=b2,
                                y=p.y)
            pair = gpu_ms(lambda fc1=fc1, fc2=fc2: (api.run(fc1), api.run(fc2)))
            merged = gpu_ms(lambda p=p: api.run_mlp(p))
            print(f"| {name} | {m}x{k}x{n1}x{n2} | {pair:.4f} | {merged:.4f} | {merged / pair:.2f} |")
        except Exception as exc:  # noqa: BLE001 (one failed row does not cost the others)
            print(f"| {name} | {m}x{k}x{n1}x{n2} | FAILED: {str(exc).splitlines()[0][:200]} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="Exit status: 0 when every check passes, 1 otherwise, 2 for bad arguments.")
    ap.add_argument("lib", nargs="?", help="libdeployfuse_ops_cuda.so (plugins/build/gpu, built by bench/fp8_gemm_gpu.sh)")
    ap.add_argument("--ort", metavar="LIB", help="libdeployfuse_ort.so: also check the op through ORT's CUDA EP (onnxruntime-gpu importable)")
    for flag, text in (("--check-only", "no timings"), ("--small", "only the small checks (for compute-sanitizer)"),
                       ("--dry-run", "no GPU: run the checks through the CPU kernel (ORT CPU EP; builds the CPU library of this checkout)")):
        ap.add_argument(flag, action="store_true", help=text)
    args = ap.parse_args()
    if not args.lib and not args.dry_run:
        ap.error("give the library (plugins/build/gpu/libdeployfuse_ops_cuda.so) or --dry-run")
    torch.manual_seed(0)
    if args.dry_run:
        from deployfuse.ops.native import build_plugins

        library = build_plugins(cuda=False) / "libdeployfuse_ort.so"  # this checkout's sources (an up-to-date build is a no-op)
        ok = check(OrtCpu(str(library)).run, "cpu", True, (torch.float16, torch.bfloat16))
        ok &= check_mlp(ort_cpu_mlp(str(library)), "cpu", True, (torch.float16, torch.bfloat16))
        ok &= check_mlp_algos(ort_cpu_mlp(str(library)), lambda p: (3, 2), "cpu", True, (torch.float16,))  # the kernel reads, then ignores them
        print("dry run (CPU kernel): " + ("all checks passed" if ok else "SOME CHECKS FAILED"))
        return 0 if ok else 1
    api = CApi(args.lib)
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    ok = True
    norm_tol = {"Fp8GemmAct": TOL_FAST[torch.float16], "Fp8Mlp": TOL_MLP_FAST[torch.float16]}  # the readers' default fast accumulation
    for stage in (lambda: check_gpu(api, args.small), lambda: check_tuning(api, args.lib, args.small), lambda: check_ort(args.ort) if args.ort else True,
                  lambda: check_ort_mlp(args.ort) if args.ort else True, lambda: norm_gpu.check_norm(api.lib, args.small),
                  lambda: norm_gpu.check_fp8_x(api, Problem, MlpProblem, (TOL, TOL_FAST), TOL_MLP_FAST), lambda: norm_gpu.check_ort(args.ort, norm_tol) if args.ort else True):
        try:
            ok &= stage()
        except Exception:  # noqa: BLE001 (reported whole, and the later stages still run)
            ok = False
            print("FAIL: a check raised")
            traceback.print_exc(file=sys.stdout)
    if not args.check_only:
        bench(api)
        bench_mlp(api)
        norm_gpu.bench(api.lib, args.ort, gpu_ms)
    print("all checks passed" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
