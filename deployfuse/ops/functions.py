"""ONNX function bodies for the deployfuse ops, stored in every model that uses them.

With a body in the model, ONNX Runtime (and any other runtime that inlines model-local
functions) executes a `deployfuse.*` node with standard ops when no custom-op library is
loaded. Bodies are written against the model's own default-domain opset (17 or newer), so the
model keeps one opset. String attributes and the optional mask select a body through the
node's `overload` field (ONNX IR >= 10); numeric attributes are attribute references.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import onnx
from onnx import helper

from deployfuse.ops.specs import DOMAIN, SPECS, VERSION, OpSpec

MIN_OPSET = 17  # LayerNormalization
_ATTR_TYPES = {"int": onnx.AttributeProto.INT, "float": onnx.AttributeProto.FLOAT, "string": onnx.AttributeProto.STRING}


class _Body:
    """Collects the nodes of one function body; each call returns the new output's name."""

    def __init__(self, opset: int) -> None:
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []

    def op(self, op_type: str, *inputs: str, refs: dict[str, str] | None = None, **attrs: Any) -> str:
        out = f"_t{len(self.nodes)}"
        node = helper.make_node(op_type, list(inputs), [out], **attrs)
        for key, kind in (refs or {}).items():  # attribute key takes the caller's attribute `key`
            node.attribute.append(onnx.AttributeProto(name=key, ref_attr_name=key, type=_ATTR_TYPES[kind]))
        self.nodes.append(node)
        return out

    def ints(self, *values: int) -> str:
        return self.op("Constant", value_ints=list(values))

    def scalar_like(self, value: float, like: str) -> str:
        return self.op("CastLike", self.op("Constant", value_float=value), like)

    def int_attr(self, name: str) -> str:
        """A scalar int64 tensor holding the caller's int attribute `name`."""
        node = helper.make_node("Constant", [], [f"_t{len(self.nodes)}"])
        node.attribute.append(onnx.AttributeProto(name="value_int", ref_attr_name=name, type=onnx.AttributeProto.INT))
        self.nodes.append(node)
        return node.output[0]

    def float_attr(self, name: str) -> str:
        """A scalar float tensor holding the caller's float attribute `name`."""
        node = helper.make_node("Constant", [], [f"_t{len(self.nodes)}"])
        node.attribute.append(onnx.AttributeProto(name="value_float", ref_attr_name=name, type=onnx.AttributeProto.FLOAT))
        self.nodes.append(node)
        return node.output[0]

    def gelu(self, x: str, approximate: str) -> str:
        """GELU: Gelu-20 where available, else 0.5·x·(1 + erf(x/√2)) or the tanh form
        0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))."""
        if self.opset >= 20:
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
        if name == "relu":
            return self.op("Relu", x)
        if name == "sigmoid":
            return self.op("Sigmoid", x)
        if name == "silu":
            return self.op("Mul", x, self.op("Sigmoid", x))
        if name in ("gelu", "gelu_tanh"):
            return self.gelu(x, "tanh" if name == "gelu_tanh" else "none")
        return self.op("Identity", x)  # "none"


def _layer_norm_gelu(b: _Body, variant: dict[str, Any]) -> str:
    y = b.op("LayerNormalization", "X", "Scale", "Bias", refs={"axis": "int", "epsilon": "float"})
    return b.gelu(y, variant["approximate"])


def _group_norm_act(b: _Body, variant: dict[str, Any]) -> str:
    # GroupNorm = InstanceNorm over X viewed as [N, G, C/G·spatial], then the per-channel affine.
    groups = b.op("Unsqueeze", b.int_attr("num_groups"), b.ints(0))
    grouped = b.op("Reshape", "X", b.op("Concat", b.ints(0), groups, b.ints(-1), axis=0))
    ones = b.op("CastLike", b.op("ConstantOfShape", groups, value=helper.make_tensor("", onnx.TensorProto.FLOAT, [1], [1.0])), "X")
    zeros = b.op("CastLike", b.op("ConstantOfShape", groups), "X")
    normed = b.op("InstanceNormalization", grouped, ones, zeros, refs={"epsilon": "float"})
    shape = b.op("Shape", "X")
    normed = b.op("Reshape", normed, shape)
    spatial_ones = b.op("ConstantOfShape", b.op("Shape", b.op("Slice", shape, b.ints(2), b.ints(2**62))), value=helper.make_tensor("", onnx.TensorProto.INT64, [1], [1]))
    per_channel = b.op("Concat", b.ints(-1), spatial_ones, axis=0)
    y = b.op("Add", b.op("Mul", normed, b.op("Reshape", "Scale", per_channel)), b.op("Reshape", "Bias", per_channel))
    return b.activation(y, variant["activation"])


def _bias_act(b: _Body, variant: dict[str, Any]) -> str:
    return b.activation(b.op("Add", "X", "Bias"), variant["activation"])


