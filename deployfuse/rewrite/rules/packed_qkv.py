"""Self-attention with separate Q, K, V projections → com.microsoft.Attention (packed QKV).

    MHA(x·Wq + bq, x·Wk + bk, x·Wv + bv, attention_bias=A)
        = Attention(x, [Wq | Wk | Wv], [bq | bk | bv], attention_bias=A)

x·[Wq | Wk | Wv] + [bq | bk | bv] = [x·Wq + bq | x·Wk + bk | x·Wv + bv] column block by block, and
Attention splits its one projection at D and 2D into Q, K, V; so three GEMMs and three bias adds
become one GEMM inside the fused kernel. A projection without bias gets a zero block; a query
scaled after its projection (Whisper) has the scale folded into its weight and bias.

Only what maps exactly: one x for all three (self-attention; cross-attention is left to
MultiHeadAttention), constant weights of one shape [Din, D], constant biases [D], and a
MultiHeadAttention (as the attention family emits it) with no packed bias, key padding mask,
past or extra output. num_heads and scale carry over; the bias A, [B|1, H|1, S, L], is
Attention's `attention_bias` input as it is (no mask_index). Runs right after `attention`.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from deployfuse.rewrite.profiles import MS
from deployfuse.rewrite.rules._attention_shapes import DimOf, constant, rank, same_dim, scalar, static_dim
from deployfuse.rewrite.rules._common import FusionRule, Lowering

FAMILY = "packed_qkv"

_MHA_ATTRIBUTES = {"num_heads", "scale"}


def _is(node: ir.Node | None, op_type: str) -> bool:
    return node is not None and node.op_type == op_type and node.domain in ("", "ai.onnx")


def _linear(value: ir.Value) -> tuple[ir.Value, ir.Value, np.ndarray, np.ndarray | None] | None:
    """`(x, W, W's values, b's values or None)` when `value` = x·W [+ b] as MatMul [+ Add] or as
    Gemm (alpha, beta, transB folded into W and b; C a row vector), W and b constants."""
    node = value.producer()
    if _is(node, "Gemm"):
        weight, c = constant(node.inputs[1]), constant(node.inputs[2]) if len(node.inputs) > 2 else None
        attrs = node.attributes
        if weight is None or weight.ndim != 2 or attrs.get_int("transA", 0) or (len(node.inputs) > 2 and node.inputs[2] is not None and c is None):
            return None
        weight = weight.T if attrs.get_int("transB", 0) else weight
        if c is not None and (c.size != weight.shape[1] or c.ndim not in (1, 2) or c.shape[-1] != weight.shape[1]):
            return None  # C broadcast over rows only: [D] or [1, D]
        alpha, beta = attrs.get_float("alpha", 1.0), attrs.get_float("beta", 1.0)
        bias = None if c is None else c.reshape(-1) * np.asarray(beta, c.dtype)
        return node.inputs[0], node.inputs[1], weight * np.asarray(alpha, weight.dtype), bias
    bias = None
    if _is(node, "Add"):
        for side in (0, 1):
            inner = node.inputs[side].producer()
            if _is(inner, "MatMul") and constant(node.inputs[1 - side]) is not None:
                bias, value, node = constant(node.inputs[1 - side]), node.inputs[side], inner
                break
        else:
            return None
    if not _is(node, "MatMul") or len(value.uses()) != 1:
        return None
    weight = constant(node.inputs[1])
    return None if weight is None else (node.inputs[0], node.inputs[1], weight, bias)


def _reshaped_from(value: ir.Value) -> ir.Value | None:
    """`y` when `value` comes from `y` through Reshapes alone (each input read once): element
    order never changes, so that is Reshape(y, value's shape); else None."""
    node, inner = value.producer(), None
    while _is(node, "Reshape") and len(node.inputs[0].uses()) == 1:
        inner = node.inputs[0]
        node = inner.producer()
    return inner


def _tokens(x: ir.Value, out: ir.Value) -> ir.Value | None:
    """The [B, S, Din] tensor whose tokens `x` holds in order (`x` itself, or the tensor a
    Reshape(·, [B·S, Din]) flattened into `x`), when `out` [B, S, D] has its B and S: then
    Reshape(x·W + b, out's shape) is that tensor's projection, token for token. Else None."""
    node = x.producer()
    if rank(x) == 2 and _is(node, "Reshape"):
        source = node.inputs[0]
        if rank(source) != 3 or static_dim(source, 2) is None or static_dim(x, 1) != static_dim(source, 2):
            return None
        x = source
    if rank(x) != 3 or rank(out) != 3 or not all(same_dim(DimOf(out, a), DimOf(x, a)) for a in (0, 1)):
        return None
    return x


def _projection(value: ir.Value) -> tuple[ir.Value, ir.Value, np.ndarray, np.ndarray | None] | None:
    """`(x, W, W's values, b's values or None)` when `value` = (x·W [+ b]) [· s], W, b and the
    scalar s constants (s folded in: (x·W + b)·s = x·(s·W) + s·b), and no other node reads the
    projection's intermediate values; else None. x·W + b may be reshaped back to x's [B, S, D]
    on the way (a head split and merge), and may run on the flattened tokens:
    Reshape(Gemm | MatMul [+ Add](Reshape(x, [B·S, Din])), [B, S, D]), as addmm exports."""
    node, factor = value.producer(), None
    if len(value.uses()) != 1:
        return None
    if _is(node, "Mul"):
        side = 0 if scalar(node.inputs[1]) is not None else 1 if scalar(node.inputs[0]) is not None else None
        if side is None or len(node.inputs[side].uses()) != 1:
            return None
        factor, value = scalar(node.inputs[1 - side]), node.inputs[side]
    out, inner = value, _reshaped_from(value)
    found = _linear(inner if inner is not None else value)
    if found is None:
        return None
    x, w_value, weight, bias = found
    if inner is not None:
        x = _tokens(x, out)
        if x is None or weight.shape[0] != static_dim(x, 2):
            return None
    if factor is not None:
        weight = weight * np.asarray(factor, weight.dtype)
        bias = None if bias is None else bias * np.asarray(factor, bias.dtype)
    return x, w_value, weight, bias


class PackedQKV(FusionRule):
    """MultiHeadAttention(x·Wq [+ bq], x·Wk [+ bk], x·Wv [+ bv], ∅, ∅, A?) → Attention(x, W, b, ∅, ∅, A?)."""

    def __init__(self, target: str) -> None:
        super().__init__("packed_qkv", target)
        self._parts: tuple[ir.Value, np.ndarray, np.ndarray, str] | None = None

    def pattern(self, op, query, key, value):
        return op.MultiHeadAttention(query, key, value, _allow_other_inputs=True, _allow_other_attributes=True, _domain=MS, _outputs=["attended"])

    def check(self, context, query, key, value, attended, **_) -> pattern.MatchResult:
        fail = pattern.MatchResult().fail
        node = attended.producer()
        if len(node.inputs) > 6 or any(v is not None for v in node.inputs[3:5]) or len(node.outputs) != 1:
            return fail("MultiHeadAttention has a packed bias, key padding mask, past or extra outputs", attended)
        if set(node.attributes) - _MHA_ATTRIBUTES:
            return fail(f"MultiHeadAttention has attributes besides {sorted(_MHA_ATTRIBUTES)}", attended)
        parts = [_projection(v) for v in (query, key, value)]
        if any(p is None for p in parts):
            return fail("Q, K or V is not x·W [+ b] with constant W, b used once", attended)
        (x, w_value, _, _), *_ = parts
        if any(p[0] is not x for p in parts):
            return fail("Q, K, V are projections of different inputs (cross-attention)", attended)
        weights = [p[2] for p in parts]
        if rank(x) != 3 or weights[0].ndim != 2 or any(w.shape != weights[0].shape or w.dtype != weights[0].dtype for w in weights):
            return fail("x is not [B, S, Din] or the weights are not all [Din, D] of one dtype", attended)
        hidden = weights[0].shape[1]
        biases = [np.zeros(hidden, weights[0].dtype) if p[3] is None else p[3] for p in parts]
        if any(b.shape != (hidden,) or b.dtype != weights[0].dtype for b in biases):
            return fail("a bias is not a vector [D] of the weights' dtype", attended)
        self._parts = (x, np.concatenate(weights, axis=1), np.concatenate(biases), w_value.name or "qkv")
        return self.choose(context, x, [Lowering(MS, "Attention")])

    def rewrite(self, op, attended, **_):
        assert self._parts is not None
        x, weight, bias, name = self._parts
        node = attended.producer()
        mask = node.inputs[5] if len(node.inputs) > 5 else None
        packed_w = op.initializer(ir.tensor(weight), name=f"{name}_packed_qkv_weight")
        packed_b = op.initializer(ir.tensor(bias), name=f"{name}_packed_qkv_bias")
        inputs = [x, packed_w, packed_b] + ([None, None, mask] if mask is not None else [])
        return self.emit(op, *inputs, **{k: a.value for k, a in node.attributes.items()})


def rules(target: str) -> list[pattern.RewriteRule]:
    """The packed-QKV rule for ONNX Runtime targets; none for tensorrt (FusedMHA has no packed form)."""
    if target == "tensorrt":
        return []
    return [PackedQKV.rule(target)]
