"""LayerNorm from its decomposed form -> LayerNormalization-17 (ONNX Runtime's own before opset 17).

    μ = mean(x, -1);  d = x − μ;  σ² = mean(d², -1);  y = d / √(σ² + ε);  out = y · γ + β

d² comes as Pow(d, 2) or Mul(d, d); the division as Div(d, √·), Mul(d, Reciprocal(√·)) or
Mul(d, Div(1, √·)).
The means' axes come as an input (opset ≥ 18) or an attribute; a norm written without ε
fuses with ε = 0, which is what its graph computes.
With fp16 upcasts (x → Cast(float) … → Cast(fp16) before γ), LayerNormalization on the fp16
input with stash_type = 1 computes the statistics in float just the same. γ and β must be
constant vectors of the last axis' size; β may be absent.

Below opset 17, where LayerNormalization is not a standard op, ONNX Runtime targets get ORT's
own ONNX-domain LayerNormalization (registered on CPU and CUDA for opsets 1-16, same inputs and
attributes); TensorRT keeps the decomposed form (a near miss says why).
"""

from __future__ import annotations

from onnxscript.rewriter import MatchResult, pattern

from deployfuse.rewrite.rules._common import FusionRule, Lowering, check_norm_moments, const_1d, last_dim, mean_last, plus_epsilon, scalar

FAMILY = "layernorm"


DIVISIONS = ("div", "reciprocal", "one_over")


def divide(op, x, denominator, form: str):
    """x / denominator as Div, as x · Reciprocal(d), or as x · (1 / d) (TorchScript's rsqrt)."""
    if form == "div":
        return op.Div(x, denominator)
    if form == "reciprocal":
        return op.Mul(x, op.Reciprocal(denominator))
    return op.Mul(x, op.Div(pattern.Constant(1.0), denominator))


class DecomposedLayerNorm(FusionRule):
    """The decomposed LayerNorm, one variant per (square form, division form, upcast, bias)."""

    def __init__(self, target: str, square_pow: bool, division: str, upcast: bool, has_bias: bool) -> None:
        super().__init__("layernorm", target)
        self.square_pow, self.division, self.upcast, self.has_bias = square_pow, division, upcast, has_bias

    def pattern(self, op, x, two, eps, scale, bias):
        xf = op.Cast(x, _outputs=["upcast"]) if self.upcast else x
        d = op.Sub(xf, mean_last(op, xf, "mean"))
        sq = op.Pow(d, two) if self.square_pow else op.Mul(d, d)
        std = op.Sqrt(plus_epsilon(op, mean_last(op, sq, "variance"), eps))
        y = divide(op, d, std, self.division)
        if self.upcast:
            y = op.Cast(y, _outputs=["downcast"])
        y = op.Mul(y, scale)
        return op.Add(y, bias) if self.has_bias else y

    def check(self, context, x, mean, variance, scale, eps=None, bias=None, two=None, upcast=None, downcast=None, **_) -> MatchResult:
        fail = MatchResult().fail
        failed = check_norm_moments(x, [mean, variance], self.square_pow, two, eps, upcast if self.upcast else None, downcast)
        if failed is not None:
            return failed
        size = last_dim(x)
        for name, v in (("γ", scale), ("β", bias)):
            if v is not None and not const_1d(v, size):
                return fail(f"{name} is not a constant vector of the last axis' size", v)
            if v is not None and v.dtype != x.dtype:
                return fail(f"{name} dtype differs from x", v)
        self.epsilon = 0.0 if eps is None else scalar(eps)
        return self.choose(context, x, [Lowering("", "LayerNormalization")])

    def rewrite(self, op, x, scale, bias=None, **_):
        inputs = [x, scale] + ([bias] if bias is not None else [])
        return self.emit(op, *inputs, axis=-1, epsilon=self.epsilon, stash_type=1)


def rules(target: str) -> list[pattern.RewriteRule]:
    """LayerNorm rules (the same on every target; the profile refuses what a target's opset lacks)."""
    out: list[pattern.RewriteRule] = []
    for has_bias in (True, False):  # with β first, so the Add is consumed
        for square_pow in (True, False):
            for division in DIVISIONS:
                for upcast in (False, True):
                    out += DecomposedLayerNorm.rule(target, square_pow, division, upcast, has_bias).commute()
    return out
