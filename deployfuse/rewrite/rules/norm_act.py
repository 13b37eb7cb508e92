"""Normalisation + activation -> deployfuse.LayerNormGelu / deployfuse.GroupNormAct.

    LayerNormGelu:  y = GELU(LayerNorm(x) · γ + β)                 (wav2vec2 feature encoder, ConvNeXt heads)
                    GELU(Transpose(LN(x))) = Transpose(GELU(LN(x)))   (GELU is elementwise: it commutes
                    with any transpose, so convolutional feature extractors that normalise over
                    channels in a transposed view and activate after transposing back fuse too)
    GroupNormAct:   y = act(GroupNorm_G(x) · γ[c] + β[c]), act ∈ SiLU, GELU   (diffusion UNets)

GroupNorm arrives as the exporters write it: Reshape(x, [N, G, -1]) -> InstanceNormalization
(γ=1, β=0) -> Reshape back -> Mul γ[C,1,1] -> Add β[C,1,1]. One pass instead of two (three)
over the activations on GPU; not on ort-cpu, where the op would run as its function body.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult, pattern

from deployfuse.rewrite.rules._activations import activations, gelu20_approximate
from deployfuse.rewrite.rules._common import FusionRule, either
from deployfuse.targets import Target, get_target

FAMILY = "norm_act"

class LayerNormGelu(FusionRule):
    """LayerNormalization(x, γ, β) -> GELU (any spelling) -> LayerNormGelu."""

    def __init__(self, target: str | Target, activation: str, build, name: str = "layernorm_gelu") -> None:
        super().__init__(name, target)
        self.activation, self.build = activation, build

    def pattern(self, op, x, scale, bias):
        y = op.LayerNormalization(x, scale, bias, _allow_other_attributes=True, _outputs=["norm"])
        return self.build(op, y)

    def check(self, context, x, scale, bias, norm, act_out=None, **_) -> MatchResult:
        fail = MatchResult().fail
        if act_out is not None and gelu20_approximate(act_out) != ("tanh" if self.activation == "gelu_tanh" else "none"):
            return fail("Gelu-20 approximation differs from this rule's", act_out)
        node = norm.producer()
        if node.attributes.get_int("stash_type", 1) != 1:
            return fail("LayerNormalization stash_type is not float", node)
        self.attrs = {
            "axis": node.attributes.get_int("axis", -1),
            "epsilon": node.attributes.get_float("epsilon", 1e-5),
            "approximate": "tanh" if self.activation == "gelu_tanh" else "none",
        }
        return self.choose(context, x, self.target.lowering("layernorm_gelu"))

    def rewrite(self, op, x, scale, bias, **_):
        return self.emit(op, x, scale, bias, **self.attrs)


class LayerNormTransposeGelu(LayerNormGelu):
    """LayerNormalization(x, γ, β) -> Transpose -> GELU -> Transpose(LayerNormGelu)."""

    def __init__(self, target: str | Target, activation: str, build) -> None:
        super().__init__(target, activation, build, "layernorm_transpose_gelu")

    def pattern(self, op, x, scale, bias):
        y = op.LayerNormalization(x, scale, bias, _allow_other_attributes=True, _outputs=["norm"])
        return self.build(op, op.Transpose(y, _allow_other_attributes=True, _outputs=["transposed"]))

    def rewrite(self, op, x, scale, bias, transposed, **_):
        perm = transposed.producer().attributes.get_ints("perm")
        fused = self.emit(op, x, scale, bias, **self.attrs)
        return op.Transpose(fused, perm=list(perm)) if perm is not None else op.Transpose(fused)


def _channel_vector(value: ir.Value, channels: int) -> np.ndarray | None:
    """A constant of shape [C, 1, ...] or [C] as a flat [C] array, else None."""
    const = ir.convenience.get_const_tensor(value)
    if const is None:
        return None
    array = np.asarray(const.numpy())
    if array.size != channels or (array.ndim and array.shape[0] != channels):
        return None
    return array.reshape(channels)


class GroupNormAct(FusionRule):
    """Reshape -> InstanceNormalization -> Reshape -> ·γ + β -> act -> GroupNormAct."""

    def __init__(self, target: str | Target, activation: str, build) -> None:
        super().__init__(f"groupnorm_{activation}", target)
        self.activation, self.build = activation, build

    def pattern(self, op, x, grouped_shape, ones, zeros, back_shape, gamma, beta):
        grouped = op.Reshape(x, grouped_shape, _allow_other_attributes=True)
        normed = op.InstanceNormalization(grouped, ones, zeros, _outputs=["inorm"])
        restored = op.Reshape(normed, back_shape, _allow_other_attributes=True, _outputs=["restored"])
        y = either(op.Add, either(op.Mul, restored, gamma), beta)
        return self.build(op, y)

    def check(self, context, x, grouped_shape, ones, zeros, gamma, beta, inorm, restored, act_out=None, **_) -> MatchResult:
        fail = MatchResult().fail
        if act_out is not None and gelu20_approximate(act_out) != "none":
            return fail("GroupNormAct's GELU is the exact form", act_out)
        shape = ir.convenience.get_const_tensor(grouped_shape)
        if x.shape is None or len(x.shape) < 3 or not isinstance(x.shape[1], int):
            return fail("x is not N, C, spatial... with a static C", x)
        channels = x.shape[1]
        if shape is None or shape.size != 3:
            return fail("the first Reshape is not to [N, G, -1]", grouped_shape)
        groups = int(np.asarray(shape.numpy())[1])
        if groups <= 0 or channels % groups:
            return fail(f"{groups} groups do not divide {channels} channels", grouped_shape)
        one, zero = ir.convenience.get_const_tensor(ones), ir.convenience.get_const_tensor(zeros)
        if one is None or zero is None or not (np.all(one.numpy() == 1) and np.all(zero.numpy() == 0)):
            return fail("InstanceNormalization has an affine of its own", [ones, zeros])
        if restored.shape is None or restored.shape != x.shape:
            return fail("the second Reshape does not restore x's shape", restored)
        self.gamma, self.beta = _channel_vector(gamma, channels), _channel_vector(beta, channels)
        if self.gamma is None or self.beta is None or gamma.dtype != x.dtype or beta.dtype != x.dtype:
            return fail("γ / β are not per-channel constants of x's dtype", [gamma, beta])
        self.attrs = {"num_groups": groups, "epsilon": inorm.producer().attributes.get_float("epsilon", 1e-5), "activation": self.activation}
        return self.choose(context, x, self.target.lowering("groupnorm_act"))

    def rewrite(self, op, x, **_):
        scale = op.initializer(ir.tensor(self.gamma), name=f"{x.name}_groupnorm_scale")
        bias = op.initializer(ir.tensor(self.beta), name=f"{x.name}_groupnorm_bias")
        return self.emit(op, x, scale, bias, **self.attrs)


def rules(target: str | Target) -> list[pattern.RewriteRule]:
    """Norm + activation rules, where the target prefers the deployfuse ops (ort-cuda, tensorrt)."""
    out: list[pattern.RewriteRule] = []
    if get_target(target).lowering("layernorm_gelu"):
        out += [rule.rule(target, name, build) for rule in (LayerNormGelu, LayerNormTransposeGelu) for name, build in activations(("gelu", "gelu_tanh"))]
    if get_target(target).lowering("groupnorm_act"):
        out += [GroupNormAct.rule(target, name, build) for name, build in activations(("silu", "gelu"))]
    return out
