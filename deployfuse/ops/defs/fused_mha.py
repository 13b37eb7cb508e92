"""FusedMHA: Y = softmax(Q Kᵀ · s + Mask [+ causal]) V per head; Q/K/V are [B, S, H·D].

packed_qkv=1 reads Q, K and V out of one packed QKV projection, [B, S, 3·H·D] laid out [Q | K | V],
in place (no Split copies): each of the three inputs is such a tensor (a graph passes the same one
three times) and the op takes Q from input Q's first third, K from input K's second third and V
from input V's last third. Three inputs rather than one with K and V absent: optional inputs may
only end a spec's input list (the function-body overloads, the native adapters and TensorRT's
parser count them from the end), and naming a tensor three times costs nothing.

YScale given, the op also writes YQ = q(Y, YScale) = saturate_e4m3(round_nearest_even(Y / YScale)), Y as rounded
to T (float8e4m3fn, Y's shape): the quantize pass of the fp8 output projection that reads it, done in the
epilogue while the row is in registers (`rules.fp8_attention_out`, as SkipLayerNormFp8 does for the norms).
Y may then be omitted. A node without a Mask but with YScale names the Mask "" (ONNX's absent input)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Optional

import onnx
import onnxscript
import torch
from onnx import helper
from onnxscript.onnx_types import FLOAT

from deployfuse.ops.body import Body
from deployfuse.ops.defs._onnxscript import DF, TFloat
from deployfuse.ops.defs.fp8_gemm_act import quantize_e4m3
from deployfuse.ops.schema import E4M3_MAX, Attr, OpSpec, RandFn, to_element_type


def reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, y_scale: torch.Tensor | None = None,
    *, num_heads: int, scale: float, causal: int, packed_qkv: int = 0
) -> torch.Tensor:
    """Y = softmax(Q Kᵀ · s + Mask [+ causal]) V per head; Q/K/V are [B, S, H·D] (packed_qkv:
    [B, S, 3·H·D], Q, K and V the first, second and last thirds of their inputs).

    s = scale, or 1/sqrt(D) when scale is 0. causal masks key j > query i (top-left aligned,
    as `torch.nn.functional.scaled_dot_product_attention(is_causal=True)`).
    """
    if packed_qkv:
        q, k, v = (t.chunk(3, dim=-1)[i] for i, t in enumerate((q, k, v)))
    b, sq, _ = q.shape
    sk = k.shape[1]
    qh, kh, vh = (t.reshape(b, t.shape[1], num_heads, -1).transpose(1, 2) for t in (q, k, v))
    s = scale if scale != 0 else 1.0 / math.sqrt(qh.shape[-1])
    scores = (qh * s) @ kh.transpose(-1, -2)
    if mask is not None:
        scores = scores + mask
    if causal:
        allowed = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~allowed, float("-inf"))
    y = torch.softmax(scores, dim=-1) @ vh
    return y.transpose(1, 2).reshape(b, sq, -1)


def reference_outputs(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, y_scale: torch.Tensor, **attrs: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """(Y, YQ): Y in Q's dtype (the math in float32, float64 for float64 Q), YQ as torch.float8_e4m3fn quantized from that Y;
    attrs are the node's (defaults filled in)."""
    wide = torch.float64 if q.dtype == torch.float64 else torch.float32
    y = reference(q.to(wide), k.to(wide), v.to(wide), None if mask is None else mask.to(wide), **SPEC.resolve(**attrs)).to(q.dtype)
    return y, quantize_e4m3(y, y_scale).to(torch.float8_e4m3fn)


def _thirds(b: Body) -> tuple[str, str, str]:
    """packed_qkv: Q's first, K's second and V's last third along the last axis."""
    third = b.op("Div", b.op("Slice", b.op("Shape", "Q"), b.ints(2), b.ints(3)), b.ints(3))
    bounds = [b.ints(0), third, b.op("Add", third, third), b.op("Mul", third, b.ints(3))]
    return tuple(b.op("Slice", name, bounds[i], bounds[i + 1], b.ints(2)) for i, name in enumerate("QKV"))  # type: ignore[return-value]


