"""FP8 embeddings: the token and position lookups feeding the first SkipLayerNormFp8 done by the norm itself (ort-cuda).

    SkipLayerNormFp8(Gather(W, ids) + P, γ, β, bias, s)  ->  SkipLayerNormFp8(W, γ, β, bias, s, Skip=P, Ids=ids)

GPT-2's fp8 export starts with Gather(wte, input_ids), Gather(wpe, positions) (positions 0..S-1, a constant once
folded), their broadcast Add and the first norm, whose input is also the first residual. On the H200 at batch 64 the
Gather took 0.030 ms and the Add 0.0145 ms (0.0054 and 0.0034 at batch 8), plus ~0.5 us of idle time a kernel in the
CUDA graph; with Ids the norm reads row Ids[r] of the table while loading its row, and the position rows as a Skip
broadcast over the batch (`ops.defs.skip_layer_norm_fp8`). Its Sum, W[ids] + P + bias, is then the residual.

Taken: a SkipLayerNormFp8 without Skip or Ids whose X is an Add (read by nothing else but as the residual) of
- a Gather (axis 0) of a constant [V, H] table by int64 ids that only the Add reads, and
- a constant P (or a Gather of a constant table by constant or constant-Range positions, folded into one) whose dims,
  leading 1s dropped, are static trailing dims of the ids' shape and H, and no more than theirs: P broadcasts over the
  leading axes only, and the Add's output is the norm's Ids.shape + [H];
the table and P in one element type, H the norm's, the norm's other inputs computed before the Add (the fused norm
stands in its place). Where the Add's output is read elsewhere (the residual) the norm's Bias must be zeros (Sum then
equals the Add) and those readers read Sum. A norm with such an Add of a Gather is refused otherwise, with the reason;
the other norms (a Skip already, another X) are no candidates. Applied by `fp8_gemm.lower` right after `fp8_norm`, under
its lowering key (`fp8_norm`: ort-cuda only). Ids out of range are clamped by the op where ONNX's Gather fails (a
negative id reads from the end in both).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from deployfuse.ops.defs import skip_layer_norm_fp8
from deployfuse.rewrite.rules import fp8_norm
from deployfuse.rewrite.rules.fp8_mlp import _Graph
from deployfuse.targets import DEPLOYFUSE, Target, get_target

_X, _GAMMA, _BIAS, _SKIP = (skip_layer_norm_fp8.SPEC.inputs.index(name) for name in ("X", "Gamma", "Bias", "Skip"))


def _types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto.Tensor]:
    """The tensor types known of the graph's values (inputs, value_info, outputs)."""
    return {v.name: v.type.tensor_type for v in (*model.graph.input, *model.graph.value_info, *model.graph.output)}


def _is_gather(node: onnx.NodeProto | None) -> bool:
    if node is None or node.op_type != "Gather" or node.domain not in ("", "ai.onnx"):
        return False
    return all(a.name != "axis" or helper.get_attribute_value(a) == 0 for a in node.attribute)


def _positions(g: _Graph, name: str) -> np.ndarray | None:
    """The constant indices `name`: a constant, or a Range of constants."""
    value = g.const(name)
    node = g.node_of(name)
    if value is None and node is not None and node.op_type == "Range" and node.domain in ("", "ai.onnx"):
        bounds = [g.const(i) for i in node.input]
        if all(b is not None for b in bounds):
            value = np.arange(*(np.asarray(b).item() for b in bounds if b is not None))
    return value


def _folded(g: _Graph, name: str) -> np.ndarray | None:
    """The constant value of the Add's other operand: a constant, or a Gather of a constant table by constant positions."""
    value = g.const(name)
    node = g.node_of(name)
    if value is None and _is_gather(node):
        assert node is not None
        table, positions = g.const(node.input[0]), _positions(g, node.input[1])
        if table is not None and positions is not None and positions.dtype.kind in "iu":
            rows = table.shape[0]
            if ((positions >= -rows) & (positions < rows)).all():
                value = np.take(table, positions, axis=0)
    return value


def _lookup(g: _Graph, types: dict[str, onnx.TypeProto.Tensor], add: onnx.NodeProto) -> tuple[onnx.NodeProto, np.ndarray, str] | str:
    """(the word Gather, the folded P, P's operand name) of the Add, or why not."""
    for i in (0, 1):
        gather, other = g.node_of(add.input[i]), add.input[1 - i]
        if not _is_gather(gather):
            continue
        assert gather is not None
        table, skip = g.const(gather.input[0]), _folded(g, other)
        if table is None or table.ndim != 2 or skip is None or skip.ndim < 1:
            continue
        if not g.only_reader(gather.output[0], g.producer[add.output[0]]):
            return "the word lookup is read elsewhere"
        ids = types.get(gather.input[1])
        if ids is None or ids.elem_type != onnx.TensorProto.INT64 or not ids.HasField("shape"):
            return "the ids are not int64 of a known rank"
        if skip.dtype != table.dtype or skip.shape[-1] != table.shape[1]:
            return "the position rows differ from the table in type or width"
        dims = [d.dim_value if d.HasField("dim_value") else None for d in ids.shape.dim] + [table.shape[1]]
        lead = next((k for k, n in enumerate(skip.shape[:-1]) if n != 1), skip.ndim - 1)  # P's leading 1s
        trailing = list(skip.shape[lead:])
        if skip.ndim > len(dims) or dims[len(dims) - len(trailing) :] != trailing:  # more axes than the lookup: the Add's rank
            return f"the position rows {list(skip.shape)} do not broadcast over the leading axes of the ids' {dims[:-1]} only"
        return gather, skip, other
    return "X is not a Gather of a constant table plus a constant (or constant-position lookup)"


