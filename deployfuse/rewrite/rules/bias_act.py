"""Linear epilogue: MatMul / Gemm + bias + activation -> MatMul + deployfuse.BiasAct.

    y = act(x · W + b)   ->   BiasAct(x · W, b, activation)      act ∈ ReLU, SiLU, GELU, GELU-tanh, sigmoid

A Reshape between a Gemm and the activation (GPT-2's Conv1D: addmm on [B·S, H] viewed back
to [B, S, H]) is allowed when it keeps the last axis, since the bias lives on that axis.

The bias add and the activation become one pass over the GEMM output (one kernel on CUDA, a
plugin in TensorRT). Not on ort-cpu: there ORT fuses MatMul + Add into its GEMM itself, and
BiasAct would only run as its function body.
"""

from __future__ import annotations

from onnxscript.rewriter import MatchResult, pattern

from deployfuse.rewrite.rules._activations import activations, gelu20_approximate
from deployfuse.rewrite.rules._common import FusionRule, Lowering, const_1d, either, last_dim
from deployfuse.targets import DEPLOYFUSE, Target, get_target

FAMILY = "bias_act"

class LinearBiasAct(FusionRule):
    """act(MatMul(x, W) + b) or act(Gemm(x, W, b)) -> BiasAct(MatMul / Gemm without C, b)."""

    def __init__(self, target: str | Target, gemm: bool, reshape: bool, activation: str, build) -> None:
        super().__init__(f"bias_act_{activation}", target)
        self.gemm, self.reshape, self.activation, self.build = gemm, reshape, activation, build

    def pattern(self, op, x, w, bias, shape):
        if self.gemm:
            y = op.Gemm(x, w, bias, _allow_other_attributes=True, _outputs=["linear"])
            if self.reshape:
                y = op.Reshape(y, shape, _allow_other_attributes=True, _outputs=["reshaped"])
        else:
            y = either(op.Add, op.MatMul(x, w, _outputs=["linear"]), bias)
        return self.build(op, y)

    def check(self, context, x, w, bias, linear, act_out=None, reshaped=None, **_) -> MatchResult:
        fail = MatchResult().fail
        if act_out is not None and gelu20_approximate(act_out) != ("tanh" if self.activation == "gelu_tanh" else "none"):
            return fail("Gelu-20 approximation differs from this rule's", act_out)
        if self.gemm and linear.producer().attributes.get_float("beta", 1.0) != 1.0:
            return fail("Gemm beta is not 1", linear)
        if not const_1d(bias, last_dim(linear)) or bias.dtype != linear.dtype:
            return fail("bias is not a constant vector of the output's last-axis size and dtype", bias)
        if reshaped is not None and last_dim(reshaped) != last_dim(linear):
            return fail("the Reshape after the Gemm changes the last axis", reshaped)
        return self.choose(context, x, [Lowering(DEPLOYFUSE, "BiasAct")])

    def rewrite(self, op, x, w, bias, linear, shape=None, reshaped=None, **_):
        if self.gemm:
            attrs = {k: a.value for k, a in linear.producer().attributes.items() if k != "beta"}
            y = op.Gemm(x, w, **attrs)
            if reshaped is not None:
                y = op.Reshape(y, shape, **{k: a.value for k, a in reshaped.producer().attributes.items()})
        else:
            y = op.MatMul(x, w)
        return self.emit(op, y, bias, activation=self.activation)


def rules(target: str | Target) -> list[pattern.RewriteRule]:
    """Linear + bias + activation rules for `target` (none on ort-cpu)."""
    out: list[pattern.RewriteRule] = []
    for activation, build in activations(get_target(target).activations.get("bias_act", ())):
        for gemm, reshape in ((False, False), (True, False), (True, True)):
            out.append(LinearBiasAct.rule(target, gemm, reshape, activation, build))
    return out
