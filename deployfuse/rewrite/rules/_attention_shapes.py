"""Symbolic reading of shape tensors, so attention rules prove layouts instead of trusting them.

Exporters build the targets of `Reshape` from `Shape`, `Gather`, `Slice`, `Concat`, … of other
tensors. `shape_vector` evaluates such a tensor into a list of entries, each an `int` or a
`DimOf(value, axis)` ("dimension `axis` of `value`"), and `same_dim` decides whether two entries
are provably equal: structurally (the same dimension reached through Transpose / Reshape), as
equal integers, or as the same symbolic dimension name from shape inference (ONNX gives one name
one size within a graph). Anything not provable is treated as different, so a rule that relies
on these helpers declines rather than fuses a layout it does not understand.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

_MAX_DEPTH = 12

# Fused ops whose output keeps leading dimensions of their first input: (domain, op) -> axes.
_KEEPS_QUERY_DIMS = {
    ("com.microsoft", "MultiHeadAttention"): (0, 1),
    ("deployfuse", "FusedMHA"): (0, 1),
    ("com.microsoft", "RotaryEmbedding"): (0, 1, 2, 3),
}


@dataclass(frozen=True)
class DimOf:
    """Dimension `axis` (non-negative) of `value`."""

    value: ir.Value
    axis: int


Entry = int | DimOf


def constant(value: ir.Value | None) -> np.ndarray | None:
    """The value of a constant tensor (initializer or Constant node), else None."""
    if value is None:
        return None
    tensor = value.const_value
    if tensor is None:
        producer = value.producer()
        if producer is None or producer.op_type != "Constant" or producer.domain not in ("", "ai.onnx"):
            return None
        attr = producer.attributes.get("value")
        if attr is None:
            return None
        tensor = attr.as_tensor()
    try:
        return tensor.numpy()
    except Exception:  # external or unsupported data: not a usable constant
        return None


def scalar(value: ir.Value | None) -> float | None:
    """The value of a one-element constant, else None."""
    array = constant(value)
    if array is None or array.size != 1:
        return None
    return float(array.reshape(()))


def rank(value: ir.Value) -> int | None:
    """The rank of `value` when shape inference knows it."""
    return None if value.shape is None else len(value.shape)


def constant_ints(value: ir.Value | None) -> list[int] | None:
    """An integer constant's values, flattened; None for anything else."""
    array = constant(value)
    if array is None or array.dtype.kind not in "iu":
        return None
    return [int(x) for x in array.reshape(-1)]


def _input(node: ir.Node, index: int) -> ir.Value | None:
    return node.inputs[index] if index < len(node.inputs) else None


