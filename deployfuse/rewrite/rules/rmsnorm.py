"""RMSNorm from its decomposed form -> SimplifiedLayerNormalization / RMSNormalization-23.

    out = γ · x / √(mean(x², -1) + ε)

as LLaMA / T5 / Mistral write it: x · Reciprocal(Sqrt(mean + ε)), x · (1 / Sqrt(·)) or x / Sqrt(·), x² as
Pow(x, 2) or Mul(x, x), optionally inside an fp16 → float → fp16 upcast; the mean's axes come as an
input (opset ≥ 18) or an attribute, and ε may be absent (then 0, as the graph computes).

ONNX Runtime gets its SimplifiedLayerNormalization (stash_type 1: float statistics) at every
opset, 23 included: the skip_layernorm family fuses it with the residual add, and it has CPU and
CUDA kernels for every float type (ORT 1.32's CPU RMSNormalization-23 has no bfloat16 one).
TensorRT gets RMSNormalization-23 from opset 23 and keeps the decomposed form below: its ONNX parser
imports RMSNormalization from 10.15 on (NVIDIA/TensorRT#4639), which an opset-23 model needs
anyway, since the dynamo exporter writes RMSNormalization itself at that opset.
"""

from __future__ import annotations

from onnxscript.rewriter import MatchResult, pattern

from deployfuse.rewrite.rules._common import FusionRule, check_norm_moments, const_1d, last_dim, mean_last, plus_epsilon, scalar
from deployfuse.rewrite.rules.layernorm import DIVISIONS, divide

FAMILY = "rmsnorm"

class DecomposedRmsNorm(FusionRule):
    """The decomposed RMSNorm, one variant per (square form, division form, upcast)."""

    def __init__(self, target: str, square_pow: bool, division: str, upcast: bool) -> None:
        super().__init__("rmsnorm", target)
        self.square_pow, self.division, self.upcast = square_pow, division, upcast

    def pattern(self, op, x, two, eps, scale):
        xf = op.Cast(x, _outputs=["upcast"]) if self.upcast else x
        sq = op.Pow(xf, two) if self.square_pow else op.Mul(xf, xf)
        rms = op.Sqrt(plus_epsilon(op, mean_last(op, sq, "mean_square"), eps))
        y = divide(op, xf, rms, self.division)
        if self.upcast:
            y = op.Cast(y, _outputs=["downcast"])
        return op.Mul(scale, y)

    def check(self, context, x, mean_square, scale, eps=None, two=None, upcast=None, downcast=None, **_) -> MatchResult:
        fail = MatchResult().fail
        failed = check_norm_moments(x, [mean_square], self.square_pow, two, eps, upcast if self.upcast else None, downcast)
        if failed is not None:
            return failed
        if not const_1d(scale, last_dim(x)) or scale.dtype != x.dtype:
            return fail("γ is not a constant vector of the last axis' size and x's dtype", scale)
        self.epsilon = 0.0 if eps is None else scalar(eps)
        return self.choose(context, x, self.target.lowering("rmsnorm"))

    def rewrite(self, op, x, scale, **_):
        extra = {"stash_type": 1} if self.lowering.op_type == "SimplifiedLayerNormalization" else {}
        return self.emit(op, x, scale, axis=-1, epsilon=self.epsilon, **extra)


def rules(target: str) -> list[pattern.RewriteRule]:
    """RMSNorm rules for `target`."""
    out: list[pattern.RewriteRule] = []
    for square_pow in (True, False):
        for division in DIVISIONS:
            for upcast in (False, True):
                out += DecomposedRmsNorm.rule(target, square_pow, division, upcast).commute()
    return out
