"""GroupNormAct: Y = act(GroupNorm_G(X) · Scale[c] + Bias[c]) on NCHW (any trailing spatial dims)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import onnxscript
import torch
import torch.nn.functional as F

from deployfuse.ops.body import Body
from deployfuse.ops.defs._onnxscript import DF, TFloat
from deployfuse.ops.schema import Attr, OpSpec, RandFn, apply_activation


def reference(x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor, *, num_groups: int, epsilon: float, activation: str) -> torch.Tensor:
    """Y = act(GroupNorm_G(X) * Scale[c] + Bias[c]) on NCHW (any trailing spatial dims)."""
    return apply_activation(F.group_norm(x, num_groups, scale.flatten(), bias.flatten(), epsilon), activation)


def body(b: Body, variant: dict[str, Any]) -> str:
    # GroupNorm = InstanceNorm over X viewed as [N, G, C/G·spatial], then the per-channel affine.
    groups = b.op("Unsqueeze", b.int_attr("num_groups"), b.ints(0))
    grouped = b.op("Reshape", "X", b.op("Concat", b.ints(0), groups, b.ints(-1), axis=0))
    normed = b.op("InstanceNormalization", grouped, b.filled(groups, 1.0, "X"), b.filled(groups, 0.0, "X"), refs={"epsilon": "float"})
    shape = b.op("Shape", "X")
    normed = b.op("Reshape", normed, shape)
    spatial_ones = b.filled(b.op("Shape", b.op("Slice", shape, b.ints(2), b.ints(2**62))), 1)
    per_channel = b.op("Concat", b.ints(-1), spatial_ones, axis=0)
    y = b.op("Add", b.op("Mul", normed, b.op("Reshape", "Scale", per_channel)), b.op("Reshape", "Bias", per_channel))
    return b.activation(y, variant["activation"])


def example_inputs(shape: Sequence[int], rand: RandFn, attrs: dict[str, Any]) -> list[Any]:
    """X of `shape` (N, C, spatial...); Scale and Bias per channel."""
    return [rand(*shape, scale=2.0, shift=0.5), rand(shape[1], shift=1.0), rand(shape[1])]


SPEC = OpSpec(
    name="GroupNormAct",
    inputs=("X", "Scale", "Bias"),
    outputs=("Y",),
    attrs={
        "num_groups": Attr("int"),
        "epsilon": Attr("float", 1e-5),
        "activation": Attr("string", "silu", ("silu", "gelu", "none"), variant=True),
    },
    doc="Y = act(GroupNorm(X) * Scale[c] + Bias[c]); X is NCHW (N, C, spatial...), "
    "statistics per (n, group) over C/G channels and all spatial positions.",
    reference_fn=reference,
    body_fn=body,
    example_fn=example_inputs,
)


@torch.library.custom_op("deployfuse::group_norm_act", mutates_args=())
def torch_op(x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor, num_groups: int, epsilon: float = 1e-5, activation: str = "silu") -> torch.Tensor:
    """act(GroupNorm(x) * scale + bias) on NCHW."""
    return SPEC.reference(x, scale, bias, num_groups=num_groups, epsilon=epsilon, activation=activation)


@torch_op.register_fake
def _(x, scale, bias, num_groups, epsilon=1e-5, activation="silu"):
    return torch.empty_like(x)


@onnxscript.script(opset=DF)
def group_norm_act_onnx(x: TFloat, scale: TFloat, bias: TFloat, num_groups: int, epsilon: float = 1e-5, activation: str = "silu") -> TFloat:
    return DF.GroupNormAct(x, scale, bias, num_groups=num_groups, epsilon=epsilon, activation=activation)


to_onnx = group_norm_act_onnx  # the exporter inlines it by name: one name per op
