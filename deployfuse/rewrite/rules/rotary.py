"""Rotary position embeddings (rotate-half form) → com.microsoft.RotaryEmbedding.

    y = x·cos + rotate_half(x)·sin,   rotate_half(x) = [-x₂, x₁],   cos = Cos([θ, θ]), sin = Sin([θ, θ])

with x [B, H, S, D] split in halves x₁, x₂ and θ [B', S, D/2] the per-position angles (B' is 1
or B). RotaryEmbedding reads cos/sin rows from caches [rows, D/2] at `position_ids`; the rule
gives it the model's own angles as the cache, Cos(θ) flattened to [B'·S, D/2], with position
b·S + s for token (b, s). That is exact for any way the model computes θ (rope scaling, NTK,
position ids from input) and has no maximum length. The halves must provably repeat (θ is
Concat(θ, θ)), or the rule declines. When x was split from [B, S, H·D] the node takes that
3-D tensor, so the attention rule can take its output as Q or K without a re-merge.

`tensorrt` gets nothing: RotaryEmbedding is com.microsoft (the standard op needs opset 23).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from deployfuse.rewrite.profiles import MS, profile
from deployfuse.rewrite.rules._attention_shapes import DimOf, rank, same_dim, scalar, split_heads_source, static_dim, static_ints

FAMILY = "rotary"


def _ints(value: ir.Value | None) -> list[int] | None:
    return static_ints(value) if value is not None else None


def _angles(value: ir.Value, function: str) -> tuple[ir.Value, float] | None:
    """`(θ, f)` when `value` is Unsqueeze(f·function(Concat(θ, θ, axis=-1)), axis 1)."""
    node = value.producer()
    if node is None or node.op_type != "Unsqueeze" or _ints(node.inputs[1] if len(node.inputs) > 1 else None) != [1]:
        return None
    value, factor = node.inputs[0], 1.0
    node = value.producer()
    if node is not None and node.op_type == "Mul":
        for side in (0, 1):
            if scalar(node.inputs[side]) is not None:
                factor, value = scalar(node.inputs[side]), node.inputs[1 - side]
                node = value.producer()
                break
    if node is None or node.op_type != function or node.domain not in ("", "ai.onnx"):
        return None
    concat = node.inputs[0].producer()
    if concat is None or concat.op_type != "Concat" or len(concat.inputs) != 2 or concat.inputs[0] is not concat.inputs[1]:
        return None
    angles = concat.inputs[0]
    axis = concat.attributes["axis"].as_int()
    if rank(angles) != 3 or axis not in (-1, 2):
        return None
    return angles, factor


class _RotateHalf(pattern.RewriteRuleClassBase):
    """x·cos + Concat(-x[..., D/2:], x[..., :D/2])·sin on 4-D x."""

    def __init__(self) -> None:
        super().__init__(name="rotary_embedding")
        self._plan: tuple[ir.Value, float, int, int, ir.Value | None] | None = None
        self._expand_angles = False

    def pattern(self, op, x, cos, sin, s1, e1, a1, st1, s2, e2, a2, st2, axis):
        first = op.Slice(x, s1, e1, a1, st1)
        second = op.Slice(x, s2, e2, a2, st2)
        rotated = op.Concat(op.Neg(second), first, axis=axis)
        return op.Add(op.Mul(x, cos), op.Mul(rotated, sin))

    def check(self, context, x, cos, sin, s1, e1, a1, st1, s2, e2, a2, st2, axis, **_) -> pattern.MatchResult:
        result = pattern.MatchResult()
        head_dim = static_dim(x, 3) if rank(x) == 4 else None
        source = split_heads_source(x) if rank(x) == 4 else None
        head_dim = head_dim or (source[2] if source else None)
        if head_dim is None or head_dim % 2:
            return result.fail("x is not 4-D with an even static head size", x)
        half = head_dim // 2
        if axis.as_int() not in (-1, 3) or any(_ints(a) not in ([3], [-1]) for a in (a1, a2)) or any(_ints(s) != [1] for s in (st1, st2)):
            return result.fail("the halves are not cut from the last axis", x)
        ends = _ints(e2)
        if _ints(s1) != [0] or _ints(e1) != [half] or _ints(s2) != [half] or ends is None or ends[0] < head_dim:
            return result.fail("x is not cut into two equal halves", x)
        cos_angles, sin_angles = _angles(cos, "Cos"), _angles(sin, "Sin")
        if cos_angles is None or sin_angles is None or cos_angles[0] is not sin_angles[0] or cos_angles[1] != sin_angles[1]:
            return result.fail("cos / sin are not Cos / Sin of one repeated angle tensor", cos)
        angles, factor = cos_angles
        if static_dim(angles, 2) != half:
            return result.fail("the angles are not [B', S, D/2]", angles)
        self._plan = (angles, factor, half, source[1] if source else 0, source[0] if source else None)
        self._expand_angles = not same_dim(DimOf(angles, 1), DimOf(x, 2))
        return result

    def rewrite(self, op, x, **_):
        assert self._plan is not None
        angles, factor, half, heads, merged = self._plan
        def i64(*values: int, scalar: bool = False) -> ir.Value:
            return op.Constant(value=ir.tensor(np.array(values[0] if scalar else values, dtype=np.int64)))

        if self._expand_angles:  # broadcast over x's sequence as the model's Mul did
            target = op.Concat(op.Shape(angles, start=0, end=1), op.Shape(x, start=2, end=3), i64(half), axis=0)
            angles = op.Expand(angles, target)
        caches = []
        for function in (op.Cos, op.Sin):
            rows = function(angles)
            if factor != 1.0:
                rows = op.Mul(rows, op.Constant(value=ir.tensor(np.array(factor, dtype=angles.dtype.numpy()))))
            caches.append(op.Reshape(rows, i64(-1, half)))
        rows = op.Div(op.Size(angles), i64(half, scalar=True))  # B'·S
        seq = op.Shape(angles, start=1, end=2)
        positions = op.Reshape(op.Range(i64(0, scalar=True), rows, i64(1, scalar=True)), op.Concat(i64(-1), seq, axis=0))
        positions = op.Expand(positions, op.Concat(op.Shape(x, start=0, end=1), seq, axis=0))
        if merged is None:
            out = op.RotaryEmbedding(x, positions, *caches, interleaved=0, _domain=MS)
            out.dtype, out.shape = x.dtype, x.shape
            return out
        rotated = op.RotaryEmbedding(merged, positions, *caches, interleaved=0, num_heads=heads, _domain=MS)
        rotated.dtype, rotated.shape = merged.dtype, merged.shape
        split = op.Reshape(rotated, i64(0, 0, heads, 2 * half))
        split.dtype = merged.dtype
        if merged.shape is not None:
            split.shape = ir.Shape([merged.shape[0], merged.shape[1], heads, 2 * half])
        out = op.Transpose(split, perm=[0, 2, 1, 3])
        out.dtype, out.shape = x.dtype, x.shape
        return out


def rules(target: str) -> list[pattern.RewriteRule]:
    """The rotary rule where the target runs com.microsoft.RotaryEmbedding, else none."""
    if not profile(target).emits(MS, "RotaryEmbedding", opset=0):
        return []
    return list(_RotateHalf.rule().commute())  # x·cos / cos·x, both Add orders
