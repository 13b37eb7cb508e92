"""Fp8GemmAct: Y = act(dq(q(X, XScale)) @ dq(W, WScale)^T + Bias), a float8 GEMM that quantizes its
activations itself and fuses its epilogue (cuBLASLt fp8 on CUDA).

    q(x, s)  = saturate_e4m3(round_nearest_even(x / s))   (QuantizeLinear(x, s, float8e4m3fn zero), saturate=1)
    dq(v, s) = float(v) * s

X [..., K] in T; XScale, WScale float32 scalars (per tensor; XScale calibrated as amax/448 rounded up to a power of two);
W float8e4m3fn [N, K], the weight quantized offline and stored transposed (row n = output column
n: cuBLASLt's fp8 GEMM wants A transposed, "TN"); Bias [N] in T, or [0] for none (a GEMM whose bias a norm took:
an epilogue adding zeros costs cuBLASLt's fp8 kernels 9-15 % at BERT-base's shapes for 1024 tokens on an H100,
bench/results/h200_quant.md section 13; the empty tensor still gives T); Y [..., N] in T. The math is
float32 throughout (x / s, the products, the accumulation, bias and activation), rounded to T once.
X may instead come in float8e4m3fn, already q(X, XScale) (a SkipLayerNormFp8's YQ, `rules.fp8_norm`): no
quantize pass, XScale still its scale, T then Bias's (`quantize_divisor`; `reference` takes dq(q(X)) then).

fast_accum (default 1, as torchao's float8 and torch._scaled_mm(use_fast_accum=True)) lets the CUDA GEMM
use cuBLASLt's fast accumulation (CUBLASLT_MATMUL_DESC_FAST_ACCUM): Hopper's fp8 tensor cores keep the
partial sums in a narrower accumulator and promote them to fp32 less often, which rounds the sum over K
more coarsely (bench/results/fp8_gemm_h200.log: an fp16 Y 8e-4 off the reference in relative L2
at K = 3072 instead of 2e-4; 7-18 % less time per GEMM at batch 64, 3-20 % at batch 8, each at its
fastest candidate). It changes that rounding only, never the math the reference computes; the
reference, the function body and the CPU kernel ignore it (exact fp32).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import onnx
import onnxscript
import torch
from onnxscript.onnx_types import FLOAT, FLOAT8E4M3FN

from deployfuse.ops.body import Body
from deployfuse.ops.defs import gemm_act
from deployfuse.ops.defs._onnxscript import DF, TFloat
from deployfuse.ops.schema import E4M3_MAX, Attr, OpSpec, RandFn, apply_activation, case_flags, to_element_type


def quantize_e4m3(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """q(x, s) as float32 values: x / s in float32, saturated and rounded to nearest even
    float8e4m3fn (`to_element_type`)."""
    return to_element_type(x.float() / scale.float(), "float8e4m3fn").float()


def reference(
    x: torch.Tensor, x_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor, *, activation: str, algo: int, fast_accum: int = 1
) -> torch.Tensor:
    """Y = act(dq(q(X, XScale)) @ dq(W, WScale)^T + Bias); W [N, K] holds float8 values (as any
    float dtype); `algo` and `fast_accum` only pick the kernel and its rounding, never the math."""
    xs, ws = x_scale.float().reshape(()), w_scale.float().reshape(())
    x_dq = quantize_e4m3(x, xs) * xs
    w_dq = w.float() * ws
    y = x_dq @ w_dq.T
    return apply_activation(y + bias.float() if bias.numel() else y, activation)


def body(b: Body, variant: dict[str, Any]) -> str:
    """In float32 around T (Cast in, CastLike out), as the reference and the CUDA kernel: Q/DQ +
    MatMul in float16 (scales CastLike X) put a [8, 64, 768] @ [768, 96] float16 result 3e-3
    (relative L2) off the reference, 1e-5 here.

    The rounding to float8 is a Cast (saturate=1, round to nearest even), not QuantizeLinear /
    DequantizeLinear: ONNX Runtime's CPU optimizer turns an inlined DQ -> MatMul into its integer
    kernels (ORT 1.31: MatMulIntegerToFloat fed float8, an invalid graph; 1.32: a uint8
    QuantizeLinear inserted past a Reshape), and ONNX Runtime has no bfloat16 QuantizeLinear.
    Y takes T from Bias, X being T or already float8 (`quantize_divisor`)."""
    y = gemm_float(b, b.to_float("X"), "XScale", "W", "WScale", "Bias", variant["activation"], quantize_divisor(b, "X", "XScale"))
    return b.op("CastLike", y, "Bias")


def quantize_divisor(b: Body, x: str, x_scale: str) -> str:
    """What q divides X by: XScale for an X in T, 1 for an X already in float8e4m3fn (q(X) = X: e.g. a SkipLayerNormFp8's
    YQ, XScale still its scale). One body for both: the element type is probed by a saturating CastLike of 1000 to
    X's type, which float8e4m3fn alone saturates to 448 (float16, bfloat16 and float32 hold 1000 exactly)."""
    probe = b.op("Cast", b.op("CastLike", b.op("Constant", value_float=1000.0), x, saturate=1), to=onnx.TensorProto.FLOAT)
    is_fp8 = b.op("Less", probe, b.op("Constant", value_float=500.0))
    return b.op("Where", is_fp8, b.op("Constant", value_float=1.0), x_scale)