def body(b: Body, variant: dict[str, Any]) -> str:
    q_in, k_in, v_in = _thirds(b) if variant["packed_qkv"] else ("Q", "K", "V")
    heads = b.op("Unsqueeze", b.int_attr("num_heads"), b.ints(0))
    split = b.op("Concat", b.ints(0), b.ints(0), heads, b.ints(-1), axis=0)
    q = b.op("Transpose", b.op("Reshape", q_in, split), perm=[0, 2, 1, 3])  # [B, H, Sq, D]
    kt = b.op("Transpose", b.op("Reshape", k_in, split), perm=[0, 2, 3, 1])  # [B, H, D, Sk]
    v = b.op("Transpose", b.op("Reshape", v_in, split), perm=[0, 2, 1, 3])  # [B, H, Sk, D]
    q_shape = b.op("Shape", q)
    head_dim = b.to_float(b.op("Slice", q_shape, b.ints(3), b.ints(4)))
    scale = b.float_attr("scale")
    is_default = b.op("Equal", scale, b.op("Constant", value_float=0.0))
    scale = b.op("Where", is_default, b.op("Reciprocal", b.op("Sqrt", head_dim)), scale)
    scores = b.op("MatMul", b.op("Mul", q, b.op("CastLike", scale, "Q")), kt)
    if variant["Mask"]:
        scores = b.op("Add", scores, "Mask")
    if variant["causal"]:
        kt_shape = b.op("Shape", kt)
        zero, one = b.op("Constant", value_int=0), b.op("Constant", value_int=1)
        q_pos = b.op("Range", zero, b.op("Squeeze", b.op("Slice", q_shape, b.ints(2), b.ints(3)), b.ints(0)), one)
        k_pos = b.op("Range", zero, b.op("Squeeze", b.op("Slice", kt_shape, b.ints(3), b.ints(4)), b.ints(0)), one)
        allowed = b.op("LessOrEqual", k_pos, b.op("Unsqueeze", q_pos, b.ints(1)))  # [Sq, Sk]
        scores = b.op("Where", allowed, scores, b.scalar_like(float("-inf"), "Q"))
    y = b.op("MatMul", b.op("Softmax", scores, axis=-1), v)
    y = b.op("Reshape", b.op("Transpose", y, perm=[0, 2, 1, 3]), b.op("Concat", b.ints(0), b.ints(0), b.ints(-1), axis=0))
    if variant.get("YScale"):  # YQ as SkipLayerNormFp8's body writes it: from Y in T, Cast(saturate=1) of the float32 quotient
        if b.opset < 19:
            raise ValueError(f"FusedMHA's YQ (float8) needs ONNX opset >= 19; the model uses {b.opset}")
        yq = b.op("Cast", b.op("Div", b.to_float(y), "YScale"), to=onnx.TensorProto.FLOAT8E4M3FN, saturate=1)
        b.nodes.append(helper.make_node("Identity", [yq], ["YQ"]))
    return y


def example_inputs(shape: Sequence[int], rand: RandFn, attrs: dict[str, Any]) -> list[Any]:
    """shape = (batch, q_seq, k_seq, hidden); a [batch, 1, 1, k_seq] mask when attrs["mask"];
    packed_qkv: Q, K, V of 3·hidden (three independent tensors: each third read counts); YScale when
    attrs["outputs"] names YQ (tests/ops/cases.py YQ_CASES): max|V|/(4·448), so that the largest |Y| (a convex mix of
    V rows, mostly well under max|V|) saturate and the rest land in e4m3's normal range."""
    batch, q_seq, k_seq, hidden = shape
    width = 3 * hidden if attrs.get("packed_qkv") else hidden
    mask = rand(batch, 1, 1, k_seq) if attrs.get("mask") else None
    q, k, v = rand(batch, q_seq, width), rand(batch, k_seq, width), rand(batch, k_seq, width)
    y_scale = to_element_type(abs(v).max() * (0.25 / E4M3_MAX), "float") if "YQ" in attrs.get("outputs", ()) else None
    return [q, k, v, mask, y_scale]


SPEC = OpSpec(
    name="FusedMHA",
    inputs=("Q", "K", "V", "Mask", "YScale"),
    optional=("Mask", "YScale"),
    outputs=("Y", "YQ"),
    attrs={
        "num_heads": Attr("int"),
        "scale": Attr("float", 0.0),
        "causal": Attr("int", 0, (0, 1), variant=True),
        "packed_qkv": Attr("int", 0, (0, 1), variant=True),
    },
    doc="Y = softmax(Q Kᵀ·s + Mask [+ causal -inf above the diagonal]) V per head; "
    "Q, K, V are [batch, seq, heads·head_dim]; s = scale or 1/sqrt(head_dim) when 0; "
    "Mask is additive, broadcastable to [batch, heads, q_seq, k_seq]; packed_qkv=1: Q, K, V are each "
    "[batch, seq, 3·heads·head_dim] laid out [Q | K | V] (usually one tensor three times), read in place. "
    "YScale (a float32 scalar) given: YQ = saturate_e4m3(round_nearest_even(Y / YScale)) (float8e4m3fn, from Y in T; "
    "needs opset 19), and Y may be omitted; without a Mask the node names it \"\". TensorRT's plugin refuses YQ.",
    reference_fn=reference,
    body_fn=body,
    example_fn=example_inputs,
    input_types={"YScale": "float"},
)


@torch.library.custom_op("deployfuse::fused_mha", mutates_args=())
def torch_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, y_scale: torch.Tensor | None = None,
    num_heads: int = 1, scale: float = 0.0, causal: int = 0, packed_qkv: int = 0
) -> torch.Tensor:
    """softmax(q kᵀ·s + mask [+ causal]) v per head on [batch, seq, heads·head_dim] (packed_qkv: 3x that, see the module);
    y_scale does not change Y (the node's YQ: `reference_outputs`)."""
    return SPEC.reference(q, k, v, mask, y_scale, num_heads=num_heads, scale=scale, causal=causal, packed_qkv=packed_qkv)


@torch_op.register_fake
def _(q, k, v, mask=None, y_scale=None, num_heads=1, scale=0.0, causal=0, packed_qkv=0):
    return q.new_empty(q.shape[0], q.shape[1], v.shape[2] // 3 if packed_qkv else v.shape[2])


@onnxscript.script(opset=DF)
def fused_mha_onnx(
    q: TFloat,
    k: TFloat,
    v: TFloat,
    mask: Optional[TFloat] = None,  # noqa: UP045 (onnxscript reads the annotation)
    y_scale: Optional[FLOAT] = None,  # noqa: UP045
    num_heads: int = 1,
    scale: float = 0.0,
    causal: int = 0,
    packed_qkv: int = 0,
) -> TFloat:
    return DF.FusedMHA(q, k, v, mask, y_scale, num_heads=num_heads, scale=scale, causal=causal, packed_qkv=packed_qkv)


to_onnx = fused_mha_onnx  # the exporter inlines it by name: one name per op
