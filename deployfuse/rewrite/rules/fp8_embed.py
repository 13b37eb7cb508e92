"""FP8 embeddings: the word lookup feeding the first SkipLayerNormFp8, and its constant terms, done by the norm itself (ort-cuda).

    SkipLayerNormFp8(Gather(W, ids) + C1 + ... + Ck + K1 + ... + Km [, Skip=Km+1], γ, β, bias, s)
        ->  SkipLayerNormFp8(W, γ, β, bias, s, Skip=K1 + ... + Km+1 + P, Ids=ids),   P = C1 + ... + Ck

the Cs constant (summed in float64, P rounded once to the table's type), the Ks terms left computed ([*ids.shape, H]).
GPT-2's fp8 export starts with Gather(wte, input_ids), Gather(wpe, positions) (positions 0..S-1, a constant once
folded), their broadcast Add and the first norm, whose input is also the first residual. BERT's adds a token-type
lookup: without a token_type_ids input HF reads its buffer of zeros, Gather(T, Expand(GatherElements(zeros, 0..S-1),
[B, S])), not folded because the Expand follows the dynamic batch; every token then reads T[0], a constant row. On the
H200 at batch 64 GPT-2's Gather took 0.030 ms and the Add 0.0145 ms (0.0054 and 0.0034 at batch 8), plus ~0.5 us of idle
time a kernel in the CUDA graph; with Ids the norm reads row Ids[r] of the table while loading its row, and P as a Skip
broadcast over the batch (`ops.defs.skip_layer_norm_fp8`). Its Sum, W[ids] + Skip + bias, is then the residual. With a
token_type_ids input (or RoBERTa's positions, computed from the ids, already the norm's Skip) that lookup stays and the
Skip is it plus P: one Gather and one Add saved instead of two of each.

Taken: a SkipLayerNormFp8 without Ids whose X is a sum of Adds (each inner sum read only by the next Add; the last one
read by nothing else but as the residual), the terms of that sum and the norm's Skip being
- the word lookup: a Gather (axis 0) of a constant [V, H] table by int64 ids that only its Add reads (of several
  lookups by ids not constant, the one of the largest table);
- constants C: a constant; a Gather of a constant table by constant or constant-Range positions (folded); a Gather of
  a constant table by all-zero ids (a constant of zeros moved only by ops that pick or repeat elements: Expand,
  GatherElements, Slice, ...) whose shape is declared to broadcast into the word ids' (row T[0]);
- terms K declared [*ids.shape, H] (same sizes or symbols) of the table's type: kept, summed into the Skip by Adds;
one C or K at least, P's dims, leading 1s dropped, static trailing dims of the ids' shape and H, and no more than
theirs (P broadcasts over the leading axes only, and the sum is the norm's Ids.shape + [H]); the table and each C in
one element type, H the norm's. The fused norm stands in the last Add's place, or after the latest of the norm's other
inputs and the Ks; where the Add's output is read elsewhere (the residual) its readers come after that, the norm's Bias
must be zeros (Sum then equals the Add) and those readers read Sum. Refused, with the reason: a term that is neither
(BERT's positions with a dynamic sequence axis: Gather by a Slice of the buffer to S, [1, Min(N, S), H]), P over an
axis the ids' shape does not fix statically, the residual read before the norm could stand, Bias not zeros under a
read residual. Norms with Ids, or whose X is no sum with a Gather, are no candidates. Applied by `fp8_gemm.lower` right
after `fp8_norm`, under its lowering key (`fp8_norm`: ort-cuda only). Ids out of range are clamped by the op where
ONNX's Gather fails (a negative id reads from the end in both).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import onnx
from onnx import helper, numpy_helper

from deployfuse.ops.defs import skip_layer_norm_fp8
from deployfuse.rewrite.rules import fp8_norm
from deployfuse.rewrite.rules.fp8_mlp import _Graph
from deployfuse.targets import DEPLOYFUSE, Target, get_target

_X, _GAMMA, _BIAS, _SKIP, _IDS = (skip_layer_norm_fp8.SPEC.inputs.index(name) for name in ("X", "Gamma", "Bias", "Skip", "Ids"))
# Ops whose output holds only elements of their first input (picked, repeated or reshaped), whatever the other inputs.
_PICKING = frozenset({"Expand", "GatherElements", "Gather", "Slice", "Reshape", "Unsqueeze", "Squeeze", "Identity", "Tile", "Flatten"})


def _types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto.Tensor]:
    """The tensor types known of the graph's values (inputs, value_info, outputs)."""
    return {v.name: v.type.tensor_type for v in (*model.graph.input, *model.graph.value_info, *model.graph.output)}


