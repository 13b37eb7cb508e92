"""GELU from its decomposed forms -> one Gelu node.

    erf:   GELU(x) = x · 0.5 · (1 + erf(x / √2))
    tanh:  GELU(x) ≈ x · 0.5 · (1 + tanh(√(2/π) · (x + 0.044715 · x³)))
    quick: QuickGELU(x) = x · σ(α · x)   (CLIP uses α = 1.702)

The three factors of the outer product come in any association (x·(½·e), (x·e)·½, (½·x)·e)
and any operand order; the exporters write x/√2 as Div or as Mul by 1/√2 and x³ as Pow or Mul.
`erf_gelu` / `tanh_gelu` build those patterns so other families (bias + act) can reuse them.
Lowering per target: ort-cpu Gelu-20 (float, opset ≥ 20) or com.microsoft Gelu / FastGelu;
ort-cuda com.microsoft Gelu / FastGelu; tensorrt Gelu-20 only (opset ≥ 20; below that
TensorRT fuses the decomposed form itself).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

from onnxscript.rewriter import MatchResult, pattern

from deployfuse.rewrite.rules._common import FusionRule, Lowering, either, scalar
from deployfuse.targets import MS, Target, get_target

FAMILY = "gelu"

# Constants match within bf16 rounding; the guard's numeric check catches anything looser.
_TOL = 4e-3


def _c(value: float) -> pattern.Constant:
    return pattern.Constant(value, rel_tol=_TOL)


def _product(op, x, e, order: int, swap: bool):
    """x · ½ · e in association `order` (0: x·(½·e), 1: (x·e)·½, 2: (½·x)·e), any operand
    order (`swap` flips the root's; OrValue cannot be a pattern's root)."""
    half = _c(0.5)
    if order == 0:
        inner, other = either(op.Mul, half, e), x
    elif order == 1:
        inner, other = either(op.Mul, x, e), half
    else:
        inner, other = either(op.Mul, half, x), e
    return op.Mul(other, inner) if swap else op.Mul(inner, other)


def erf_gelu(op, x, order: int, swap: bool, divide: bool):
    """Pattern of x · ½ · (1 + erf(x/√2)); `divide`: x/√2 as Div (else Mul by 1/√2)."""
    scaled = op.Div(x, _c(math.sqrt(2.0))) if divide else either(op.Mul, x, _c(1.0 / math.sqrt(2.0)))
    return _product(op, x, either(op.Add, op.Erf(scaled), _c(1.0)), order, swap)


def tanh_gelu(op, x, order: int, swap: bool, cube_pow: bool):
    """Pattern of x · ½ · (1 + tanh(√(2/π)(x + 0.044715 x³))); `cube_pow`: x³ as Pow (else Mul)."""
    cube = op.Pow(x, _c(3.0)) if cube_pow else either(op.Mul, x, op.Mul(x, x))
    inner = either(op.Mul, either(op.Add, x, either(op.Mul, cube, _c(0.044715))), _c(math.sqrt(2.0 / math.pi)))
    return _product(op, x, either(op.Add, op.Tanh(inner), _c(1.0)), order, swap)


def gelu_forms() -> Iterator[tuple[str, Callable[..., Any]]]:
    """("erf" | "tanh", pattern builder op, x -> y) for every decomposed GELU variant."""
    for order in range(3):
        for swap in (False, True):
            for flag in (True, False):
                yield "erf", lambda op, x, o=order, s=swap, f=flag: erf_gelu(op, x, o, s, f)
                yield "tanh", lambda op, x, o=order, s=swap, f=flag: tanh_gelu(op, x, o, s, f)


class DecomposedGelu(FusionRule):
    """One decomposed GELU variant -> Gelu / FastGelu."""

    def __init__(self, target: str | Target, kind: str, build: Callable[..., Any]) -> None:
        super().__init__(f"gelu_{kind}", target)
        self.kind, self.build = kind, build

    def pattern(self, op, x):
        return self.build(op, x)

    def check(self, context, x, **_) -> MatchResult:
        return self.choose(context, x, self.target.lowering(f"gelu_{self.kind}"))

    def rewrite(self, op, x, **_):
        return self.emit(op, x)


class QuickGelu(FusionRule):
    """x · σ(α · x) with a constant α ≠ 1 -> com.microsoft.QuickGelu(alpha=α)."""

    def __init__(self, target: str | Target) -> None:
        super().__init__("quick_gelu", target)

    def pattern(self, op, x, alpha):
        return op.Mul(x, op.Sigmoid(op.Mul(x, alpha)))

    def check(self, context, x, alpha, **_) -> MatchResult:
        value = scalar(alpha)
        if value is None or value == 1.0:
            return MatchResult().fail("α is not a scalar constant other than 1 (that is SiLU)", alpha)
        self.alpha = value
        return self.choose(context, x, [Lowering(MS, "QuickGelu")])

    def rewrite(self, op, x, **_):
        return self.emit(op, x, alpha=self.alpha)


def rules(target: str | Target) -> list[pattern.RewriteRule]:
    """The GELU rules for `target` (all association / operand orders)."""
    out = [DecomposedGelu.rule(target, kind, build) for kind, build in gelu_forms()]
    if get_target(target).emits(MS, "QuickGelu", opset=0):
        out += QuickGelu.rule(target).commute()
    return out
