"""ONNX function bodies for the deployfuse ops, stored in every model that uses them.

Each op writes its body in its own module (`deployfuse/ops/defs/<op>.py`, with the helpers of
`deployfuse.ops.body`); this module wraps one body per variant into a FunctionProto and attaches
the ones a model uses.

With a body in the model, ONNX Runtime (and any other runtime that inlines model-local
functions) executes a `deployfuse.*` node with standard ops when no custom-op library is
loaded. String attributes and the optional mask select a body through the
node's `overload` field (ONNX IR >= 10); numeric attributes are attribute references.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import onnx
from onnx import helper

from deployfuse.io import default_opset
from deployfuse.ops.body import MIN_OPSET, Body
from deployfuse.ops.schema import DOMAIN, VERSION, OpSpec
from deployfuse.ops.specs import SPECS

__all__ = ["MIN_OPSET", "attach_functions", "function_body"]


def function_body(spec: OpSpec, opset: int, variant: dict[str, Any]) -> onnx.FunctionProto:
    """The FunctionProto of `spec` for one variant (its variant attributes and which optional
    inputs are present), written against default-domain `opset`."""
    if opset < MIN_OPSET:
        raise ValueError(f"deployfuse ops need ONNX opset >= {MIN_OPSET}; the model uses {opset}")
    if opset < spec.min_opset:
        raise ValueError(f"{spec.name} needs ONNX opset >= {spec.min_opset}; the model uses {opset}")
    body = Body(opset)
    out = spec.body_fn(body, variant)
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




def attach_functions(model: onnx.ModelProto) -> None:
    """Store a function body for every deployfuse node in `model` (in place).

    Each deployfuse node gets `overload` set to its variant (e.g. ``activation=gelu``); the
    model gets one FunctionProto per (op, variant) used, the ``deployfuse`` opset import, and
    IR version >= 10 (needed for overloads). Idempotent: existing deployfuse functions are
    replaced. Raises ValueError for an unknown deployfuse op or a bad attribute value.
    """
    opset = default_opset(model)
    if opset is None:
        raise ValueError("the model imports no default-domain ONNX opset")
    wanted: dict[tuple[str, str], tuple[OpSpec, dict[str, Any]]] = {}
    for graph in _graphs(model.graph):
        for node in graph.node:
            if node.domain != DOMAIN:
                continue
            spec = SPECS.get(node.op_type)
            if spec is None:
                raise ValueError(f"unknown deployfuse op {node.op_type!r}; known: {sorted(SPECS)}")
            attrs = spec.node_attrs(node)
            present = len(node.input)
            while present and not node.input[present - 1]:
                present -= 1
            if present < len(spec.inputs) - len(spec.optional) or present > len(spec.inputs):
                raise ValueError(f"{spec.name} node {node.name!r} has {present} inputs; expects {spec.inputs}")
            del node.input[present:]
            node.output.extend([""] * (len(spec.outputs) - len(node.output)))  # ORT inlines a function only with every output named
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
