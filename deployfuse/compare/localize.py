"""Find where a fused graph first departs from its unfused export.

Only the outputs of fused nodes (tagged with metadata `deployfuse.rule`) are marked as extra
graph outputs, in the fused graph and under the same names in the unfused one (the rewriter
keeps the names of a region's outputs). Marking every tensor would stop ORT and the rewriter
from fusing anything, and a fused region's inside has no counterpart anyway. Both graphs run
with ORT graph optimisations off on the same inputs; the first fused node, in topological
order, whose output is outside tolerance is where the difference starts.

A quantized artefact (int8/fp8: it records its accuracy budget) is localised against that
budget instead of tolerances: the first tensor, in graph order, whose error against the same
tensor of the fp32 graph breaks the budget is where quantization error grows past it.

A fusion is blamed only when the rest of the two graphs agree. When the ONNX file did not
come from this model (other weights, another architecture) everything differs, and the first
fused node is merely the first place that is looked at. So before naming a rule: the unfused
graph's outputs must match PyTorch's, the weights the unfused nodes of both graphs read under
the same name must be equal, and the diverging node's inputs must still agree.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from deployfuse.backends import ort as ort_backend
from deployfuse.compare.accuracy import OutputStats, output_stats
from deployfuse.compare.tolerances import Tolerances
from deployfuse.quantize.gate import Budget

RULE_KEY = "deployfuse.rule"  # the metadata deployfuse.rewrite puts on every node it creates


@dataclass
class Divergence:
    """A fused node whose output differs from the unfused graph's tensor of the same name (in a
    quantized artefact: the node making the first tensor past the accuracy budget)."""

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
    not_this_model: bool = False  # the difference is not a fusion's: the ONNX file does not come from MODEL

    @property
    def first(self) -> Divergence | None:
        return self.divergences[0] if self.divergences and not self.not_this_model else None

    def to_dict(self) -> dict[str, Any]:
        return {"reference": self.reference, "fused_nodes": self.fused_nodes, "compared": self.compared,
                "divergences": [d.to_dict() for d in self.divergences], "note": self.note, "not_this_model": self.not_this_model}

    def rule_out(self, why: str) -> Localization:
        """Blame no fusion: the ONNX file differs from the model before any fused node."""
        self.not_this_model, self.note, self.divergences = True, why, []
        return self


def fused_nodes(model: onnx.ModelProto) -> list[tuple[onnx.NodeProto, str]]:
    """Top-level nodes made by a fusion rule, with the rule's name, in graph (topological) order."""
    found = []
    for node in model.graph.node:
        rule = next((p.value for p in node.metadata_props if p.key == RULE_KEY), None)
        if rule is not None:
            found.append((node, rule))
    return found


def _producers(model: onnx.ModelProto) -> dict[str, str]:
    """Tensor name -> the op type that makes it: two graphs' tensors pair only when both agree."""
    return {out: f"{node.domain}::{node.op_type}" for node in model.graph.node for out in node.output if out}


def _produced(model: onnx.ModelProto) -> set[str]:
    return {o for n in model.graph.node for o in n.output if o} | {o.name for o in model.graph.output}


def with_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """A copy of `model` that also returns `names` (ORT infers their types)."""
    marked = onnx.ModelProto()
    marked.CopyFrom(model)
    present = {o.name for o in marked.graph.output}
    for name in names:
        if name not in present:
            marked.graph.output.append(onnx.ValueInfoProto(name=name))
    return marked


NOT_FROM_MODEL = "the ONNX file was not exported from this model / these weights"


def different_weights(fused: onnx.ModelProto, reference: onnx.ModelProto, names: Collection[str]) -> list[str]:
    """The model weights among `names` (state-dict names, which the exporters give parameters)
    that unfused nodes of `fused` read and that `reference` holds with another shape or other
    values. Fusions leave those nodes and their weights alone, so in an export of the same
    model this is empty. Other initializers (`val_12`) are constants whose names are not stable
    across exports."""
    read = {name for node in fused.graph.node if not any(p.key == RULE_KEY for p in node.metadata_props) for name in node.input}
    ours = {t.name: t for t in fused.graph.initializer if t.name in read and t.name in names}
    differ = []
    for theirs in reference.graph.initializer:
        if theirs.name in ours:
            a, b = numpy_helper.to_array(ours[theirs.name]), numpy_helper.to_array(theirs)
            if a.shape != b.shape or a.dtype != b.dtype or not np.array_equal(a, b, equal_nan=True):
                differ.append(theirs.name)
    return differ


def _check(name: str, want: np.ndarray, got: np.ndarray | None, tolerances: Tolerances) -> OutputStats:
    return output_stats(name, want, got, *tolerances.for_output(name, str(want.dtype)))