def _dims(types: dict[str, onnx.TypeProto.Tensor], name: str) -> list[int | str] | None:
    """The declared dims of `name` (a size, a symbol's name, or "" where neither), None where its rank is unknown."""
    tensor = types.get(name)
    if tensor is None or not tensor.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in tensor.shape.dim]


def _is_op(node: onnx.NodeProto | None, op_type: str) -> bool:
    return node is not None and node.op_type == op_type and node.domain in ("", "ai.onnx")


def _is_gather(node: onnx.NodeProto | None) -> bool:
    if not _is_op(node, "Gather"):
        return False
    assert node is not None
    return all(a.name != "axis" or helper.get_attribute_value(a) == 0 for a in node.attribute)


def _positions(g: _Graph, name: str) -> np.ndarray | None:
    """The constant indices `name`: a constant, or a Range of constants."""
    value = g.const(name)
    node = g.node_of(name)
    if value is None and _is_op(node, "Range"):
        assert node is not None
        bounds = [g.const(i) for i in node.input]
        if all(b is not None for b in bounds):
            value = np.arange(*(np.asarray(b).item() for b in bounds if b is not None))
    return value


def _all_zero(g: _Graph, name: str, depth: int = 0) -> bool:
    """True when `name` is all zeros: a constant of zeros moved only by ops that pick or repeat elements of their first
    input (HF BERT's token_type_ids buffer, where the caller passes none)."""
    value = g.const(name)
    if value is not None:
        return value.size > 0 and not value.any()
    node = g.node_of(name)
    return node is not None and node.domain in ("", "ai.onnx") and node.op_type in _PICKING and depth < 8 and _all_zero(g, node.input[0], depth + 1)


def _folded(g: _Graph, name: str) -> np.ndarray | None:
    """The constant value of a term: a constant, or a Gather of a constant table by constant positions."""
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


def _terms(g: _Graph, add: onnx.NodeProto) -> list[tuple[str, int]]:
    """(operand, the Add reading it) of the tree of Adds that computes `add`'s output, each inner sum read only by its Add."""
    out: list[tuple[str, int]] = []
    pending = [add]
    while pending:
        node = pending.pop()
        at = g.producer[node.output[0]]
        for name in node.input:
            inner = g.node_of(name)
            if _is_op(inner, "Add") and g.only_reader(name, at):
                assert inner is not None
                pending.append(inner)
            else:
                out.append((name, at))
    return out


def _table(g: _Graph, name: str) -> np.ndarray | None:
    """The table of the Gather computing `name` where it is a constant of 2 dims."""
    node = g.node_of(name)
    table = g.const(node.input[0]) if node is not None and _is_gather(node) else None
    return table if table is not None and table.ndim == 2 else None


def _broadcasts_into(small: list[int | str] | None, big: list[int | str]) -> bool:
    """True when dims `small` are declared to broadcast into `big` without growing it (each 1 or the same size or symbol)."""
    if small is None or len(small) > len(big):
        return False
    return all(a == 1 or (a == b and a != "") for a, b in zip(small, big[len(big) - len(small) :]))


class _Split(NamedTuple):
    """The norm's sum taken apart: the word lookup, P (the constant terms summed, None where none), the terms left to
    compute (summed into the Skip), the inner Adds."""

    gather: onnx.NodeProto
    width: int
    constant: np.ndarray | None
    kept: list[str]
    inner: list[int]


