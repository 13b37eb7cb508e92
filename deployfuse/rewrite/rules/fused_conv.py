"""Conv + activation -> com.microsoft.FusedConv (ONNX Runtime targets).

    y = act(Conv(x, W, b))      act ∈ ReLU, Sigmoid, Tanh, LeakyReLU(α), ort-cpu only

TensorRT fuses Conv + activation itself, so the tensorrt profile gets nothing here. Nor does
ort-cuda: measured on an H200 (bench/results/h200_*), FusedConv made ResNet-50 fp32 1.6x
slower than ORT's own Conv (6.68 against 4.13 ms, batch 32) and won nothing in fp16.
"""

from __future__ import annotations

from onnxscript.rewriter import MatchResult, pattern

from deployfuse.rewrite.rules._common import FusionRule, Lowering
from deployfuse.targets import MS, Target, get_target

FAMILY = "fused_conv"

class ConvAct(FusionRule):
    """Conv followed by one activation node -> FusedConv(activation=...)."""

    def __init__(self, target: str | Target, activation: str) -> None:
        super().__init__("conv_act", target)
        self.activation = activation

    def pattern(self, op, x, w):
        conv = op.Conv(x, w, _allow_other_inputs=True, _allow_other_attributes=True, _outputs=["conv"])  # bias optional
        return getattr(op, self.activation)(conv, _allow_other_attributes=True, _outputs=["act"])

    def check(self, context, x, conv, act, **_) -> MatchResult:
        self.conv_attrs = {k: a.value for k, a in conv.producer().attributes.items()}
        self.params = []
        if self.activation == "LeakyRelu":
            self.params = [act.producer().attributes.get_float("alpha", 0.01)]
        return self.choose(context, x, [Lowering(MS, "FusedConv")])

    def rewrite(self, op, x, w, conv, **_):
        extra = {"activation_params": self.params} if self.params else {}
        return self.emit(op, *conv.producer().inputs, activation=self.activation, **self.conv_attrs, **extra)


def rules(target: str | Target) -> list[pattern.RewriteRule]:
    """Conv + activation rules for `target` (none for tensorrt)."""
    return [ConvAct.rule(target, act) for act in get_target(target).activations.get("conv_act", ())]