def _run_both(model: onnx.ModelProto, reference: onnx.ModelProto, names: list[str], feed: Mapping[str, np.ndarray],
              custom_ops: str | os.PathLike[str] | None) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The tensors `names` as `model` (deployfuse ops on `custom_ops`) and as `reference` compute
    them on `feed`, both with ORT graph optimisations off (which would fuse or rename them)."""
    got = ort_backend.run(ort_backend.session(with_outputs(model, names), optimize=False, custom_ops_library=custom_ops), feed)
    want = ort_backend.run(ort_backend.session(with_outputs(reference, names), optimize=False), feed)
    return got, want


def localize(
    model: onnx.ModelProto,
    reference: onnx.ModelProto,
    feed: Mapping[str, np.ndarray],
    judge: Tolerances | Budget,
    reference_name: str = "",
    custom_ops: str | os.PathLike[str] | None = None,
    expected: Mapping[str, np.ndarray] | None = None,
    weight_names: Collection[str] = (),
) -> Localization:
    """Where `model` departs from `reference` on `feed`: with `Tolerances`, the first fused node
    whose output differs from the unfused graph's tensor of the same name; with a `Budget` (a
    quantized artefact against the fp32 export), the first tensor past it (`_localize_quantized`).

    `expected` (PyTorch's outputs on `feed`) lets it first check that `reference` itself
    matches the model, and `weight_names` (the model's state-dict names) that the weights
    outside the fused nodes are the same; each check is skipped without them (and for a budget).
    """
    if isinstance(judge, Budget):
        return _localize_quantized(model, reference, feed, judge, reference_name, custom_ops)
    fused, tolerances = model, judge
    nodes = fused_nodes(fused)
    common = _produced(reference)
    boundary = [(node, rule, out) for node, rule in nodes for out in node.output if out and out in common]
    result = Localization(reference_name, len(nodes), len(boundary))
    if not nodes:
        result.note = "the ONNX model has no fused nodes (none carries deployfuse.rule metadata)"
        return result
    differ = different_weights(fused, reference, set(weight_names))
    if differ:
        return result.rule_out(f"weights of unfused nodes differ from the reference graph's ({len(differ)}, e.g. {differ[0]}): {NOT_FROM_MODEL}")
    if not boundary:
        return result.rule_out(f"no fused-node output has a tensor of the same name in the reference graph: {NOT_FROM_MODEL}")
    graph_inputs = {i.name for i in fused.graph.input} | {t.name for t in fused.graph.initializer}
    upstream = [i for node, _, _ in boundary for i in node.input if i and i in common and i not in graph_inputs]
    names = list(dict.fromkeys([out for _, _, out in boundary] + upstream))
    got, want = _run_both(fused, reference, names, feed, custom_ops)
    off = [o for o, value in (expected or {}).items() if o in want and not _check(o, np.asarray(value), want[o], tolerances).passed]
    if off:
        return result.rule_out(f"the unfused export already differs from MODEL ({', '.join(off)}): {NOT_FROM_MODEL}")
    for node, rule, out in boundary:
        stats = _check(out, want[out], got.get(out), tolerances)
        if not stats.passed:
            result.divergences.append(Divergence(node.name, node.op_type, node.domain, rule, out, stats))
    first = result.first
    if first is not None and first.stats.reason.startswith("shape"):  # a fusion keeps the shapes of what it replaces
        return result.rule_out(f"tensor {first.tensor} has another shape than in the reference graph ({first.stats.reason}): {NOT_FROM_MODEL}")
    if first is not None:
        node = next(n for n, _, _ in boundary if n.name == first.node)
        producers = _producers(fused), _producers(reference)
        paired = [i for i in node.input if i in names and i in want and producers[0].get(i) == producers[1].get(i)]
        before = [i for i in paired if not _check(i, want[i], got.get(i), tolerances).passed]
        if before:
            return result.rule_out(f"the inputs of {first.node}, the first fused node that differs, already differ ({', '.join(before)}): "
                                   f"the graphs part before any fusion, so {NOT_FROM_MODEL}")
    if not result.divergences:
        outputs_differ = any(not _check(o.name, want[o.name], got.get(o.name), tolerances).passed for o in reference.graph.output if o.name in want)
        result.note = ("the fused graph departs from the unfused one outside the fused nodes" if outputs_differ
                       else "the fused graph matches the unfused export: the difference is not in a fusion (look at the export or the runtime)")
    return result


QUANTIZATION_RULE = "quantization"  # what a Divergence of a quantized artefact blames


def _localize_quantized(quantized: onnx.ModelProto, reference: onnx.ModelProto, feed: Mapping[str, np.ndarray], budget: Budget, reference_name: str,
                        custom_ops: str | os.PathLike[str] | None) -> Localization:
    """The first tensor of `quantized` (in node order) whose error against the same-named tensor
    of `reference` (the fp32 export) breaks `budget`, with the node that makes it.

    Quantizers keep the name of each layer's output, so the quantized graph's layer outputs,
    and the float tensors between them, pair with the fp32 graph's by name. Tensors equal in
    both (masks, constants) are skipped; so are integer tensors.
    """
    graph_inputs = {i.name for i in quantized.graph.input} | {t.name for t in quantized.graph.initializer}
    common = _produced(reference) - graph_inputs
    candidates = [(node, out) for node in quantized.graph.node for out in node.output if out in common]
    names = list(dict.fromkeys(out for _, out in candidates))
    result = Localization(reference_name, 0, len(names))
    if not names:
        return result.rule_out(f"no tensor of the quantized graph has a tensor of the same name in the reference graph: {NOT_FROM_MODEL}")
    got, want = _run_both(quantized, reference, names, feed, custom_ops)
    for node, out in candidates:
        if out not in got or out not in want or not np.issubdtype(want[out].dtype, np.floating) or np.array_equal(want[out], got[out], equal_nan=True):
            continue
        broken = budget.broken_by(out, want[out], got[out])
        if broken:
            stats = output_stats(out, want[out], got[out], 0.0, 0.0)
            stats.passed, stats.reason = False, "; ".join(broken)
            result.divergences.append(Divergence(node.name, node.op_type, node.domain, QUANTIZATION_RULE, out, stats))
            result.note = f"the first tensor past the accuracy budget ({budget.text()}): {out} ({'; '.join(broken)})"
            return result
    result.note = f"every tensor shared with the fp32 graph is within the accuracy budget ({budget.text()}) on this input"
    return result
