"""GEMM epilogue: MatMul / Gemm with a constant weight + bias [+ activation] -> deployfuse.GemmAct.

    y = act(x · W + b)   ->   GemmAct(x, W, b, activation)      act ∈ none, ReLU, GELU-tanh

W is a constant [K, N], b a constant [N]; x · W + b comes as MatMul + Add or as a Gemm (GPT-2's
Conv1D: addmm on [B·S, K], possibly viewed back to [B, S, N] before the activation, which then
follows the fused node). A Gemm with transB=1 (a 2-D nn.Linear: OPT's MLP on the flattened tokens,
the TorchScript exporter's linear layers) stores Wᵀ [N, K]; GemmAct gets W = (Wᵀ)ᵀ as a new
initializer, unless another node also reads Wᵀ (the weight would then be stored twice).

On CUDA the bias and activation run in cuBLASLt's epilogue, in the GEMM
kernel, with the algorithm `--autotune` picks for the shape (`algo`); ONNX Runtime's MatMul + Add
(or Gemm) needs a second pass for the bias. ort-cuda only: ORT's CPU GEMM takes the bias itself,
and TensorRT fuses GEMM epilogues on its own.

Runs after skip_layernorm (a projection's bias moves into SkipLayerNormalization, in a pass that
runs anyway) and before bias_gelu / bias_act. Exact-erf GELU is not taken: cuBLASLt's GELU is the
tanh form, and the bias epilogue plus a separate exact pass measured slower than ORT's MatMul +
BiasGelu (bench/results/gemm_act_h200.md); so a bias add whose result feeds an activation some
later family fuses with the bias is left to that family.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult, pattern

from deployfuse.rewrite.rules._activations import activations, gelu20_approximate
from deployfuse.rewrite.rules._common import FusionRule, const_1d, either, gemm_trans_b, is_op, stored_once
from deployfuse.targets import MS, Target, get_target

FAMILY = "gemm_act"

# Consumers of a bias add that a later family fuses with the bias (bias_gelu: GELU; bias_act:
# SiLU = x·sigmoid(x), sigmoid): the add stays for them.
_LEFT_FOR_LATER = ("Gelu", "FastGelu", "Sigmoid", "Mul")


def _const_2d(value: ir.Value | None) -> tuple[int, int] | None:
    """The shape of a constant matrix, else None."""
    const = None if value is None else ir.convenience.get_const_tensor(value)
    if const is None or len(const.shape) != 2:
        return None
    return int(const.shape[0]), int(const.shape[1])


class GemmEpilogue(FusionRule):
    """act(MatMul(x, W) + b), act(Gemm(x, W, b)) or act(Reshape(Gemm(x, W, b))) -> GemmAct."""

    def __init__(self, target: str | Target, gemm: bool, reshape: bool, activation: str, build, swap: bool = False) -> None:
        super().__init__("gemm_act" if activation == "none" else f"gemm_act_{activation}", target)
        self.gemm, self.reshape, self.activation, self.build, self.swap = gemm, reshape, activation, build, swap

    def pattern(self, op, x, w, bias, shape):
        if self.gemm:
            y = op.Gemm(x, w, bias, _allow_other_attributes=True, _outputs=["linear"])
            if self.reshape:
                y = op.Reshape(y, shape, _allow_other_attributes=True, _outputs=["reshaped"])
        elif self.build is None:  # a pattern cannot end in a choice: one rule per operand order
            product = op.MatMul(x, w, _outputs=["linear"])
            y = op.Add(bias, product) if self.swap else op.Add(product, bias)
        else:
            y = either(op.Add, op.MatMul(x, w, _outputs=["linear"]), bias)
        return y if self.build is None else self.build(op, y)

    def check(self, context, x, w, bias, linear, act_out=None, reshaped=None, **_) -> MatchResult:
        fail = MatchResult().fail
        if act_out is not None and act_out.producer().domain in ("", "ai.onnx") and gelu20_approximate(act_out) != "tanh":
            return fail("Gelu-20 without approximate='tanh': cuBLASLt's GELU is the tanh form", act_out)
        transposed = self.gemm and gemm_trans_b(linear)
        if self.gemm:
            attrs = linear.producer().attributes
            if attrs.get_int("transA", 0) or attrs.get_float("alpha", 1.0) != 1.0 or attrs.get_float("beta", 1.0) != 1.0:
                return fail("Gemm transposes its A or scales (transA/alpha/beta)", linear)
            if transposed and len(w.uses()) > 1:
                return fail("Gemm's transposed weight (transB=1) is read by other nodes: W would be stored twice", w)
        weight = _const_2d(w)
        if weight is None:
            return fail("the weight is not a constant matrix", w)
        if transposed:
            weight = (weight[1], weight[0])
        if not const_1d(bias, weight[1]) or bias.dtype != x.dtype or w.dtype != x.dtype:
            return fail("bias is not a constant vector of the weight's N and x's dtype", bias)
        if x.shape is None or len(x.shape) < (2 if self.gemm else 1) or x.shape[-1] != weight[0]:
            return fail("x is not [..., K] for the weight's K", x)
        if reshaped is not None and (reshaped.shape is None or len(reshaped.shape) == 0 or reshaped.shape[-1] != weight[1]):
            return fail("the Reshape after the Gemm changes the last axis", reshaped)
        if self.activation == "none":
            out = reshaped if reshaped is not None else (linear if self.gemm else self._sum(linear))
            if out is None or any(user.op_type in _LEFT_FOR_LATER and user.domain in ("", "ai.onnx", MS) for user, _ in out.uses()):
                return fail("the biased output feeds an activation a later family fuses with the bias", out)
        return self.choose(context, x, self.target.lowering(FAMILY))

    @staticmethod
    def _sum(linear: ir.Value) -> ir.Value | None:
        """The output of the bias Add consuming MatMul's `linear` (the one the pattern matched)."""
        adds = [user for user, _ in linear.uses() if is_op(user, "Add")]
        return adds[0].outputs[0] if len(adds) == 1 else None

    def rewrite(self, op, x, w, bias, linear=None, shape=None, reshaped=None, **_):
        if self.gemm and gemm_trans_b(linear):
            stored = ir.convenience.get_const_tensor(w).numpy()
            w = stored_once(op, w.graph, np.ascontiguousarray(stored.T), f"{w.name}_transposed", f"{linear.producer().name}_weight")
        y = self.emit(op, x, w, bias, activation=self.activation)
        if reshaped is not None:
            y = op.Reshape(y, shape, **{k: a.value for k, a in reshaped.producer().attributes.items()})
        return y


def rules(target: str | Target) -> list[pattern.RewriteRule]:
    """GEMM + bias (+ activation) rules for `target` (ort-cuda); activations first, so the plain
    bias rule sees only the adds no activation rule took."""
    target = get_target(target)
    if not target.lowering(FAMILY):
        return []
    out = [GemmEpilogue.rule(target, gemm, reshape, activation, build) for activation, build in activations(target.activations.get(FAMILY, ()))
           for gemm, reshape in ((False, False), (True, False), (True, True))]
    out += [GemmEpilogue.rule(target, False, False, "none", None, swap) for swap in (False, True)]
    return out + [GemmEpilogue.rule(target, True, reshape, "none", None) for reshape in (False, True)]