def shape_vector(value: ir.Value | None, depth: int = 0) -> list[Entry] | None:
    """The 1-D integer tensor `value` as entries, or None when it cannot be read symbolically."""
    if value is None or depth > _MAX_DEPTH:
        return None
    ints = constant_ints(value)
    if ints is not None:
        return list(ints)
    node = value.producer()
    if node is None or node.domain not in ("", "ai.onnx"):
        return None
    op = node.op_type
    if op == "Shape":
        source = node.inputs[0]
        r = rank(source) if source is not None else None
        if r is None:
            return None
        start_attr, end_attr = node.attributes.get("start"), node.attributes.get("end")
        start = start_attr.as_int() if start_attr is not None else 0
        end = end_attr.as_int() if end_attr is not None else r
        return [DimOf(source, a) for a in range(r)][slice(start, end)]
    if op in ("Cast", "Squeeze", "Identity") or (op in ("Unsqueeze", "Reshape") and _is_1d_of_one(node)):
        inner = shape_vector(node.inputs[0], depth + 1)
        return inner if inner is not None and (op in ("Cast", "Identity") or len(inner) == 1) else None
    if op == "Concat":
        out: list[Entry] = []
        for part in node.inputs:
            entries = shape_vector(part, depth + 1)
            if entries is None:
                return None
            out.extend(entries)
        return out
    if op == "Gather":
        axis = node.attributes.get("axis")
        indices = constant_ints(_input(node, 1))
        data = shape_vector(node.inputs[0], depth + 1)
        if (axis is not None and axis.as_int() != 0) or indices is None or data is None:
            return None
        try:
            return [data[i] for i in indices]
        except IndexError:
            return None
    if op in ("Div", "Mul"):
        data, factor = shape_vector(node.inputs[0], depth + 1), constant_ints(_input(node, 1))
        if data is None or factor is None or len(factor) != 1 or factor[0] <= 0:
            return None
        known = [canonical(e) for e in data]
        if not all(isinstance(e, int) for e in known):
            return None
        return [e // factor[0] if op == "Div" else e * factor[0] for e in known]
    if op == "Slice":
        data = shape_vector(node.inputs[0], depth + 1)
        starts, ends = constant_ints(_input(node, 1)), constant_ints(_input(node, 2))
        axes = constant_ints(_input(node, 3)) if _input(node, 3) is not None else [0]
        steps = constant_ints(_input(node, 4)) if _input(node, 4) is not None else [1]
        if data is None or starts is None or ends is None or axes not in ([0], [-1]) or steps is None or len(starts) != 1:
            return None
        return data[slice(starts[0], ends[0], steps[0])]
    return None


def static_ints(value: ir.Value | None) -> list[int] | None:
    """A small integer tensor's values when they are constants or provably static dimensions."""
    entries = shape_vector(value)
    if entries is None:
        return None
    known = [canonical(e) for e in entries]
    return known if all(isinstance(e, int) for e in known) else None


def _is_1d_of_one(node: ir.Node) -> bool:
    """Unsqueeze of a scalar, or Reshape to [1] / [-1]: one element in, one element out."""
    if node.op_type == "Unsqueeze":
        return constant_ints(_input(node, 1)) == [0]
    return constant_ints(_input(node, 1)) in ([1], [-1])


def canonical(entry: Entry, depth: int = 0) -> Entry:
    """Follow a dimension back through Transpose and Reshape to where it was introduced."""
    if isinstance(entry, int) or depth > _MAX_DEPTH:
        return entry
    dim = entry.value.shape[entry.axis] if entry.value.shape is not None and entry.axis < len(entry.value.shape) else None
    if isinstance(dim, int):
        return dim
    node = entry.value.producer()
    if node is None:
        return entry
    if entry.axis in _KEEPS_QUERY_DIMS.get((node.domain, node.op_type), ()) and node.inputs[0] is not None:
        return canonical(DimOf(node.inputs[0], entry.axis), depth + 1)
    if node.domain not in ("", "ai.onnx"):
        return entry
    if node.op_type == "Transpose":
        perm = node.attributes.get("perm")
        if perm is not None:
            return canonical(DimOf(node.inputs[0], perm.as_ints()[entry.axis]), depth + 1)
    if node.op_type == "Reshape":
        target = reshape_target(node)
        if target is not None and entry.axis < len(target):
            if target[entry.axis] == -1:
                inferred = _inferred_dim(node.inputs[0], target, entry.axis)
                return inferred if inferred is not None else entry
            return canonical(target[entry.axis], depth + 1)
    return entry


def _inferred_dim(source: ir.Value, target: list[Entry], axis: int) -> int | None:
    """The size Reshape infers for the -1 at `axis`: dimensions matched position by position
    cancel; what is left of the input and of the target must be static integers."""
    r = rank(source)
    if r is None:
        return None
    left, right = 1, 1
    for i in range(max(r, len(target))):
        mine = target[i] if i < len(target) and i != axis else None
        theirs: Entry | None = DimOf(source, i) if i < r else None
        if mine is not None and theirs is not None and same_dim(mine, theirs):
            continue
        if theirs is not None:
            size = canonical(theirs)
            if not isinstance(size, int):
                return None
            left *= size
        if mine is not None:
            size = canonical(mine)
            if not isinstance(size, int) or size <= 0:
                return None
            right *= size
    return left // right if right and left % right == 0 else None


def partial_shape_vector(value: ir.Value | None) -> list[Entry | None] | None:
    """`shape_vector`, where a Concat part that cannot be read but has a static length gives None entries (GPT-Neo
    merges its heads to a sequence length computed with `sym_min`): the positions are known, some sizes are not."""
    entries = shape_vector(value)
    node = value.producer() if value is not None and entries is None else None
    if node is None or node.op_type != "Concat" or node.domain not in ("", "ai.onnx"):
        return entries
    out: list[Entry | None] = []
    for part in node.inputs:
        read = shape_vector(part)
        length = static_dim(part, 0) if part is not None and rank(part) == 1 else None
        if read is None and length is None:
            return None
        out.extend(read if read is not None else [None] * length)
    return out


def reshape_target(node: ir.Node) -> list[Entry] | None:
    """The target of a Reshape as entries, with `0` ("copy the input's dimension") resolved."""
    entries = shape_vector(node.inputs[1])
    return None if entries is None else _copies_resolved(node, entries)


def partial_reshape_target(node: ir.Node) -> list[Entry | None] | None:
    """`reshape_target` with None for the entries `partial_shape_vector` cannot read: a reader that proves the others
    may let the element count force them."""
    entries = partial_shape_vector(node.inputs[1])
    return None if entries is None else _copies_resolved(node, entries)


def _copies_resolved(node: ir.Node, entries: list) -> list | None:
    """A Reshape's target entries with each `0` resolved to the input's dimension (allowzero=0); None where allowzero=1
    makes a `0` a genuine zero-size dimension: never an attention layout."""
    allowzero = node.attributes.get("allowzero")
    if allowzero is None or allowzero.as_int() == 0:
        return [DimOf(node.inputs[0], i) if e == 0 else e for i, e in enumerate(entries)]
    return None if any(e == 0 for e in entries) else entries


def same_dim(a: Entry | None, b: Entry | None) -> bool:
    """True when `a` and `b` are provably the same size (never for an unknown entry, None)."""
    if a is None or b is None:
        return False
    a, b = canonical(a), canonical(b)
    if isinstance(a, int) or isinstance(b, int):
        return isinstance(a, int) and isinstance(b, int) and a == b
    if a == b:
        return True
    da, db = _symbol(a), _symbol(b)
    return da is not None and da == db


def _symbol(entry: DimOf) -> str | None:
    shape = entry.value.shape
    if shape is None or entry.axis >= len(shape):
        return None
    dim = shape[entry.axis]
    return dim.value if isinstance(dim, ir.SymbolicDim) and dim.value else None


def static_dim(value: ir.Value, axis: int) -> int | None:
    """Dimension `axis` of `value` when it is a known integer."""
    entry = canonical(DimOf(value, axis % rank(value))) if rank(value) else None
    return entry if isinstance(entry, int) else None


def reshape_is_noop(node: ir.Node) -> bool:
    """A Reshape whose target provably equals its input's shape (at most one -1 left to infer)."""
    source = node.inputs[0]
    target = reshape_target(node)
    r = rank(source) if source is not None else None
    if target is None or r is None or len(target) != r:
        return False
    unmatched = [i for i, e in enumerate(target) if not same_dim(e, DimOf(source, i))]
    return not unmatched or (len(unmatched) == 1 and target[unmatched[0]] == -1)


def split_heads_source(value: ir.Value) -> tuple[ir.Value, int, int] | None:
    """`(x, heads, head_dim)` when `value` is `Transpose(Reshape(x, [B, S, heads, head_dim]), [0, 2, 1, 3])`."""
    transpose = value.producer()
    if transpose is None or transpose.op_type != "Transpose" or transpose.domain not in ("", "ai.onnx"):
        return None
    perm = transpose.attributes.get("perm")
    if perm is None or list(perm.as_ints()) != [0, 2, 1, 3] or transpose.inputs[0] is None:
        return None
    return split_source(transpose.inputs[0])


def split_source(value: ir.Value) -> tuple[ir.Value, int, int] | None:
    """`(x, heads, head_dim)` when `value` is `Reshape(x, [B, S, heads, head_dim])` (through no-op Reshapes).

    `x` is the [B, S, heads·head_dim] tensor the heads were split from; proven exactly: the
    reshape keeps x's first two dimensions (the first may be -1) and splits the last into
    (heads, head_dim).
    """
    reshape = value.producer()
    while reshape is not None and reshape.op_type == "Reshape" and reshape_is_noop(reshape):
        reshape = reshape.inputs[0].producer()
    if reshape is None or reshape.op_type != "Reshape" or reshape.domain not in ("", "ai.onnx"):
        return None
    source = reshape.inputs[0]
    target = reshape_target(reshape)
    if source is None or rank(source) != 3 or target is None or len(target) != 4:
        return None
    hidden = static_dim(source, 2)
    head_dim = target[3] if isinstance(target[3], int) and target[3] > 0 else static_dim(reshape.outputs[0], 3)
    if hidden is None or head_dim is None or head_dim <= 0 or hidden % head_dim:
        return None
    heads = hidden // head_dim
    if target[2] != -1 and not same_dim(target[2], heads):
        return None
    # one -1 entry (a Reshape allows no more) is exact once the others are proven: B·S·H·D / (S·H·D) = B, and
    # B·S·H·D / (B·H·D) = S (OPT's view(bsz, -1, heads, head_dim))
    batch, seq = (target[i] == -1 or same_dim(target[i], DimOf(source, i)) for i in (0, 1))
    if not (batch and seq):
        return None
    return source, heads, head_dim
