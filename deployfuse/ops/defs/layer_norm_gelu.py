"""LayerNormGelu: Y = GELU(LayerNorm(X) · Scale + Bias), statistics over dims axis..-1."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import onnxscript
import torch
import torch.nn.functional as F

from deployfuse.ops.body import Body
from deployfuse.ops.defs._onnxscript import DF, TFloat
from deployfuse.ops.schema import Attr, OpSpec, RandFn, apply_activation


def reference(x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor, *, axis: int, epsilon: float, approximate: str) -> torch.Tensor:
    """Y = GELU((X - mean) / sqrt(var + eps) * Scale + Bias), statistics over dims axis..-1."""
    shape = x.shape[axis % x.dim():]
    y = F.layer_norm(x, shape, scale.reshape(shape), bias.reshape(shape), epsilon)
    return apply_activation(y, "gelu" if approximate == "none" else "gelu_tanh")


def body(b: Body, variant: dict[str, Any]) -> str:
    y = b.op("LayerNormalization", "X", "Scale", "Bias", refs={"axis": "int", "epsilon": "float"})
    return b.gelu(y, variant["approximate"])


def example_inputs(shape: Sequence[int], rand: RandFn, attrs: dict[str, Any]) -> list[Any]:
    """X of `shape`; Scale and Bias over the normalised dims."""
    norm_shape = tuple(shape[attrs.get("axis", -1) % len(shape):])
    return [rand(*shape, scale=2.0, shift=0.5), rand(*norm_shape, shift=1.0), rand(*norm_shape)]


SPEC = OpSpec(
    name="LayerNormGelu",
    inputs=("X", "Scale", "Bias"),
    outputs=("Y",),
    attrs={
        "axis": Attr("int", -1),
        "epsilon": Attr("float", 1e-5),
        "approximate": Attr("string", "none", ("none", "tanh"), variant=True),
    },
    doc="Y = GELU(LayerNorm(X) * Scale + Bias); statistics over dims axis..-1; GELU exact (erf) or its tanh approximation.",
    reference_fn=reference,
    body_fn=body,
    example_fn=example_inputs,
)


@torch.library.custom_op("deployfuse::layer_norm_gelu", mutates_args=())
def torch_op(x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor, axis: int = -1, epsilon: float = 1e-5, approximate: str = "none") -> torch.Tensor:
    """GELU(LayerNorm(x) * scale + bias) over dims axis..-1."""
    return SPEC.reference(x, scale, bias, axis=axis, epsilon=epsilon, approximate=approximate)


@torch_op.register_fake
def _(x, scale, bias, axis=-1, epsilon=1e-5, approximate="none"):
    return torch.empty_like(x)


@onnxscript.script(opset=DF)
def layer_norm_gelu_onnx(x: TFloat, scale: TFloat, bias: TFloat, axis: int = -1, epsilon: float = 1e-5, approximate: str = "none") -> TFloat:
    return DF.LayerNormGelu(x, scale, bias, axis=axis, epsilon=epsilon, approximate=approximate)


to_onnx = layer_norm_gelu_onnx  # the exporter inlines it by name: one name per op