def _split(g: _Graph, types: dict[str, onnx.TypeProto.Tensor], add: onnx.NodeProto, norm: int) -> _Split | str:
    """The terms of the norm's sum (X's Adds, and the norm's Skip) taken apart, or why not."""
    skip = g.nodes[norm].input[_SKIP] if len(g.nodes[norm].input) > _SKIP else ""
    terms = _terms(g, add) + ([(skip, norm)] if skip else [])
    constants = {name: _folded(g, name) for name, _ in terms}
    tables = {name: _table(g, name) for name, _ in terms if constants[name] is None}
    lookups = {name: table for name, table in tables.items() if table is not None}
    words = [name for name in lookups if not _all_zero(g, g.nodes[g.producer[name]].input[1])]
    if not words:
        return "X is a sum of no Gather of a constant table by ids"
    word = max(words, key=lambda name: lookups[name].shape[0])  # the larger table
    gather, table = g.nodes[g.producer[word]], lookups[word]
    if not g.only_reader(word, dict(terms)[word]):
        return "the word lookup is read elsewhere"
    ids = _dims(types, gather.input[1])
    if ids is None or types[gather.input[1]].elem_type != onnx.TensorProto.INT64:
        return "the ids are not int64 of a known rank"
    whole = [*ids, table.shape[1]]  # the sum's shape, declared
    kept: list[str] = []
    for name, _ in terms:
        if name == word or constants[name] is not None:
            continue
        if name in lookups and name not in words:
            lookup = g.nodes[g.producer[name]]
            if not _broadcasts_into(_dims(types, lookup.input[1]), ids):
                return "a lookup by all-zero ids is not declared to broadcast into the word ids' shape"
            constants[name] = lookups[name][0]  # every token reads row 0
        elif _dims(types, name) == whole and "" not in whole and types[name].elem_type == helper.np_dtype_to_tensor_dtype(table.dtype):
            kept.append(name)  # a token-type lookup by an input, RoBERTa's positions: the Skip reads it
        else:
            return f"a term of the sum is neither the word lookup, a constant, nor declared {whole} of the table's type (positions sliced to a dynamic sequence length?)"
    values = [value for name, _ in terms if (value := constants[name]) is not None]  # each as often as it is added
    if any(value.dtype != table.dtype or value.ndim < 1 or value.shape[-1] != table.shape[1] for value in values):
        return "the constant rows differ from the table in type or width"
    if not values and not kept:
        return "the sum has no term but the word lookup"
    try:
        constant = np.asarray(sum(value.astype(np.float64) for value in values)).astype(table.dtype) if values else None
    except ValueError:
        return "the constant terms do not broadcast together"
    if constant is not None:
        lead = next((k for k, n in enumerate(constant.shape[:-1]) if n != 1), constant.ndim - 1)  # P's leading 1s
        trailing = list(constant.shape[lead:])
        if constant.ndim > len(whole) or whole[len(whole) - len(trailing) :] != trailing:  # more axes than the lookup: the Add's rank
            return f"the constant rows {list(constant.shape)} do not broadcast over the leading axes of the ids' {whole[:-1]} only"
    return _Split(gather, table.shape[1], constant, kept, sorted({at for _, at in terms} - {g.producer[add.output[0]], norm}))


def _candidate(g: _Graph, norm: onnx.NodeProto) -> onnx.NodeProto | None:
    """The Add feeding the norm's X where the norm has no Ids and a term of its sum is a Gather (a lookup to take), else None."""
    add = g.node_of(norm.input[_X])
    if (len(norm.input) > _IDS and norm.input[_IDS]) or add is None or not _is_op(add, "Add"):
        return None
    return add if any(_is_gather(g.node_of(name)) for name, _ in _terms(g, add)) else None


def _unread(g: _Graph, gone: set[int], terms: list[str], kept: set[str]) -> set[int]:
    """The producers of `terms`, and the nodes they read, that nothing outside `gone` (or them) reads once the nodes in
    `gone` are removed: the folded lookups, their positions and the all-zero ids' Expands. `kept`: values still read."""
    cone: set[int] = set()
    pending = [g.producer[name] for name in terms if name in g.producer]
    while pending:
        index = pending.pop()
        if index not in cone:
            cone.add(index)
            pending += [g.producer[name] for name in g.nodes[index].input if name in g.producer]
    dead = set(gone)
    for index in sorted(cone, reverse=True):  # readers (later in the graph) decided before what they read
        outputs = [o for o in g.nodes[index].output if o]
        if not any(o in kept or o in g.outputs or any(r not in dead for r in g.readers.get(o, [])) for o in outputs):
            dead.add(index)
    return dead - gone


