"""Scaled dot-product attention → one fused attention node per layer.

    O = softmax(Q Kᵀ · scale + mask) V          per head; Q [B,H,S,D], K [B,H,L,D], V [B,H,L,Dv]

`ort-cpu` / `ort-cuda` get com.microsoft.MultiHeadAttention (fp32 and fp16 kernels on both EPs;
grouped-query models reach it with K/V already expanded by the model, which is exact),
`tensorrt` gets deployfuse.FusedMHA (TensorRT parses no com.microsoft op). Both take
Q, K, V as [B, S, heads·head_dim], so each is taken from before the model split its heads when
that split is provable, else re-merged with Transpose + Reshape.

Masks of every kind (additive, boolean via Where, padding, causal, GPT-2's combined one) arrive
as the additive tensor the model computed; it is passed on as the attention bias, with -inf
clamped to the dtype's lowest finite value: a fully masked row then averages V instead of
turning into NaN, which the fused kernels cannot zero as torch's decomposition does (and a NaN
row poisons every later layer through 0·NaN). MultiHeadAttention needs the bias as
[B|1, H|1, S, L], so a [.., 1, L] padding mask is expanded over the queries. A mask that is
provably finite (a finite constant, or `Where(c, a, b)` of finite constants) needs no clamp; one
provably zero (a zero constant, or `Where(c, 0, b)` with c an all-True constant, Expanded or not)
is dropped: softmax(s + 0) = softmax(s). Scores masked by selection (`masked_fill(c, F)`, `torch.where(c, s, F)`:
nanoGPT, GPT-Neo) pass on the mask Where(c, F, 0), F clamped the same way (`_attention_core` says when that is exact).

fp16 (bf16) models that compute their scores in float32 on purpose (GPT-Neo: Cast(Q), Cast(K) to float32, a float32
softmax, P cast back before P @ V16) keep float32 attention: Q and K as they cast them, V cast up,
the output cast back. Only P's rounding to fp16 before P @ V is skipped (O = P V in float32, rounded once). An fp16
attention could overflow on the unscaled Q·Kᵀ these models upcast to avoid.

Rules: `attention` (core + the output head-merge, the usual form), `attention_core` (the core
alone, when its output has other consumers) and `attention_merge` (cancels the
merge→split→merge round trip `attention_core` leaves).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult, pattern

from deployfuse.rewrite.rules._attention_core import Core, read_core, unflat_heads
from deployfuse.rewrite.rules._attention_shapes import (
    DimOf,
    constant,
    partial_reshape_target,
    partial_shape_vector,
    rank,
    reshape_is_noop,
    reshape_target,
    same_dim,
    scalar,
    split_heads_source,
    split_source,
)
from deployfuse.rewrite.rules._common import FusionRule, broadcast_shape, is_op
from deployfuse.rewrite.rules._projection import projection
from deployfuse.targets import DEPLOYFUSE, MS, Target, get_target

FAMILY = "attention"

_FUSED = {(MS, "MultiHeadAttention"), (DEPLOYFUSE, "FusedMHA")}
_NARROW = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)


def _const(op, values: list[int]) -> ir.Value:
    return op.Constant(value=ir.tensor(np.array(values, dtype=np.int64)))


def _lowest(dtype: ir.DataType | None) -> float:
    return float(np.finfo(dtype.numpy() if dtype is not None and dtype.is_floating_point() else np.float32).min)


class _Attention(FusionRule):
    """Softmax → [NaN guard | Cast down] → MatMul V [→ Transpose(0,2,1,3) → Reshape to [B, S, H·Dv]]; `flat`: P and V
    as [B·H, S, ·] views, P·V reshaped back to [B, H, S, Dv] (BLOOM)."""

    def __init__(self, target: str | Target, nan_guard: bool, merged: bool, downcast: bool = False, flat: bool = False) -> None:
        super().__init__("attention" if merged else "attention_core", target)
        self._nan_guard, self._merged, self._downcast, self._flat = nan_guard, merged, downcast, flat
        self._core: Core | None = None
        self._keep_reshape = False

    def pattern(self, op, scores, value, zero, merged_shape, flat_shape, heads_shape):
        probs = op.Softmax(scores, _outputs=["probs"])
        if self._nan_guard:
            probs = op.Where(op.IsNaN(probs), zero, probs)
        if self._downcast:
            probs = op.Cast(probs, _outputs=["narrowed"])
        if self._flat:
            probs = op.Reshape(probs, flat_shape, _outputs=["flat_probs"])
        out = op.MatMul(probs, value, _outputs=["attended"])
        if self._flat:
            out = op.Reshape(out, heads_shape, _outputs=["heads"])
        if self._merged:
            out = op.Reshape(op.Transpose(out, perm=[0, 2, 1, 3]), merged_shape, _outputs=["merged"])
        return out

    def check(self, context, scores, value, probs, zero=None, merged=None, flat_probs=None, heads=None, **_) -> MatchResult:
        result = MatchResult()
        if self._flat:
            flat_value = value
            value = unflat_heads(flat_value)
            reason = None if value is not None else "V is not a flat [B·H, L, Dv] view of [B, H, L, Dv]"
            reason = reason or _flat_product_reason(flat_probs, heads, value)
            if reason:
                return result.fail(reason, flat_value)
        if self._nan_guard and scalar(zero) != 0.0:
            return result.fail("the NaN guard does not write zeros", zero)
        axis = probs.producer().attributes.get("axis")
        if axis is None or axis.as_int() not in (-1, 3) or rank(scores) != 4:
            return result.fail("Softmax is not over the last axis of 4-D scores", probs)
        core = read_core(scores, value)
        if isinstance(core, str):
            return result.fail(core, scores)
        if self._downcast and (scores.dtype != ir.DataType.FLOAT or value.dtype not in _NARROW):
            return result.fail("the softmax is not float32 cast down to V's fp16 / bf16", probs)
        chosen = self.choose(context, core.query, self.target.lowering("attention"))  # in the dtype it computes in
        if not chosen:
            return chosen
        self._keep_reshape = False
        if merged is not None:
            reason = self._check_merge(merged, core)
            if reason:
                return result.fail(reason, merged)
        self._core = core
        return result

    def _check_merge(self, merged: ir.Value, core: Core) -> str | None:
        """Why the output Reshape cannot take the fused [B, S, H·Dv] output, or None.

        The fused output holds the same elements in the same order as the [B, S, H, Dv]
        tensor the model reshapes, so `Reshape(fused, target)` is exact unless the target copies
        (`0`) an axis past the first two, where the two inputs' shapes differ.
        """
        node = merged.producer()
        raw = partial_shape_vector(node.inputs[1])  # entries 0 and 1 may be unreadable: B and S copy alike from either input
        if raw is None:
            return "the output merge's target shape is not readable"
        allowzero = node.attributes.get("allowzero")
        if (allowzero is None or allowzero.as_int() == 0) and any(not isinstance(e, int) or e == 0 for e in raw[2:]):
            return "the output merge copies a head axis"
        out = node.inputs[0]  # [B, S, H, Dv]
        wanted = [DimOf(out, 0), DimOf(out, 1), core.heads * core.value_head_dim]
        target = reshape_target(node) or []
        exact = len(target) == 3 and all(same_dim(e, w) or e == -1 for e, w in zip(target, wanted)) and sum(e == -1 for e in target) <= 1
        self._keep_reshape = not exact
        return None

    def rewrite(self, op, attended, merged=None, heads=None, **_):
        if heads is not None:  # flat: the [B, H, S, Dv] output is P·V's view reshaped back
            attended = heads
        core = self._core
        assert core is not None
        query = merged_heads(op, core.query, core.heads, core.head_dim)
        key = _merged_bshd(op, core.key) if core.key_layout == "bshd" else merged_heads(op, _repeated_heads(op, core), core.heads, core.head_dim)
        value = merged_heads(op, core.value, core.heads, core.value_head_dim)
        if self._downcast:  # the float32 attention the model computes: V cast up, the output cast back below
            value = _cast(op, value, core.query.dtype)
        out_shape = attended.shape  # [B, H, S, Dv]
        assert self.lowering is not None
        mha = (self.lowering.domain, self.lowering.op_type) == (MS, "MultiHeadAttention")
        additive = _additive_mask(op, core, core.query)
        mask = None if additive is None or _zero(additive) else _bias(op, additive, query, key, mha)
        if mha:  # the mask is its attention_bias input (key_padding_mask and bias in between)
            fused = self.emit(op, query, key, value, None, None, mask, num_heads=core.heads, scale=core.scale)
        else:  # FusedMHA: the mask, when present, is its last input
            fused = self.emit(op, query, key, value, *([mask] if mask is not None else []), num_heads=core.heads, scale=core.scale, causal=0)
        _describe(fused, core.query, None if out_shape is None else [out_shape[0], out_shape[2], core.heads * core.value_head_dim])
        if self._downcast:
            fused = _cast(op, fused, attended.dtype)
        if merged is not None:
            return op.Reshape(fused, merged.producer().inputs[1]) if self._keep_reshape else fused
        split = op.Reshape(fused, _const(op, [0, 0, core.heads, core.value_head_dim]))
        _describe(split, attended, None if out_shape is None else [out_shape[0], out_shape[2], core.heads, core.value_head_dim])
        return op.Transpose(split, perm=[0, 2, 1, 3])


def _flat_product_reason(flat_probs: ir.Value, heads: ir.Value, value: ir.Value) -> str | None:
    """Why P·V on flat views is not the [B, H, S, Dv] attention output, or None. P [B, H, S, L] viewed as [X, S, Y]
    times the flat V [B·H, L, Dv] forces Y = L and X = B·H; the output's view back [B, H, S, Dv] is then proven by
    H, S and Dv (B is forced by the element count)."""
    probs = flat_probs.producer().inputs[0]
    flat, back = partial_reshape_target(flat_probs.producer()), partial_reshape_target(heads.producer())
    if flat is None or len(flat) != 3 or not same_dim(flat[1], DimOf(probs, 2)):
        return "P is not viewed as [B·H, S, L]"
    if back is None or len(back) != 4 or not all(same_dim(e, w) for e, w in zip(back[1:], [DimOf(probs, 1), DimOf(probs, 2), DimOf(value, 3)])):
        return "P·V is not viewed back as [B, H, S, Dv]"
    return None


def _cast(op, value: ir.Value, dtype: ir.DataType | None) -> ir.Value:
    """`value` cast to `dtype`, its shape kept."""
    cast = op.Cast(value, to=dtype)
    cast.dtype, cast.shape = dtype, value.shape
    return cast


def _additive_mask(op, core: Core, like: ir.Value) -> ir.Value | None:
    """The core's mask as one additive tensor: its selection as Where(c, F, 0) (or Where(c, 0, F)) in the dtype of
    `like` (the scores'), plus its additive mask; None when it has neither."""
    mask = core.mask
    if core.flat_bias is not None:  # [B·H, 1|S, L] as [B, H, 1|S, L]: its first axis is the flat scores' B·H
        batch_heads = op.Shape(core.query, start=0, end=2)
        bias = op.Reshape(core.flat_bias, op.Concat(batch_heads, _const(op, [-1]), op.Shape(core.flat_bias, start=2, end=3), axis=0))
        q_shape, b_shape = core.query.shape, core.flat_bias.shape
        _describe(bias, like, None if q_shape is None or b_shape is None else [q_shape[0], q_shape[1], b_shape[1], b_shape[2]])
        if mask is not None:
            shapes = (mask.shape, bias.shape)
            mask = op.Add(mask, bias)
            _describe(mask, like, None if any(shape is None for shape in shapes) else broadcast_shape(*shapes))
        else:
            mask = bias
    if core.select is None:
        return mask
    select = core.select
    dtype = like.dtype.numpy() if like.dtype is not None else np.float32
    # -inf clamped here as `_bias` would clamp it (see the module's docstring): the selection is then provably finite
    fill, zero = (op.Constant(value=ir.tensor(np.array(v, dtype=dtype))) for v in (max(select.fill, _lowest(like.dtype)), 0.0))
    selected = op.Where(select.condition, *((fill, zero) if select.where else (zero, fill)))
    _describe(selected, like, None if select.condition.shape is None else list(select.condition.shape))
    if mask is None:
        return selected
    total = op.Add(selected, mask)
    shapes = (select.condition.shape, mask.shape)
    _describe(total, like, None if any(shape is None for shape in shapes) else broadcast_shape(*shapes))
    return total


def _describe(value: ir.Value, like: ir.Value, dims: list | None) -> None:
    """Give a value this rule created its dtype and shape, so later rules can prove layouts."""
    value.dtype = like.dtype
    if dims is not None:
        value.shape = ir.Shape(dims)


def merged_heads(op, value: ir.Value, heads: int, head_dim: int) -> ir.Value:
    """`value` [B, H, S, D] as [B, S, H·D]: the tensor the heads were split from, when provable;
    else the merge of the [B, S, H, D] tensor `value` transposes (the exporter may split the
    heads straight off a 2-D projection, [B·S, H·D]), else a transpose and a merge. A Cast of
    the heads (GPT-Neo's upcast Q and K) is applied to the merge instead: Cast commutes with both."""
    source = split_heads_source(value)
    if source is not None and source[1:] == (heads, head_dim):
        return source[0]
    node = value.producer()
    if is_op(node, "Cast") and rank(node.inputs[0]) == 4:
        return _cast(op, merged_heads(op, node.inputs[0], heads, head_dim), value.dtype)
    is_merge = is_op(node, "Transpose") and list(node.attributes.get_ints("perm", [])) == [0, 2, 1, 3]
    unsplit = node.inputs[0] if is_merge else None
    merged = op.Reshape(unsplit if unsplit is not None else op.Transpose(value, perm=[0, 2, 1, 3]), _const(op, [0, 0, heads * head_dim]))
    _describe(merged, value, None if value.shape is None else [value.shape[0], value.shape[2], heads * head_dim])
    return merged


def _repeated_heads(op, core: Core) -> ir.Value:
    """K as [B, H, L, D]: itself, or (layout "grouped") its repeated groups [B, G, r, L, D] merged."""
    if core.key_layout != "grouped":
        return core.key
    key = op.Reshape(core.key, _const(op, [0, core.heads, -1, core.head_dim]))
    shape = core.key.shape
    _describe(key, core.key, None if shape is None else [shape[0], core.heads, shape[3], core.head_dim])
    return key


def _merged_bshd(op, value: ir.Value) -> ir.Value:
    """`value` [B, L, H, D] as [B, L, H·D]."""
    source = split_source(value)
    if source is not None:
        return source[0]
    merged = op.Reshape(value, _const(op, [0, 0, -1]))
    _describe(merged, value, None if value.shape is None or not isinstance(value.shape[3], int) else [value.shape[0], value.shape[1], value.shape[2] * value.shape[3]])
    return merged


def _bias(op, mask: ir.Value, query: ir.Value, key: ir.Value, full_queries: bool) -> ir.Value:
    """The mask as an attention bias: -inf clamped (unless provably finite), rank 4, and (for MHA) [.., S, L] explicitly."""
    if _finite(mask):
        bias = mask
    else:
        bias = op.Max(mask, op.Constant(value=ir.tensor(np.array(_lowest(mask.dtype), dtype=mask.dtype.numpy() if mask.dtype else np.float32))))
    mask_rank = rank(mask) or 4
    if mask_rank < 4:
        bias = op.Unsqueeze(bias, _const(op, list(range(4 - mask_rank))))
    if full_queries:
        shape = mask.shape
        exact = shape is not None and same_dim(DimOf(mask, mask_rank - 2), DimOf(query, 1)) and same_dim(DimOf(mask, mask_rank - 1), DimOf(key, 1))
        if not exact or (shape is not None and 1 in (shape[-2], shape[-1])):
            queries = op.Shape(_projected_from(query), start=1, end=2)
            keys = op.Shape(_projected_from(key), start=1, end=2)
            bias = op.Expand(bias, op.Concat(_const(op, [1, 1]), queries, keys, axis=0))
    return bias


def _projected_from(value: ir.Value) -> ir.Value:
    """x when `value` [B, S, D] is x·W [+ b] (`_projection.projection`: MatMul, Gemm, also on
    the flattened tokens), or one of the parts a Split over the last axis cuts from such a
    projection (GPT-2's Conv1D), with W, b constants: x has the same [B, S]. Else `value`.
    Reading S from x leaves the projection free for the packed_qkv family."""
    node = value.producer()
    if is_op(node, "Split"):
        source = node.inputs[0]
        axis = node.attributes.get_int("axis", 0)
        if rank(source) == 3 and axis % 3 == 2:
            value = source
    found = projection(value, exclusive=False)
    return value if isinstance(found, str) or rank(found.x) != 3 else found.x


def _select(mask: ir.Value) -> tuple[ir.Value, float, float] | None:
    """`(c, a, b)` when `mask` is Where(c, a, b) with scalar constants a, b."""
    node = mask.producer()
    if not is_op(node, "Where"):
        return None
    a, b = scalar(node.inputs[1]), scalar(node.inputs[2])
    return None if a is None or b is None else (node.inputs[0], a, b)


def _finite(mask: ir.Value) -> bool:
    """True when `mask` is a finite constant or Where(c, a, b) of finite constants a, b."""
    array = constant(mask)
    if array is not None:
        return bool(np.isfinite(array).all())
    select = _select(mask)
    return select is not None and bool(np.isfinite(select[1:]).all())


def _zero(mask: ir.Value) -> bool:
    """True when `mask` is a zero constant or Where(c, 0, b) with c an all-True constant, Expanded or not."""
    array = constant(mask)
    if array is not None:
        return not array.any()
    select = _select(mask)
    if select is None or select[1] != 0.0:
        return False
    cond = select[0]
    node = cond.producer()
    if is_op(node, "Expand"):
        cond = node.inputs[0]
    array = constant(cond)
    return array is not None and array.dtype == np.bool_ and bool(array.all())


class _MergeRoundTrip(FusionRule):
    """Reshape(Transpose(Transpose(Reshape(Y, [B,S,H,Dv]), 0213) [no-op Reshapes], 0213), [B,S,H·Dv]) → Y
    for Y a fused attention output: the split `attention_core` emits, undone by the model's merge.
    It emits no fused op (only Identity), so it needs no lowering of the target."""

    def __init__(self, target: str | Target) -> None:
        super().__init__("attention_merge", target)
        self._source: ir.Value | None = None

    def pattern(self, op, heads, shape):
        return op.Reshape(op.Transpose(heads, perm=[0, 2, 1, 3]), shape, _outputs=["merged"])

    def check(self, context, heads, merged, **_) -> MatchResult:
        result = MatchResult()
        node = heads.producer()
        while node is not None and node.op_type == "Reshape" and reshape_is_noop(node):
            node = node.inputs[0].producer()
        if node is None or node.op_type != "Transpose" or list(node.attributes["perm"].as_ints()) != [0, 2, 1, 3]:
            return result.fail("not a split of a fused attention output", heads)
        split = node.inputs[0].producer()
        source = split.inputs[0] if split is not None and split.op_type == "Reshape" else None
        fused = source.producer() if source is not None else None
        if fused is None or (fused.domain, fused.op_type) not in _FUSED:
            return result.fail("not a split of a fused attention output", heads)
        target = reshape_target(merged.producer())
        wanted = [DimOf(source, 0), DimOf(source, 1), source.shape[2] if source.shape is not None else None]
        if target is None or len(target) != 3 or not all(same_dim(e, w) or e == -1 for e, w in zip(target, wanted) if w is not None) or sum(e == -1 for e in target) > 1:
            return result.fail("the merge is not back to the fused output's shape", merged)
        self._source = source
        return result

    def rewrite(self, op, **_):
        return op.Identity(self._source)


def rules(target: str | Target) -> list[pattern.RewriteRule]:
    """Attention rules for `target`: the merged form, the bare core, and the round-trip cleanup
    (the rotary family runs just before, so Q and K arrive already rotated)."""
    lowering = get_target(target).lowering("attention")
    if not lowering or not get_target(target).emits(lowering[0].domain, lowering[0].op_type, opset=0):
        return []
    found = [_Attention.rule(target, guard, merged) for merged in (True, False) for guard in (True, False)]
    found += [_Attention.rule(target, False, merged, True) for merged in (True, False)]  # the float32 core of fp16 models
    found += [_Attention.rule(target, False, merged, False, True) for merged in (True, False)]  # heads flat in the batch (BLOOM)
    return [*found, _MergeRoundTrip.rule(target)]
