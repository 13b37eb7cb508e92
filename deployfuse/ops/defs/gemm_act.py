"""GemmAct: Y = act(X @ W + Bias [+ Residual]), a GEMM with its epilogue fused (cuBLASLt on CUDA)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

import onnxscript
import torch

from deployfuse.ops.body import Body
from deployfuse.ops.defs._onnxscript import DF, TFloat
from deployfuse.ops.schema import Attr, OpSpec, RandFn, apply_activation

GEMM_ACTIVATIONS = ("none", "relu", "gelu_tanh")
"""The activations cuBLASLt's epilogues compute inside the GEMM (its GELU is the tanh form).
Exact-erf GELU is not one: as the bias epilogue plus a separate exact pass it measured 0.75-0.92x
of ONNX Runtime's MatMul + BiasGelu on the H200 (bench/results/gemm_act_h200.md), so MatMul + bias +
exact GELU stays with the bias_gelu / bias_act families."""


def reference(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor | None = None, *, activation: str, algo: int) -> torch.Tensor:
    """Y = act(X @ W + Bias [+ Residual]); X [..., K], W [K, N], Bias [N], Residual [..., N].

    The residual is added before the activation (cuBLASLt's beta·C term); `algo` only picks
    the kernel, never the math."""
    y = x @ w + bias
    if residual is not None:
        y = y + residual
    return apply_activation(y, activation)


def body(b: Body, variant: dict[str, Any]) -> str:
    y = b.op("Add", b.op("MatMul", "X", "W"), "Bias")
    if variant["Residual"]:
        y = b.op("Add", y, "Residual")
    return b.activation(y, variant["activation"])


def example_inputs(shape: Sequence[int], rand: RandFn, attrs: dict[str, Any]) -> list[Any]:
    """shape = (*X's shape, N): X [..., K], W [K, N] scaled by 1/sqrt(K), Bias [N]; a
    Residual [..., N] when attrs["mask"] (the tests' flag for "give the optional input")."""
    *lead, k, n = shape
    residual = rand(*lead, n) if attrs.get("mask") else None
    return [rand(*lead, k), rand(k, n, scale=float(k) ** -0.5), rand(n), residual]


SPEC = OpSpec(
    name="GemmAct",
    inputs=("X", "W", "Bias", "Residual"),
    optional=("Residual",),
    outputs=("Y",),
    attrs={
        "activation": Attr("string", "none", GEMM_ACTIVATIONS, variant=True),
        "algo": Attr("int", -1),
    },
    doc="Y = act(X @ W + Bias [+ Residual]); X [..., K], W [K, N] (a constant weight), Bias [N], "
    "Residual [..., N] added before the activation; algo: -1 = the cuBLASLt heuristic's first "
    "choice, k >= 0 = its k-th candidate (chosen by timing on the target GPU; the first when the "
    "GPU offers fewer), never a change of the math.",
    reference_fn=reference,
    body_fn=body,
    example_fn=example_inputs,
    tf32=True,
)


@torch.library.custom_op("deployfuse::gemm_act", mutates_args=())
def torch_op(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor | None = None, activation: str = "none", algo: int = -1) -> torch.Tensor:
    """act(x @ w + bias [+ residual]) with w [K, N]."""
    return SPEC.reference(x, w, bias, residual, activation=activation, algo=algo)


@torch_op.register_fake
def _(x, w, bias, residual=None, activation="none", algo=-1):
    return x.new_empty(*x.shape[:-1], w.shape[-1])


@onnxscript.script(opset=DF)
def gemm_act_onnx(x: TFloat, w: TFloat, bias: TFloat, residual: Optional[TFloat] = None, activation: str = "none", algo: int = -1) -> TFloat:  # noqa: UP045 (onnxscript reads the annotation)
    return DF.GemmAct(x, w, bias, residual, activation=activation, algo=algo)


to_onnx = gemm_act_onnx  # the exporter inlines it by name: one name per op
