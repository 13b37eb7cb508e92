"""Bias add + GELU -> com.microsoft BiasGelu / FastGelu with bias (ONNX Runtime targets).

    y = GELU(x + b)      b a constant vector over x's last axis

Runs after the gelu family, so it matches the fused Gelu / FastGelu nodes. TensorRT gets
deployfuse.BiasAct from the bias_act family instead.
"""

from __future__ import annotations

from onnxscript.rewriter import MatchResult, pattern

from deployfuse.rewrite.rules._common import FusionRule, Lowering, const_1d, last_dim
from deployfuse.targets import MS, Target, get_target

FAMILY = "bias_gelu"


class BiasGelu(FusionRule):
    """Add(x, b) -> Gelu (ONNX, exact), com.microsoft Gelu, or FastGelu without bias."""

    def __init__(self, target: str | Target, source: str, swap: bool) -> None:
        super().__init__("bias_gelu", target)
        self.source, self.swap = source, swap

    def pattern(self, op, x, bias):
        y = op.Add(bias, x) if self.swap else op.Add(x, bias)  # two plain variables: OrValue would bind the first
        if self.source == "onnx":
            return op.Gelu(y, _allow_other_attributes=True, _outputs=["gelu"])
        if self.source == "ms":
            return op.Gelu(y, _domain=MS, _outputs=["gelu"])
        return op.FastGelu(y, _domain=MS, _outputs=["gelu"])

    def check(self, context, x, bias, gelu, **_) -> MatchResult:
        fail = MatchResult().fail
        if self.source == "onnx" and gelu.producer().attributes.get_string("approximate", "none") != "none":
            return fail("Gelu-20 uses the tanh approximation; BiasGelu is the exact form", gelu)
        if not const_1d(bias, last_dim(x)) or bias.dtype != x.dtype:
            return fail("bias is not a constant vector of x's last-axis size and dtype", bias)
        op_type = "FastGelu" if self.source == "fast" else "BiasGelu"
        return self.choose(context, x, [Lowering(MS, op_type)])

    def rewrite(self, op, x, bias, **_):
        return self.emit(op, x, bias)


def rules(target: str | Target) -> list[pattern.RewriteRule]:
    """Bias+GELU rules; none for tensorrt."""
    if not get_target(target).emits(MS, "BiasGelu", opset=0):
        return []
    out: list[pattern.RewriteRule] = []
    for source in ("onnx", "ms", "fast"):
        out += [BiasGelu.rule(target, source, swap) for swap in (False, True)]
    return out
