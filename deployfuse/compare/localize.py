"""Find where a fused graph first departs from its unfused export.

Only the outputs of fused nodes (tagged with metadata `deployfuse.rule`) are marked as extra
graph outputs, in the fused graph and under the same names in the unfused one (the rewriter
keeps the names of a region's outputs). Marking every tensor would stop ORT and the rewriter
from fusing anything, and a fused region's inside has no counterpart anyway. Both graphs run
with ORT graph optimisations off on the same inputs; the first fused node, in topological
order, whose output is outside tolerance is where the difference starts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import onnx

from deployfuse.backends import ort as ort_backend
from deployfuse.compare.accuracy import OutputStats, output_stats
from deployfuse.compare.tolerances import Tolerances

RULE_KEY = "deployfuse.rule"  # the metadata deployfuse.rewrite puts on every node it creates


@dataclass
class Divergence:
    """A fused node whose output differs from the unfused graph's tensor of the same name."""

    node: str
    op_type: str
    domain: str
    rule: str
    tensor: str
    stats: OutputStats

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Localization:
    """What the fused-vs-unfused comparison found."""

    reference: str  # the unfused ONNX file
    fused_nodes: int
    compared: int  # fused-node outputs found in both graphs
    divergences: list[Divergence] = field(default_factory=list)
    note: str = ""

    @property
    def first(self) -> Divergence | None:
        return self.divergences[0] if self.divergences else None

    def to_dict(self) -> dict[str, Any]:
        return {"reference": self.reference, "fused_nodes": self.fused_nodes, "compared": self.compared,
                "divergences": [d.to_dict() for d in self.divergences], "note": self.note}


def fused_nodes(model: onnx.ModelProto) -> list[tuple[onnx.NodeProto, str]]:
    """Top-level nodes made by a fusion rule, with the rule's name, in graph (topological) order."""
    found = []
    for node in model.graph.node:
        rule = next((p.value for p in node.metadata_props if p.key == RULE_KEY), None)
        if rule is not None:
            found.append((node, rule))
    return found


def _produced(model: onnx.ModelProto) -> set[str]:
    return {o for n in model.graph.node for o in n.output if o} | {o.name for o in model.graph.output}


def _with_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """A copy of `model` that also returns `names` (ORT infers their types)."""
    marked = onnx.ModelProto()
    marked.CopyFrom(model)
    present = {o.name for o in marked.graph.output}
    for name in names:
        if name not in present:
            marked.graph.output.append(onnx.ValueInfoProto(name=name))
    return marked


def localize(
    fused: onnx.ModelProto,
    reference: onnx.ModelProto,
    feed: Mapping[str, np.ndarray],
    tolerances: Tolerances,
    reference_name: str = "",
    custom_ops: str | os.PathLike[str] | None = None,
) -> Localization:
    """Compare fused-node outputs of `fused` with the same tensors of `reference` on `feed`."""
    nodes = fused_nodes(fused)
    common = _produced(reference)
    boundary = [(node, rule, out) for node, rule in nodes for out in node.output if out and out in common]
    result = Localization(reference_name, len(nodes), len(boundary))
    if not nodes:
        result.note = "the ONNX model has no fused nodes (none carries deployfuse.rule metadata)"
        return result
    if not boundary:
        result.note = "no fused-node output has a tensor of the same name in the reference graph: was it exported from the same model?"
        return result
    names = list(dict.fromkeys(out for _, _, out in boundary))
    got = ort_backend.run(ort_backend.session(_with_outputs(fused, names), optimize=False, custom_ops_library=custom_ops), feed)
    want = ort_backend.run(ort_backend.session(_with_outputs(reference, names), optimize=False), feed)
    for node, rule, out in boundary:
        ref = want[out]
        atol, rtol = tolerances.for_output(out, str(ref.dtype))
        stats = output_stats(out, ref, got.get(out), atol, rtol)
        if not stats.passed:
            result.divergences.append(Divergence(node.name, node.op_type, node.domain, rule, out, stats))
    if not result.divergences:
        outputs_differ = any(not output_stats(o.name, want[o.name], got.get(o.name), *tolerances.for_output(o.name, str(want[o.name].dtype))).passed
                             for o in reference.graph.output if o.name in want)
        result.note = ("the fused graph departs from the unfused one outside the fused nodes" if outputs_differ
                       else "the fused graph matches the unfused export: the difference is not in a fusion (look at the export or the runtime)")
    return result
