"""The deployfuse ops as `torch.library` custom ops, so users can call the fused math in their
own models and `torch.onnx.export(dynamo=True)` writes each call as one deployfuse node.

    y = torch.ops.deployfuse.bias_act(x, bias, "gelu")
    program = torch.onnx.export(model, args, dynamo=True, custom_translation_table=translation_table())
    attach_functions(program.model_proto)   # store the function bodies

Eager execution runs the PyTorch reference from the op's spec.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional, TypeVar, Union

import onnxscript
import torch
from onnxscript.onnx_types import BFLOAT16, DOUBLE, FLOAT, FLOAT16
from onnxscript.values import Opset

from deployfuse.ops.specs import DOMAIN, SPECS, VERSION

_df = Opset(DOMAIN, VERSION)
TFloat = TypeVar("TFloat", bound=Union[FLOAT, FLOAT16, BFLOAT16, DOUBLE])


@torch.library.custom_op("deployfuse::layer_norm_gelu", mutates_args=())
def layer_norm_gelu(x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor, axis: int = -1, epsilon: float = 1e-5, approximate: str = "none") -> torch.Tensor:
    """GELU(LayerNorm(x) * scale + bias) over dims axis..-1."""
    return SPECS["LayerNormGelu"].reference(x, scale, bias, axis=axis, epsilon=epsilon, approximate=approximate)


@torch.library.custom_op("deployfuse::group_norm_act", mutates_args=())
def group_norm_act(x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor, num_groups: int, epsilon: float = 1e-5, activation: str = "silu") -> torch.Tensor:
    """act(GroupNorm(x) * scale + bias) on NCHW."""
    return SPECS["GroupNormAct"].reference(x, scale, bias, num_groups=num_groups, epsilon=epsilon, activation=activation)


@torch.library.custom_op("deployfuse::bias_act", mutates_args=())
def bias_act(x: torch.Tensor, bias: torch.Tensor, activation: str = "gelu") -> torch.Tensor:
    """act(x + bias), bias over the last axis."""
    return SPECS["BiasAct"].reference(x, bias, activation=activation)


@torch.library.custom_op("deployfuse::fused_mha", mutates_args=())
def fused_mha(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, num_heads: int = 1, scale: float = 0.0, causal: int = 0) -> torch.Tensor:
    """softmax(q kᵀ·s + mask [+ causal]) v per head on [batch, seq, heads·head_dim]."""
    return SPECS["FusedMHA"].reference(q, k, v, mask, num_heads=num_heads, scale=scale, causal=causal)


@layer_norm_gelu.register_fake
def _(x, scale, bias, axis=-1, epsilon=1e-5, approximate="none"):
    return torch.empty_like(x)


@group_norm_act.register_fake
def _(x, scale, bias, num_groups, epsilon=1e-5, activation="silu"):
    return torch.empty_like(x)


@bias_act.register_fake
def _(x, bias, activation="gelu"):
    return torch.empty_like(x)


@fused_mha.register_fake
def _(q, k, v, mask=None, num_heads=1, scale=0.0, causal=0):
    return q.new_empty(q.shape[0], q.shape[1], v.shape[2])


# ----------------------------------------------------------------------------- ONNX translation


@onnxscript.script(opset=_df)
def _layer_norm_gelu_onnx(x: TFloat, scale: TFloat, bias: TFloat, axis: int = -1, epsilon: float = 1e-5, approximate: str = "none") -> TFloat:
    return _df.LayerNormGelu(x, scale, bias, axis=axis, epsilon=epsilon, approximate=approximate)


@onnxscript.script(opset=_df)
def _group_norm_act_onnx(x: TFloat, scale: TFloat, bias: TFloat, num_groups: int, epsilon: float = 1e-5, activation: str = "silu") -> TFloat:
    return _df.GroupNormAct(x, scale, bias, num_groups=num_groups, epsilon=epsilon, activation=activation)


@onnxscript.script(opset=_df)
def _bias_act_onnx(x: TFloat, bias: TFloat, activation: str = "gelu") -> TFloat:
    return _df.BiasAct(x, bias, activation=activation)


@onnxscript.script(opset=_df)
def _fused_mha_onnx(q: TFloat, k: TFloat, v: TFloat, mask: Optional[TFloat] = None, num_heads: int = 1, scale: float = 0.0, causal: int = 0) -> TFloat:
    return _df.FusedMHA(q, k, v, mask, num_heads=num_heads, scale=scale, causal=causal)


def translation_table() -> dict[Any, Callable[..., Any]]:
    """`custom_translation_table` for `torch.onnx.export(dynamo=True)`: each deployfuse torch op
    becomes one deployfuse node (call `attach_functions` on the result)."""
    return {
        torch.ops.deployfuse.layer_norm_gelu.default: _layer_norm_gelu_onnx,
        torch.ops.deployfuse.group_norm_act.default: _group_norm_act_onnx,
        torch.ops.deployfuse.bias_act.default: _bias_act_onnx,
        torch.ops.deployfuse.fused_mha.default: _fused_mha_onnx,
    }
