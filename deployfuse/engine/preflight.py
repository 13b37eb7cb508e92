"""Pre-flight: decide, before any building, how TensorRT will take each node.

Every node must be one of
- native: a standard ONNX op the TensorRT ONNX parser imports;
- plugin: a registered plugin named like the op, in the namespace of the node's domain;
- function: a model-local ONNX function, which the parser inlines (its body checked in turn).
Anything else is an offender, reported with what to do about it.

TensorRT's parser looks local functions up by name alone: it ignores the ONNX `overload`
field, so two overloads of one op would silently share one body. `split_overloads` gives each
overload its own function name for the nodes that are not taken by a plugin.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import onnx

from deployfuse.errors import UsageError

STANDARD_DOMAINS = ("", "ai.onnx")
# Domains that come from exporting for ONNX Runtime, and what to do about them.
_HINTS = {
    "com.microsoft": "ONNX Runtime contrib ops come from an ORT target: export with --target tensorrt",
    "ai.onnx.ml": "TensorRT has no importer for ONNX-ML ops",
}


@dataclass(frozen=True)
class Offender:
    """A node TensorRT cannot build, and why."""

    node: str
    op: str
    why: str


@dataclass
class Preflight:
    """How many nodes go each way, by op (`domain.op` for custom domains)."""

    native: Counter[str] = field(default_factory=Counter)
    plugin: Counter[str] = field(default_factory=Counter)
    function: Counter[str] = field(default_factory=Counter)
    offenders: list[Offender] = field(default_factory=list)

    def raise_for_offenders(self) -> None:
        """UsageError listing the offending ops (with up to 3 node names each) and the fix."""
        if not self.offenders:
            return
        by_op: dict[str, list[Offender]] = {}
        for o in self.offenders:
            by_op.setdefault(o.op, []).append(o)
        parts = []
        for op, nodes in by_op.items():
            names = ", ".join(n.node for n in nodes[:3]) + (", ..." if len(nodes) > 3 else "")
            parts.append(f"{op} x{len(nodes)} ({names}): {nodes[0].why}")
        raise UsageError(f"{len(self.offenders)} node(s) TensorRT cannot build: " + "; ".join(parts))


def op_name(node: onnx.NodeProto) -> str:
    """`Conv` for standard ops, `deployfuse.BiasAct` for the rest."""
    return node.op_type if node.domain in STANDARD_DOMAINS else f"{node.domain}.{node.op_type}"


def check_nodes(model: onnx.ModelProto, supports_operator: Callable[[str], bool], plugins: set[tuple[str, str]]) -> Preflight:
    """Classify every node of the graph, its subgraphs and the bodies of the functions it uses."""
    functions = {(f.domain, f.name, f.overload): f for f in model.functions}
    result = Preflight()
    seen_functions: set[tuple[str, str, str]] = set()

    def visit(nodes: Iterator[onnx.NodeProto]) -> None:
        for node in nodes:
            op, key = op_name(node), (node.domain, node.op_type, node.overload)
            if node.domain in STANDARD_DOMAINS and supports_operator(node.op_type):
                result.native[op] += 1
            elif (node.op_type, node.domain) in plugins:
                result.plugin[op] += 1
            elif key in functions and node.domain not in STANDARD_DOMAINS:
                result.function[op] += 1
                if key not in seen_functions:
                    seen_functions.add(key)
                    visit(walk_nodes(functions[key].node))
            elif node.domain in STANDARD_DOMAINS:
                result.offenders.append(Offender(node.name, op, "TensorRT's ONNX parser has no importer for it"))
            else:
                hint = _HINTS.get(node.domain,
                        f"no plugin named {node.op_type!r} in namespace {node.domain!r} is loaded and the model has no function body for it; load its library with --plugins LIB")
                result.offenders.append(Offender(node.name, op, hint))

    visit(walk_nodes(model.graph.node))
    return result


def split_overloads(model: onnx.ModelProto, plugins: set[tuple[str, str]]) -> bool:
    """Rename each overloaded function to `<name>__<overload>` and point its nodes there.

    Nodes a plugin takes keep their op name (the plugin reads the attributes itself).
    Edits `model` in place; returns whether anything changed.
    """
    renamed = {(f.domain, f.name, f.overload): f"{f.name}__{f.overload}" for f in model.functions if f.overload}
    if not renamed:
        return False
    for f in model.functions:
        if f.overload:
            f.name, f.overload = renamed[(f.domain, f.name, f.overload)], ""
    for node in walk_nodes(model.graph.node, *(f.node for f in model.functions)):
        new = renamed.get((node.domain, node.op_type, node.overload))
        if new is not None and (node.op_type, node.domain) not in plugins:
            node.op_type, node.overload = new, ""
    return True


def walk_nodes(*node_lists: Iterator[onnx.NodeProto]) -> Iterator[onnx.NodeProto]:
    """Nodes in order, each followed by the nodes of its subgraphs (If / Loop / Scan bodies)."""
    for nodes in node_lists:
        for node in nodes:
            yield node
            for attr in node.attribute:
                graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
                for graph in graphs:
                    yield from walk_nodes(graph.node)