def _candidate(g: _Graph, norm: onnx.NodeProto) -> onnx.NodeProto | None:
    """The Add feeding the norm's X where the norm has no Skip and one operand is a Gather (a lookup to take), else None."""
    add = g.node_of(norm.input[_X])
    if (len(norm.input) > _SKIP and any(norm.input[_SKIP:])) or add is None or add.op_type != "Add" or add.domain not in ("", "ai.onnx"):
        return None
    return add if any(_is_gather(g.node_of(name)) for name in add.input) else None


def _taken(
    g: _Graph, model: onnx.ModelProto, types: dict[str, onnx.TypeProto.Tensor], index: int, add: onnx.NodeProto
) -> tuple[onnx.NodeProto, list[int], dict[str, str]] | str:
    """(the SkipLayerNormFp8 `index` with Ids and Skip, to stand in the Add's place (its inputs are constants and the ids,
    so that whatever reads the residual there reads it after it); the other nodes it replaces; renames of the readers of the
    Add's output), or why not."""
    norm = g.nodes[index]
    found = _lookup(g, types, add)
    if isinstance(found, str):
        return found
    gather, skip, other = found
    gamma = g.const(norm.input[_GAMMA])
    if gamma is None or gamma.size != skip.shape[-1]:
        return "Gamma's size is not the table's width"
    at = g.producer[add.output[0]]
    if any(g.producer.get(name, -1) > at for name in norm.input[_GAMMA:_SKIP]):
        return "an input of the norm is computed after the Add, where the fused norm would stand"
    out = add.output[0]
    others = [i for i in g.readers.get(out, []) if i != index]
    total = norm.output[2] if len(norm.output) > 2 else ""
    renames: dict[str, str] = {}
    if others or out in g.outputs:
        bias = g.const(norm.input[_BIAS])
        if bias is None or np.any(bias):
            return "the Add is read elsewhere (the residual) and Bias is not zeros: Sum would differ from it"
        if total and out in g.outputs:
            return "the Add is a graph output and Sum is read"
        renames = {out: total} if total else {}
        total = total or out
    name = f"{norm.name or norm.output[1]}_positions"
    model.graph.initializer.append(numpy_helper.from_array(skip, name))
    inputs = list(norm.input[:_SKIP]) + [name, gather.input[1]]
    inputs[_X] = gather.input[0]
    fused = helper.make_node(norm.op_type, inputs, [norm.output[0], norm.output[1], total], name=norm.name, domain=DEPLOYFUSE)
    fused.attribute.extend(norm.attribute)
    gone = [index, g.producer[gather.output[0]]]
    position = g.node_of(other)
    if position is not None and g.only_reader(other, g.producer[add.output[0]]):  # the folded lookup, and a Range only it reads
        gone.append(g.producer[other])
        indices = g.node_of(position.input[1]) if _is_gather(position) else None
        if indices is not None and g.only_reader(position.input[1], gone[-1]):
            gone.append(g.producer[position.input[1]])
    return fused, gone, renames


def fuse(model: onnx.ModelProto, target: str | Target) -> tuple[onnx.ModelProto, int, list[str]]:
    """`model` with each SkipLayerNormFp8 fed token + position lookups doing them itself (in place, main graph); how many; why
    each one refused was refused ("<node>: <reason>"). A target without the `fp8_norm` lowering gets the model unchanged."""
    if not get_target(target).lowering(fp8_norm.FAMILY):
        return model, 0, []
    g, types = _Graph(model.graph), _types(model)
    replaced: dict[int, onnx.NodeProto] = {}
    gone: set[int] = set()
    renames: dict[str, str] = {}
    refused: list[str] = []
    for index, node in enumerate(g.nodes):
        add = _candidate(g, node) if node.domain == DEPLOYFUSE and node.op_type == skip_layer_norm_fp8.SPEC.name else None
        if add is None:
            continue
        taken = _taken(g, model, types, index, add)
        if isinstance(taken, str):
            refused.append(f"{node.name or node.output[1]}: {taken}")
            continue
        replaced[g.producer[add.output[0]]], removed, more = taken
        gone |= set(removed)
        renames.update(more)
    if replaced:
        nodes = [replaced.get(i, n) for i, n in enumerate(g.nodes) if i not in gone]
        for n in nodes:
            n.input[:] = [renames.get(name, name) for name in n.input]
        used = {name for n in nodes for name in n.input} | g.outputs
        freed = {name for i in (*gone, *replaced) for name in g.nodes[i].input} - used  # the position table, once folded
        dropped = {o for i in (*gone, *replaced) for o in g.nodes[i].output} - {o for n in nodes for o in n.output}
        kept = [t for t in model.graph.initializer if t.name not in freed]
        info = [v for v in model.graph.value_info if v.name not in dropped]
        for field, values in ((model.graph.node, nodes), (model.graph.initializer, kept), (model.graph.value_info, info)):
            del field[:]
            field.extend(values)  # copies each message
    return model, len(replaced), refused
