"""Helpers for writing the ONNX function bodies of the deployfuse ops (one per op variant).

Each op's `body_fn` (in `deployfuse/ops/defs/<op>.py`) gets a `Body` and the variant's values
and adds standard-ONNX nodes over the spec's input names; `deployfuse.ops.functions` wraps the
result into a FunctionProto. Bodies are written against the model's own default-domain opset
(MIN_OPSET or newer), so the model keeps one opset.
"""

from __future__ import annotations

import math
from typing import Any

import onnx
from onnx import helper

MIN_OPSET = 17  # LayerNormalization
_ATTR_TYPES = {"int": onnx.AttributeProto.INT, "float": onnx.AttributeProto.FLOAT, "string": onnx.AttributeProto.STRING}


class Body:
    """Collects the nodes of one function body; each call returns the new output's name."""

    def __init__(self, opset: int) -> None:
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []

    def op(self, op_type: str, *inputs: str, refs: dict[str, str] | None = None, **attrs: Any) -> str:
        """Adds `op_type(inputs, **attrs)`; `refs` maps an attribute to its kind ("int",
        "float", "string") and passes the caller's attribute of that name through."""
        out = f"_t{len(self.nodes)}"
        node = helper.make_node(op_type, list(inputs), [out], **attrs)
        for key, kind in (refs or {}).items():
            node.attribute.append(onnx.AttributeProto(name=key, ref_attr_name=key, type=_ATTR_TYPES[kind]))
        self.nodes.append(node)
        return out

    def ints(self, *values: int) -> str:
        """A constant 1-D int64 tensor."""
        return self.op("Constant", value_ints=list(values))

    def scalar_like(self, value: float, like: str) -> str:
        """A scalar `value` in the element type of `like`."""
        return self.op("CastLike", self.op("Constant", value_float=value), like)

    def filled(self, shape: str, value: float, like: str | None = None) -> str:
        """ConstantOfShape(shape) filled with `value`: in the element type of `like`, or int64
        when `like` is None."""
        if like is None:
            return self.op("ConstantOfShape", shape, value=helper.make_tensor("", onnx.TensorProto.INT64, [1], [int(value)]))
        return self.op("CastLike", self.op("ConstantOfShape", shape, value=helper.make_tensor("", onnx.TensorProto.FLOAT, [1], [value])), like)

    def to_float(self, x: str) -> str:
        """x cast to float32."""
        return self.op("Cast", x, to=onnx.TensorProto.FLOAT)

    def _attr_constant(self, name: str, field: str, kind: int) -> str:
        node = helper.make_node("Constant", [], [f"_t{len(self.nodes)}"])
        node.attribute.append(onnx.AttributeProto(name=field, ref_attr_name=name, type=kind))  # type: ignore[arg-type]  # protobuf enum values are ints
        self.nodes.append(node)
        return node.output[0]

    def int_attr(self, name: str) -> str:
        """A scalar int64 tensor holding the caller's int attribute `name`."""
        return self._attr_constant(name, "value_int", onnx.AttributeProto.INT)

    def float_attr(self, name: str) -> str:
        """A scalar float tensor holding the caller's float attribute `name`."""
        return self._attr_constant(name, "value_float", onnx.AttributeProto.FLOAT)

    def gelu(self, x: str, approximate: str) -> str:
        """GELU: 0.5·x·(1 + erf(x/√2)) (Gelu-20 where available) or the tanh form
        0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), always written out: ONNX Runtime 1.31's CUDA EP
        runs Gelu-20 approximate="tanh" in fp16 at 5.7-8.2e-2 relative error (H200, every optimisation
        level; its CPU EP 2e-4: bench/results/gpu_session_h200.md), so the function body of a tanh-GELU
        op would be wrong there."""
        if self.opset >= 20 and approximate == "none":
            return self.op("Gelu", x, approximate=approximate)
        if approximate == "tanh":
            cube = self.op("Mul", self.op("Mul", x, x), x)
            inner = self.op("Add", x, self.op("Mul", cube, self.scalar_like(0.044715, x)))
            core = self.op("Tanh", self.op("Mul", inner, self.scalar_like(math.sqrt(2.0 / math.pi), x)))
        else:
            core = self.op("Erf", self.op("Mul", x, self.scalar_like(1.0 / math.sqrt(2.0), x)))
        half_x = self.op("Mul", x, self.scalar_like(0.5, x))
        return self.op("Mul", half_x, self.op("Add", core, self.scalar_like(1.0, x)))

    def activation(self, x: str, name: str) -> str:
        """One of `deployfuse.ops.schema.ACTIVATIONS` (or "none") applied to x."""
        if name == "relu":
            return self.op("Relu", x)
        if name == "sigmoid":
            return self.op("Sigmoid", x)
        if name == "silu":
            return self.op("Mul", x, self.op("Sigmoid", x))
        if name in ("gelu", "gelu_tanh"):
            return self.gelu(x, "tanh" if name == "gelu_tanh" else "none")
        return self.op("Identity", x)  # "none"