def _fused_mha(b: _Body, variant: dict[str, Any]) -> str:
    heads = b.op("Unsqueeze", b.int_attr("num_heads"), b.ints(0))
    split = b.op("Concat", b.ints(0), b.ints(0), heads, b.ints(-1), axis=0)
    q = b.op("Transpose", b.op("Reshape", "Q", split), perm=[0, 2, 1, 3])  # [B, H, Sq, D]
    kt = b.op("Transpose", b.op("Reshape", "K", split), perm=[0, 2, 3, 1])  # [B, H, D, Sk]
    v = b.op("Transpose", b.op("Reshape", "V", split), perm=[0, 2, 1, 3])  # [B, H, Sk, D]
    q_shape = b.op("Shape", q)
    head_dim = b.op("Cast", b.op("Slice", q_shape, b.ints(3), b.ints(4)), to=onnx.TensorProto.FLOAT)
    scale = b.float_attr("scale")
    is_default = b.op("Equal", scale, b.op("Constant", value_float=0.0))
    scale = b.op("Where", is_default, b.op("Reciprocal", b.op("Sqrt", head_dim)), scale)
    scores = b.op("MatMul", b.op("Mul", q, b.op("CastLike", scale, "Q")), kt)
    if variant["Mask"]:
        scores = b.op("Add", scores, "Mask")
    if variant["causal"]:
        kt_shape = b.op("Shape", kt)
        zero, one = b.op("Constant", value_int=0), b.op("Constant", value_int=1)
        q_pos = b.op("Range", zero, b.op("Squeeze", b.op("Slice", q_shape, b.ints(2), b.ints(3)), b.ints(0)), one)
        k_pos = b.op("Range", zero, b.op("Squeeze", b.op("Slice", kt_shape, b.ints(3), b.ints(4)), b.ints(0)), one)
        allowed = b.op("LessOrEqual", k_pos, b.op("Unsqueeze", q_pos, b.ints(1)))  # [Sq, Sk]
        scores = b.op("Where", allowed, scores, b.scalar_like(float("-inf"), "Q"))
    y = b.op("MatMul", b.op("Softmax", scores, axis=-1), v)
    return b.op("Reshape", b.op("Transpose", y, perm=[0, 2, 1, 3]), b.op("Concat", b.ints(0), b.ints(0), b.ints(-1), axis=0))


_BUILDERS = {"LayerNormGelu": _layer_norm_gelu, "GroupNormAct": _group_norm_act, "BiasAct": _bias_act, "FusedMHA": _fused_mha}


def function_body(spec: OpSpec, opset: int, variant: dict[str, Any]) -> onnx.FunctionProto:
    """The FunctionProto of `spec` for one variant (its variant attributes and which optional
    inputs are present), written against default-domain `opset`."""
    if opset < MIN_OPSET:
        raise ValueError(f"deployfuse ops need ONNX opset >= {MIN_OPSET}; the model uses {opset}")
    body = _Body(opset)
    out = _BUILDERS[spec.name](body, variant)
    body.nodes.append(helper.make_node("Identity", [out], [spec.outputs[0]]))
    required = [k for k, a in spec.attrs.items() if a.default is None]
    defaults = [helper.make_attribute(k, a.default) for k, a in spec.attrs.items() if a.default is not None]
    present = [n for n in spec.inputs if n not in spec.optional or variant.get(n)]
    resolved = {k: variant[k] for k, a in spec.attrs.items() if a.variant}
    overload = spec.variant_key({**{k: 0 for k in spec.attrs}, **resolved}, len(present))
    return helper.make_function(
        DOMAIN, spec.name, present, list(spec.outputs), body.nodes, [helper.make_opsetid("", opset)],
        attributes=required, attribute_protos=defaults, doc_string=spec.doc, overload=overload,
    )


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """The graph and every subgraph (If/Loop/Scan bodies) under it."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attr.g)
            for sub in attr.graphs:
                yield from _graphs(sub)


def _default_opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    raise ValueError("the model imports no default-domain ONNX opset")


def attach_functions(model: onnx.ModelProto) -> None:
    """Store a function body for every deployfuse node in `model` (in place).

    Each deployfuse node gets `overload` set to its variant (e.g. ``activation=gelu``); the
    model gets one FunctionProto per (op, variant) used, the ``deployfuse`` opset import, and
    IR version >= 10 (needed for overloads). Idempotent: existing deployfuse functions are
    replaced. Raises ValueError for an unknown deployfuse op or a bad attribute value.
    """
    opset = _default_opset(model)
    wanted: dict[tuple[str, str], tuple[OpSpec, dict[str, Any]]] = {}
    for graph in _graphs(model.graph):
        for node in graph.node:
            if node.domain != DOMAIN:
                continue
            spec = SPECS.get(node.op_type)
            if spec is None:
                raise ValueError(f"unknown deployfuse op {node.op_type!r}; known: {sorted(SPECS)}")
            attrs = spec.resolve(**{a.name: helper.get_attribute_value(a) for a in node.attribute})
            present = len(node.input)
            while present and not node.input[present - 1]:
                present -= 1
            if present < len(spec.inputs) - len(spec.optional) or present > len(spec.inputs):
                raise ValueError(f"{spec.name} node {node.name!r} has {present} inputs; expects {spec.inputs}")
            del node.input[present:]
            node.overload = spec.variant_key(attrs, present)
            variant = {k: v for k, v in attrs.items() if spec.attrs[k].variant}
            variant.update({n: i < present for i, n in enumerate(spec.inputs) if n in spec.optional})
            wanted[(spec.name, node.overload)] = (spec, variant)
    kept = [f for f in model.functions if f.domain != DOMAIN]
    del model.functions[:]
    model.functions.extend(kept)
    model.functions.extend(function_body(spec, opset, variant) for spec, variant in wanted.values())
    if not wanted:
        return
    if not any(imp.domain == DOMAIN for imp in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, VERSION))
    model.ir_version = max(model.ir_version, 10)
