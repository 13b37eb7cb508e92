"""The deployfuse custom ops, one `OpSpec` each: the single source of truth.

Every `deployfuse.*` node a fusion rule emits is described here once: its inputs, outputs and
attributes (with defaults), the math as a PyTorch reference, and the ONNX function body that
lets any runtime execute the node without the native library (see `deployfuse.ops.functions`).
The native registrations (`plugins/ort_ops.cc`, `plugins/trt_plugins.cpp`) use the same names;
a test ties them together.

Attributes that change the *shape of the math* (an activation name, `causal`, whether the
optional mask is present) are "variants": each combination gets its own function body,
selected through the ONNX node's `overload` field. Numeric attributes (`epsilon`, `axis`,
`num_groups`, `num_heads`, `scale`) reach the body as attribute references.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

DOMAIN = "deployfuse"
VERSION = 1


@dataclass(frozen=True)
class Attr:
    """One node attribute.

    Attributes:
        kind: "int", "float" or "string".
        default: the value when the node omits it; None means the attribute is required.
        choices: the allowed values of a string attribute.
        variant: True when the value selects a different function body (an overload).
    """

    kind: str
    default: Any = None
    choices: tuple[Any, ...] = ()
    variant: bool = False


@dataclass(frozen=True)
class OpSpec:
    """One custom op: schema, reference math and the names the native code registers.

    Attributes:
        name: the ONNX op type (also the TensorRT plugin name).
        inputs: input names in order; those in `optional` may be omitted (only at the end).
        outputs: output names.
        attrs: attribute name -> `Attr`.
        doc: the math, one paragraph.
        reference_fn: PyTorch reference `(tensors..., **attrs) -> Tensor`.
        torch_name: the `torch.library` op, ``deployfuse::<torch_name>``.
    """

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict[str, Attr]
    doc: str
    reference_fn: Callable[..., torch.Tensor]
    torch_name: str
    optional: tuple[str, ...] = field(default=())
    domain: str = DOMAIN
    version: int = VERSION

    def resolve(self, **attrs: Any) -> dict[str, Any]:
        """All attributes with defaults filled in; raises ValueError naming a bad one."""
        unknown = set(attrs) - set(self.attrs)
        if unknown:
            raise ValueError(f"{self.name}: unknown attribute(s) {sorted(unknown)}; known: {sorted(self.attrs)}")
        out: dict[str, Any] = {}
        for key, spec in self.attrs.items():
            value = attrs.get(key, spec.default)
            if value is None:
                raise ValueError(f"{self.name}: attribute {key!r} is required")
            if isinstance(value, bytes):
                value = value.decode()
            if spec.choices and value not in spec.choices:
                raise ValueError(f"{self.name}: {key}={value!r} is not one of {list(spec.choices)}")
            out[key] = value
        return out

    def reference(self, *tensors: torch.Tensor | None, **attrs: Any) -> torch.Tensor:
        """The PyTorch reference, computed in float32 (or float64 input) and returned in the
        dtype of the first input."""
        resolved = self.resolve(**attrs)
        dtype = tensors[0].dtype
        wide = [None if t is None else (t if t.dtype == torch.float64 else t.float()) for t in tensors]
        return self.reference_fn(*wide, **resolved).to(dtype)

    def variant_key(self, attrs: dict[str, Any], present_inputs: int) -> str:
        """The overload name of the function body for these (resolved) attributes, e.g.
        ``activation=gelu``; "" when the op has a single body."""
        parts = [f"{k}={attrs[k]}" for k, a in self.attrs.items() if a.variant]
        parts += [f"{name}={int(i < present_inputs)}" for i, name in enumerate(self.inputs) if name in self.optional]
        return ",".join(parts)


# ----------------------------------------------------------------------------- math


def apply_activation(x: torch.Tensor, name: str) -> torch.Tensor:
    """The activations the ops accept, by the names used in their attributes."""
    if name == "relu":
        return torch.relu(x)
    if name == "gelu":
        return F.gelu(x)
    if name in ("gelu_tanh", "tanh"):
        return F.gelu(x, approximate="tanh")
    if name == "silu":
        return F.silu(x)
    if name == "sigmoid":
        return torch.sigmoid(x)
    if name == "none":
        return x
    raise ValueError(f"unknown activation {name!r}")


def _layer_norm_gelu(x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor, *, axis: int, epsilon: float, approximate: str) -> torch.Tensor:
    """Y = GELU((X - mean) / sqrt(var + eps) * Scale + Bias), statistics over dims axis..-1."""
    shape = x.shape[axis % x.dim():]
    y = F.layer_norm(x, shape, scale.reshape(shape), bias.reshape(shape), epsilon)
    return apply_activation(y, "gelu" if approximate == "none" else "gelu_tanh")


def _group_norm_act(x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor, *, num_groups: int, epsilon: float, activation: str) -> torch.Tensor:
    """Y = act(GroupNorm_G(X) * Scale[c] + Bias[c]) on NCHW (any trailing spatial dims)."""
    return apply_activation(F.group_norm(x, num_groups, scale.flatten(), bias.flatten(), epsilon), activation)


def _bias_act(x: torch.Tensor, bias: torch.Tensor, *, activation: str) -> torch.Tensor:
    """Y = act(X + Bias), Bias broadcast over the last axis."""
    return apply_activation(x + bias, activation)


def _fused_mha(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, *, num_heads: int, scale: float, causal: int) -> torch.Tensor:
    """Y = softmax(Q Kᵀ · s + Mask [+ causal]) V per head; Q/K/V are [B, S, H·D].

    s = scale, or 1/sqrt(D) when scale is 0. causal masks key j > query i (top-left aligned,
    as `torch.nn.functional.scaled_dot_product_attention(is_causal=True)`).
    """
    b, sq, _ = q.shape
    sk = k.shape[1]
    heads = [t.reshape(b, t.shape[1], num_heads, -1).transpose(1, 2) for t in (q, k, v)]
    qh, kh, vh = heads
    s = scale if scale != 0 else 1.0 / math.sqrt(qh.shape[-1])
    scores = (qh * s) @ kh.transpose(-1, -2)
    if mask is not None:
        scores = scores + mask
    if causal:
        allowed = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~allowed, float("-inf"))
    y = torch.softmax(scores, dim=-1) @ vh
    return y.transpose(1, 2).reshape(b, sq, -1)


# ----------------------------------------------------------------------------- the ops

_ACTS = ("relu", "gelu", "gelu_tanh", "silu", "sigmoid")

SPECS: dict[str, OpSpec] = {
    spec.name: spec
    for spec in (
        OpSpec(
            name="LayerNormGelu",
            inputs=("X", "Scale", "Bias"),
            outputs=("Y",),
            attrs={
                "axis": Attr("int", -1),
                "epsilon": Attr("float", 1e-5),
                "approximate": Attr("string", "none", ("none", "tanh"), variant=True),
            },
            doc="Y = GELU(LayerNorm(X) * Scale + Bias); statistics over dims axis..-1; "
            "GELU exact (erf) or its tanh approximation.",
            reference_fn=_layer_norm_gelu,
            torch_name="layer_norm_gelu",
        ),
        OpSpec(
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
            reference_fn=_group_norm_act,
            torch_name="group_norm_act",
        ),
        OpSpec(
            name="BiasAct",
            inputs=("X", "Bias"),
            outputs=("Y",),
            attrs={"activation": Attr("string", "gelu", _ACTS, variant=True)},
            doc="Y = act(X + Bias); Bias has the size of X's last axis.",
            reference_fn=_bias_act,
            torch_name="bias_act",
        ),
        OpSpec(
            name="FusedMHA",
            inputs=("Q", "K", "V", "Mask"),
            optional=("Mask",),
            outputs=("Y",),
            attrs={
                "num_heads": Attr("int"),
                "scale": Attr("float", 0.0),
                "causal": Attr("int", 0, (0, 1), variant=True),
            },
            doc="Y = softmax(Q Kᵀ·s + Mask [+ causal -inf above the diagonal]) V per head; "
            "Q, K, V are [batch, seq, heads·head_dim]; s = scale or 1/sqrt(head_dim) when 0; "
            "Mask is additive, broadcastable to [batch, heads, q_seq, k_seq].",
            reference_fn=_fused_mha,
            torch_name="fused_mha",
        ),
    )
}
