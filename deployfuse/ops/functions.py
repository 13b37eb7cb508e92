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
    inputs are present), written against default-domain `opset`. Its outputs are the spec's up to the
    last one the body writes (FusedMHA writes YQ only when given YScale)."""
    if opset < MIN_OPSET:
        raise ValueError(f"deployfuse ops need ONNX opset >= {MIN_OPSET}; the model uses {opset}")
    if opset < spec.min_opset:
        raise ValueError(f"{spec.name} needs ONNX opset >= {spec.min_opset}; the model uses {opset}")
    body = Body(opset)
    out = spec.body_fn(body, variant)
    body.nodes.append(helper.make_node("Identity", [out], [spec.outputs[0]]))
    written = {name for node in body.nodes for name in node.output}
    outputs = list(spec.outputs[: max(i for i, name in enumerate(spec.outputs) if name in written) + 1])
    required = [k for k, a in spec.attrs.items() if a.default is None]
    defaults = [helper.make_attribute(k, a.default) for k, a in spec.attrs.items() if a.default is not None]
    present = [n for n in spec.inputs if n not in spec.optional or variant.get(n)]
    formal = list(spec.inputs[: spec.inputs.index(present[-1]) + 1])  # positional: an absent input before a present one stays, unused
    resolved = {k: variant[k] for k, a in spec.attrs.items() if a.variant}
    overload = spec.variant_key({**{k: 0 for k in spec.attrs}, **resolved}, present)
    return helper.make_function(
        DOMAIN, spec.name, formal, outputs, body.nodes, [helper.make_opsetid("", opset)],
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
    nodes: list[tuple[onnx.NodeProto, tuple[str, str]]] = []
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
            given = {n for n, name in zip(spec.inputs, node.input) if name}  # "" names an absent optional input
            node.overload = spec.variant_key(attrs, given)
            variant = {k: v for k, v in attrs.items() if spec.attrs[k].variant}
            variant.update({n: n in given for n in spec.inputs if n in spec.optional})
            wanted[(spec.name, node.overload)] = (spec, variant)
            nodes.append((node, (spec.name, node.overload)))
    bodies = {key: function_body(spec, opset, variant) for key, (spec, variant) in wanted.items()}
    for node, key in nodes:  # ORT inlines a function only with every output named: "" for those the node leaves out
        count = len(bodies[key].output)
        if any(node.output[count:]):
            raise ValueError(f"{node.op_type} node {node.name!r} writes {[o for o in node.output[count:] if o]}, which its inputs do not give")
        del node.output[count:]
        node.output.extend([""] * (count - len(node.output)))
    kept = [f for f in model.functions if f.domain != DOMAIN]
    del model.functions[:]
    model.functions.extend(kept)
    model.functions.extend(bodies.values())
    if not wanted:
        return
    if not any(imp.domain == DOMAIN for imp in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, VERSION))
    model.ir_version = max(model.ir_version, 10)
