"""BiasAct: Y = act(X + Bias), Bias broadcast over the last axis."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import onnxscript
import torch

from deployfuse.ops.body import Body
from deployfuse.ops.defs._onnxscript import DF, TFloat
from deployfuse.ops.schema import ACTIVATIONS, Attr, OpSpec, RandFn, apply_activation


def reference(x: torch.Tensor, bias: torch.Tensor, *, activation: str) -> torch.Tensor:
    """Y = act(X + Bias), Bias broadcast over the last axis."""
    return apply_activation(x + bias, activation)


def body(b: Body, variant: dict[str, Any]) -> str:
    return b.activation(b.op("Add", "X", "Bias"), variant["activation"])


def example_inputs(shape: Sequence[int], rand: RandFn, attrs: dict[str, Any]) -> list[Any]:
    """X of `shape`; Bias over its last axis."""
    return [rand(*shape), rand(shape[-1])]


SPEC = OpSpec(
    name="BiasAct",
    inputs=("X", "Bias"),
    outputs=("Y",),
    attrs={"activation": Attr("string", "gelu", ACTIVATIONS, variant=True)},
    doc="Y = act(X + Bias); Bias has the size of X's last axis.",
    reference_fn=reference,
    body_fn=body,
    example_fn=example_inputs,
)


@torch.library.custom_op("deployfuse::bias_act", mutates_args=())
def torch_op(x: torch.Tensor, bias: torch.Tensor, activation: str = "gelu") -> torch.Tensor:
    """act(x + bias), bias over the last axis."""
    return SPEC.reference(x, bias, activation=activation)


@torch_op.register_fake
def _(x, bias, activation="gelu"):
    return torch.empty_like(x)


@onnxscript.script(opset=DF)
def bias_act_onnx(x: TFloat, bias: TFloat, activation: str = "gelu") -> TFloat:
    return DF.BiasAct(x, bias, activation=activation)


to_onnx = bias_act_onnx  # the exporter inlines it by name: one name per op
