"""LayerNorm from its decomposed form -> LayerNormalization-17.

    μ = mean(x, -1);  d = x − μ;  σ² = mean(d², -1);  y = d / √(σ² + ε);  out = y · γ + β

d² comes as Pow(d, 2) or Mul(d, d); the division as Div(d, √·), Mul(d, Reciprocal(√·)) or
Mul(d, Div(1, √·)).
With fp16 upcasts (x → Cast(float) … → Cast(fp16) before γ), LayerNormalization on the fp16
input with stash_type = 1 computes the statistics in float just the same. γ and β must be
constant vectors of the last axis' size; β may be absent.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from deployfuse.rewrite.rules._common import FusionRule, Lowering, check_norm_moments, const_1d, last_dim, scalar

FAMILY = "layernorm"


def reduce_last(op, x, axes):
    """ReduceMean over the axes in `axes` (opset ≥ 18 passes them as an input)."""
    return op.ReduceMean(x, axes, keepdims=1)


DIVISIONS = ("div", "reciprocal", "one_over")


def divide(op, x, denominator, form: str):
    """x / denominator as Div, as x · Reciprocal(d), or as x · (1 / d) (TorchScript's rsqrt)."""
    if form == "div":
        return op.Div(x, denominator)
    if form == "reciprocal":
        return op.Mul(x, op.Reciprocal(denominator))
    return op.Mul(x, op.Div(pattern.Constant(1.0), denominator))


def is_last_axis(axes: ir.Value, x: ir.Value) -> bool:
    """True when the constant `axes` is exactly the last axis of `x` ([-1] or [rank-1])."""
    const = ir.convenience.get_const_tensor(axes)
    if const is None or const.size != 1:
        return False
    axis = int(np.asarray(const.numpy()).reshape(()))
    rank = None if x.shape is None else len(x.shape)
    return axis == -1 or (rank is not None and axis == rank - 1)


class DecomposedLayerNorm(FusionRule):
    """The decomposed LayerNorm, one variant per (square form, division form, upcast, bias)."""

    def __init__(self, target: str, square_pow: bool, division: str, upcast: bool, has_bias: bool) -> None:
        super().__init__("layernorm", target)
        self.square_pow, self.division, self.upcast, self.has_bias = square_pow, division, upcast, has_bias

    def pattern(self, op, x, axes1, axes2, two, eps, scale, bias):
        xf = op.Cast(x, _outputs=["upcast"]) if self.upcast else x
        d = op.Sub(xf, reduce_last(op, xf, axes1))
        sq = op.Pow(d, two) if self.square_pow else op.Mul(d, d)
        std = op.Sqrt(op.Add(reduce_last(op, sq, axes2), eps))
        y = divide(op, d, std, self.division)
        if self.upcast:
            y = op.Cast(y, _outputs=["downcast"])
        y = op.Mul(y, scale)
        return op.Add(y, bias) if self.has_bias else y

    def check(self, context, x, axes1, axes2, eps, scale, bias=None, two=None, upcast=None, downcast=None, **_) -> pattern.MatchResult:
        fail = pattern.MatchResult().fail
        if not (is_last_axis(axes1, x) and is_last_axis(axes2, x)):
            return fail("the means are not over the last axis only", [axes1, axes2])
        failed = check_norm_moments(x, self.square_pow, two, eps, upcast if self.upcast else None, downcast)
        if failed is not None:
            return failed
        size = last_dim(x)
        for name, v in (("γ", scale), ("β", bias)):
            if v is not None and not const_1d(v, size):
                return fail(f"{name} is not a constant vector of the last axis' size", v)
            if v is not None and v.dtype != x.dtype:
                return fail(f"{name} dtype differs from x", v)
        self.epsilon = scalar(eps)
        return self.choose(context, x, [Lowering("", "LayerNormalization")])

    def rewrite(self, op, x, scale, bias=None, **_):
        inputs = [x, scale] + ([bias] if bias is not None else [])
        return self.emit(op, *inputs, axis=-1, epsilon=self.epsilon, stash_type=1)


def rules(target: str) -> list[pattern.RewriteRule]:
    """LayerNorm rules (the same on every target: LayerNormalization-17 runs everywhere)."""
    out: list[pattern.RewriteRule] = []
    for has_bias in (True, False):  # with β first, so the Add is consumed
        for square_pow in (True, False):
            for division in DIVISIONS:
                for upcast in (False, True):
                    out += DecomposedLayerNorm.rule(target, square_pow, division, upcast, has_bias).commute()
    return out