def gemm_float(b: Body, x: str, x_scale: str, w: str, w_scale: str, bias: str, activation: str, x_divisor: str | None = None) -> str:
    """act(dq(q(x, x_scale)) @ dq(w, w_scale)^T + bias) in float32, x already float32 (the body's
    pieces, which Fp8Mlp chains: its hidden activation quantized from float32, never rounded to T).
    x_divisor: what x is divided by before the rounding to float8 (`quantize_divisor`; x_scale by default)."""
    f8, f32 = onnx.TensorProto.FLOAT8E4M3FN, onnx.TensorProto.FLOAT
    x_q = b.op("Cast", b.op("Div", x, x_divisor or x_scale), to=f8, saturate=1)
    x_dq = b.op("Mul", b.op("Cast", x_q, to=f32), x_scale)
    w_dq = b.op("Transpose", b.op("Mul", b.op("Cast", w, to=f32), w_scale), perm=[1, 0])
    y = b.op("MatMul", x_dq, w_dq)
    return b.activation(b.op("Add", y, _bias_or_zeros(b, bias, y)), activation)


def _bias_or_zeros(b: Body, bias: str, y: str) -> str:
    """The bias [N] in float32, or N zeros for one given empty ([0]: none): the first N of Concat(bias, zeros(N)), N being
    the last dim of the GEMM's result y (ONNX Runtime's Shape takes no float8 W)."""
    n = b.op("Shape", y, start=-1)
    return b.op("Slice", b.op("Concat", b.to_float(bias), b.op("ConstantOfShape", n), axis=0), b.ints(0), n)


def example_inputs(shape: Sequence[int], rand: RandFn, attrs: dict[str, Any]) -> list[Any]:
    """shape = (*X's shape, N): X [..., K]; XScale = 0.8·amax(X)/448, so the largest |X| saturate;
    W [N, K] quantized from a random float32 weight (scaled by 1/sqrt(K)) with WScale =
    amax(weight)/448; Bias [N], or [0] (none) where attrs["mask"] (the cases' flag) says "no_bias". Works on numpy arrays
    and torch tensors alike."""
    *lead, k, n = shape
    x = rand(*lead, k)
    weight = to_element_type(rand(n, k, scale=float(k) ** -0.5), "float")
    w_scale = to_element_type(abs(weight).max() / E4M3_MAX, "float")
    x_scale = to_element_type(abs(x).max() * (0.8 / E4M3_MAX), "float")
    bias = rand(0) if "no_bias" in case_flags(attrs) else rand(n)
    return [x, x_scale, to_element_type(weight / w_scale, "float8e4m3fn"), w_scale, bias]


SPEC = OpSpec(
    name="Fp8GemmAct",
    inputs=("X", "XScale", "W", "WScale", "Bias"),
    outputs=("Y",),
    # GemmAct's (the cuBLASLt epilogue's activation, the candidate algorithm) and the GEMM's accumulation
    attrs={**gemm_act.SPEC.attrs, "fast_accum": Attr("int", 1, (0, 1))},
    doc="Y = act(dq(q(X, XScale)) @ dq(W, WScale)^T + Bias), q(x, s) = saturate_e4m3(round_nearest_even(x / s)) "
    "(QuantizeLinear with a float8e4m3fn zero point), dq(v, s) = float(v) * s; X [..., K] and Bias [N] in T, "
    "XScale and WScale float32 scalars, W float8e4m3fn [N, K] (the weight transposed), Bias [N] or [0] (none); X may also be float8e4m3fn, "
    "already q(., XScale) (no quantize pass; Y's type T is then Bias's); computed in float32, "
    "Y [..., N] in T. algo: -1 = the cuBLASLt heuristic's first choice, k >= 0 = the k-th candidate: the heuristic's, then "
    "configurations around them that cuBLASLt accepts; never a change of the math. fast_accum: 1 = cuBLASLt's fast fp8 accumulation (coarser rounding of the sum over K), "
    "0 = full float32 accumulation; the rounding only, never the math. Needs opset 19 (float8 types, Cast's saturate).",
    reference_fn=reference,
    body_fn=body,
    example_fn=example_inputs,
    input_types={"XScale": "float", "W": "float8e4m3fn", "WScale": "float"},
    trt_plugin=False,  # the tensorrt target keeps standard Q/DQ pairs, which TensorRT fuses into its own fp8 GEMMs
    min_opset=19,
)


@torch.library.custom_op("deployfuse::fp8_gemm_act", mutates_args=())
def torch_op(
    x: torch.Tensor, x_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor, activation: str = "none", algo: int = -1, fast_accum: int = 1
) -> torch.Tensor:
    """act(dq(q(x, x_scale)) @ dq(w, w_scale)^T + bias) with w a torch.float8_e4m3fn [N, K]."""
    return SPEC.reference(x, x_scale, w, w_scale, bias, activation=activation, algo=algo, fast_accum=fast_accum)


@torch_op.register_fake
def _(x, x_scale, w, w_scale, bias, activation="none", algo=-1, fast_accum=1):
    return x.new_empty(*x.shape[:-1], w.shape[0])


@onnxscript.script(opset=DF)
def fp8_gemm_act_onnx(
    x: TFloat, x_scale: FLOAT, w: FLOAT8E4M3FN, w_scale: FLOAT, bias: TFloat, activation: str = "none", algo: int = -1, fast_accum: int = 1
) -> TFloat:
    return DF.Fp8GemmAct(x, x_scale, w, w_scale, bias, activation=activation, algo=algo, fast_accum=fast_accum)


to_onnx = fp8_gemm_act_onnx  # the exporter inlines it by name: one name per op