def _taken(
    g: _Graph, model: onnx.ModelProto, types: dict[str, onnx.TypeProto.Tensor], index: int, add: onnx.NodeProto
) -> tuple[int, list[onnx.NodeProto], set[int], dict[str, str]] | str:
    """(where the fused norm stands: the last Add's place, or later where its inputs are computed later; the Adds summing
    the Skip and the SkipLayerNormFp8 `index` with Ids and Skip, to stand there; the other nodes it replaces; renames of
    the readers of the Add's output), or why not."""
    norm = g.nodes[index]
    split = _split(g, types, add, index)
    if isinstance(split, str):
        return split
    gamma = g.const(norm.input[_GAMMA])
    if gamma is None or gamma.size != split.width:
        return "Gamma's size is not the table's width"
    out = add.output[0]
    root = g.producer[out]
    at = max([root, *(g.producer.get(name, -1) for name in [*norm.input[_GAMMA:_SKIP], *split.kept])])
    others = [i for i in g.readers.get(out, []) if i != index]
    if any(i <= at for i in others):  # at itself reading it (a YScale computed from the sum) would make a cycle
        return "the residual is read before all the norm's inputs are computed, where the fused norm would stand"
    total = norm.output[2] if len(norm.output) > 2 else ""
    renames: dict[str, str] = {}
    if others or out in g.outputs:
        if len(norm.input) > _SKIP and norm.input[_SKIP]:
            return "the Add is read elsewhere (the residual) and the norm adds a Skip to it: Sum would differ from it"
        bias = g.const(norm.input[_BIAS])
        if bias is None or np.any(bias):
            return "the Add is read elsewhere (the residual) and Bias is not zeros: Sum would differ from it"
        if total and out in g.outputs:
            return "the Add is a graph output and Sum is read"
        renames = {out: total} if total else {}
        total = total or out
    base = norm.name or norm.output[1]
    summed = list(split.kept)
    if split.constant is not None:
        summed.append(f"{base}_positions")
        model.graph.initializer.append(numpy_helper.from_array(split.constant, summed[-1]))
    adds: list[onnx.NodeProto] = []
    while len(summed) > 1:  # the Skip: the terms kept, then P
        adds.append(helper.make_node("Add", summed[:2], [f"{base}_skip_{len(adds)}"], name=f"{base}_skip_{len(adds)}"))
        summed[:2] = adds[-1].output
    inputs = [split.gather.input[0], *norm.input[_GAMMA:_SKIP], summed[0], split.gather.input[1]]
    fused = helper.make_node(norm.op_type, inputs, [norm.output[0], norm.output[1], total], name=norm.name, domain=DEPLOYFUSE)
    fused.attribute.extend(norm.attribute)
    gone = {index, root, g.producer[split.gather.output[0]], *split.inner}
    terms = [name for i in (root, index, *split.inner) for name in g.nodes[i].input if name != split.gather.output[0]]
    return at, [*([] if at == root else [g.nodes[at]]), *adds, fused], gone - {at} | _unread(g, gone, terms, {*inputs, *split.kept}), renames


def fuse(model: onnx.ModelProto, target: str | Target) -> tuple[onnx.ModelProto, int, list[str]]:
    """`model` with each SkipLayerNormFp8 fed token + constant lookups doing them itself (in place, main graph); how many;
    why each one refused was refused ("<node>: <reason>"). A target without the `fp8_norm` lowering gets the model unchanged."""
    if not get_target(target).lowering(fp8_norm.FAMILY):
        return model, 0, []
    g, types = _Graph(model.graph), _types(model)
    placed: dict[int, list[onnx.NodeProto]] = {}
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
        at, fused, removed, more = taken
        if at in placed or at in gone or removed & (gone | placed.keys()):  # two norms' rewrites would meet in one node
            refused.append(f"{node.name or node.output[1]}: its lookups or placement share a node with a norm fused before it")
            continue
        placed[at] = fused
        gone |= removed
        renames.update(more)
    if placed:
        nodes = [m for i, n in enumerate(g.nodes) if i not in gone for m in placed.get(i, [n])]
        for n in nodes:
            n.input[:] = [renames.get(name, name) for name in n.input]
        used = {name for n in nodes for name in n.input} | g.outputs
        freed = {name for i in (*gone, *placed) for name in g.nodes[i].input} - used  # the folded tables and positions
        dropped = {o for i in (*gone, *placed) for o in g.nodes[i].output} - {o for n in nodes for o in n.output}
        kept = [t for t in model.graph.initializer if t.name not in freed]
        info = [v for v in model.graph.value_info if v.name not in dropped | freed]
        for field, values in ((model.graph.node, nodes), (model.graph.initializer, kept), (model.graph.value_info, info)):
            del field[:]
            field.extend(values)  # copies each message
    return model, len(placed), refused
