"""Residual add + LayerNorm / RMSNorm -> com.microsoft SkipLayerNormalization / SkipSimplifiedLayerNormalization.

    s = x + skip [+ b];   out = LayerNorm(s) · γ + β      (or RMSNorm(s) · γ)

The residual sum s stays available as the op's 4th output, so pre-norm models (GPT-2, LLaMA)
whose residual stream continues past the norm fuse too, on CUDA. On ort-cpu only post-norm
sums (no other consumer, BERT) fuse: with the sum as an output, ViT-B and GPT-2 ran 3-4 %
slower than Add + LayerNormalization (bench/cpu_fusion.py). A bias b added to x first (the
projection's bias in BERT) moves into the op. ONNX Runtime targets only: TensorRT gets plain
LayerNormalization-17 and fuses the add itself.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import MatchResult, pattern

from deployfuse.rewrite.rules._common import FusionRule, Lowering, const_1d, last_dim
from deployfuse.targets import MS, ORT_CPU, Target, get_target

FAMILY = "skip_layernorm"


def _same_shape(a: ir.Value, b: ir.Value) -> bool:
    return a.shape is not None and b.shape is not None and len(a.shape) in (2, 3) and a.shape == b.shape


class SkipNorm(FusionRule):
    """Add (+ bias) feeding LayerNormalization (rms=False) or SimplifiedLayerNormalization (rms=True)."""

    def __init__(self, target: str | Target, rms: bool, has_beta: bool, has_bias: bool) -> None:
        super().__init__("skip_rmsnorm" if rms else "skip_layernorm", target)
        self.rms, self.has_beta, self.has_bias = rms, has_beta, has_bias

    def pattern(self, op, x, skip, bias, gamma, beta):
        if self.has_bias:
            x = op.Add(x, bias)
        total = op.Add(x, skip, _outputs=["total"])
        if self.rms:
            norm = op.SimplifiedLayerNormalization(total, gamma, _allow_other_attributes=True, _outputs=["norm"])
        elif self.has_beta:
            norm = op.LayerNormalization(total, gamma, beta, _allow_other_attributes=True, _outputs=["norm"])
        else:
            norm = op.LayerNormalization(total, gamma, _allow_other_attributes=True, _outputs=["norm"])
        return norm, total

    def check(self, context, x, skip, gamma, norm, total, bias=None, beta=None, **_) -> MatchResult:
        fail = MatchResult().fail
        node = norm.producer()
        if len(node.outputs) > 1 and any(o.uses() for o in node.outputs[1:]):
            return fail("the norm's mean / inv-std outputs are used", node)
        rank = len(total.shape) if total.shape is not None else None
        axis = node.attributes.get_int("axis", -1)
        if rank is None or axis not in (-1, rank - 1):
            return fail(f"the norm is over axis {axis}, not the last one", node)
        if node.attributes.get_int("stash_type", 1) != 1:
            return fail("the norm's stash_type is not float", node)
        if self.target == ORT_CPU and len(total.uses()) > 1:
            return fail("the residual sum has other consumers: on CPU that form measured slower", total)
        if not _same_shape(x, skip):
            return fail(f"input {x.shape} and skip {skip.shape} are not the same [B, S, H] / [N, H] shape", [x, skip])
        size = last_dim(x)
        if size is None:
            return fail("hidden size is not static", x)
        for name, v in (("γ", gamma), ("β", beta), ("bias", bias)):
            if v is not None and not const_1d(v, size):
                return fail(f"{name} is not a constant vector of the hidden size", v)
        self.epsilon = node.attributes.get_float("epsilon", 1e-5)
        op_type = "SkipSimplifiedLayerNormalization" if self.rms else "SkipLayerNormalization"
        return self.choose(context, x, [Lowering(MS, op_type)])

    def rewrite(self, op, x, skip, gamma, bias=None, beta=None, **_):
        if self.rms:
            inputs = [x, skip, gamma, bias]
        else:
            inputs = [x, skip, gamma, beta, bias]
        while inputs[-1] is None:
            inputs.pop()
        out, _mean, _inv_std, total = self.emit(op, *inputs, epsilon=self.epsilon, _outputs=4)
        return out, total


def rules(target: str | Target) -> list[pattern.RewriteRule]:
    """Skip-norm rules; none for a target without the com.microsoft skip norms (tensorrt)."""
    if not get_target(target).emits(MS, "SkipLayerNormalization", opset=0):
        return []
    out: list[pattern.RewriteRule] = []
    for has_bias in (True, False):
        out += SkipNorm.rule(target, False, True, has_bias).commute()
        out += SkipNorm.rule(target, False, False, has_bias).commute()
        out += SkipNorm.rule(target, True, False, has_bias).commute()
    return out
