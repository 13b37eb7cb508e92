"""A GatherND that reads its data at the identity coordinates -> the data with size-1 axes inserted.

    GatherND(D, I)[p] = D[I[p, 0], ..., I[p, k-1]]          (batch_dims 0, I's last axis k = rank D)
                      = D[p[o_0], ..., p[o_{k-1}]]           when I[p, i] = p[o_i] for every output position p
                      = Unsqueeze(D, the other axes)[p]      when o_0 < ... < o_{k-1}, out[o_i] = D.shape[i]
                                                             and every other output axis is 1

HF's padding mask for the SDPA (`attention_mask[batch_idx, kv_idx]` over index grids) reaches a
dynamic-shape dynamo export as Range(0, B, 1) and a key index (a constant arange, or a Range over
the sequence) placed by Unsqueeze and Expanded to their common shape, unsqueezed, Concat'ed on the
last axis and read by a GatherND: some ten small kernels a call in front of every FusedMHA Mask,
each a launch and a gap at small batches. A static export folds the indices into one constant.

The rule proves it from the graph at every shape, never by running it. Each index component
I[..., i] must be a coordinate grid: its value at every position p is p[o] for an axis o
(`_grid_axes`: Range(0, n, 1) along its only axis; a constant equal to the coordinates along an axis;
Unsqueeze moves the axis; Expand keeps it when the expanded axis keeps the grid's size). The sizes
are symbolic (`_shape`): ints and the graph's named dims, equal only when the same number or name;
a broadcast of two different names is unknown, so the proof never assumes one of them is 1. The
data's size along axis i must be the output's along o_i (a Range over Shape(x)[j] of an input with
the same named dim: the export's declared contract). Anything else is left alone with the reason:
permuted coordinates, a Range from a non-zero start or with step != 1, batch_dims != 0, an index
depth that is not the data's rank. ort-cuda only (the FusedMHA Masks it is for); runs right after
mask_broadcast, whose RowMask finds such a Mask already one row over the query axis.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult, pattern

from deployfuse.rewrite.rules._common import FusionRule, broadcast_shape, is_op
from deployfuse.targets import Target, get_target

FAMILY = "identity_gather"

Dim = int | str  # a size: a number, or a dim the graph names (equal sizes: the same number or name)

_BROADCAST = frozenset({"Max", "Min", "Add", "Sub", "Mul", "Div", "Where", "And", "Or", "Equal", "Less", "LessOrEqual", "Greater",
                        "GreaterOrEqual"})
_UNARY = frozenset({"Cast", "Not", "Neg", "Identity"})
_MAX_DEPTH = 16  # an index grid is a handful of ops


class _Refused(Exception):
    """Why a GatherND is not provably an identity read (the rule's near-miss reason)."""


def _const(value: ir.Value | None) -> np.ndarray | None:
    """A constant value's elements, else None."""
    const = None if value is None else ir.convenience.get_const_tensor(value)
    return None if const is None else np.asarray(const.numpy())


def _declared(value: ir.Value) -> list[Dim]:
    """The shape the graph declares for `value` (numbers and named dims)."""
    if value.shape is None:
        raise _Refused(f"{value.name} has no declared shape")
    dims: list[Dim] = []
    for d in value.shape:
        if isinstance(d, int):
            dims.append(d)
        elif isinstance(d, ir.SymbolicDim) and d.value:
            dims.append(d.value)
        else:
            raise _Refused(f"{value.name} has an unnamed dim")
    return dims


def _broadcast(*shapes: list[Dim]) -> list[Dim]:
    """Numpy broadcasting of symbolic shapes; two different sizes neither of which is the number 1 refuse."""
    out = broadcast_shape(*shapes)
    if out is None:
        raise _Refused(f"broadcast of shapes {[list(map(str, s)) for s in shapes]} is not provably one shape")
    return out


def _inserted(node: ir.Node, rank: int) -> list[int]:
    """An Unsqueeze's constant axes as non-negative axes of its output, for an input of rank `rank`."""
    const = _const(node.inputs[1]) if len(node.inputs) == 2 else None
    if const is None:
        raise _Refused("an Unsqueeze whose axes are not a constant input")
    return sorted(int(a) % (rank + const.size) for a in const.reshape(-1))


def _unsqueezed(shape: list[Dim], axes: list[int]) -> list[Dim]:
    """`shape` with size-1 axes at `axes` (axes of the result)."""
    out = list(shape)
    for axis in axes:
        out.insert(axis, 1)
    return out


def _range_length(node: ir.Node, depth: int) -> Dim:
    """The length of Range(0, n, 1): n, as a size; other Ranges refuse."""
    start, step = _const(node.inputs[0]), _const(node.inputs[2])
    if start is None or start.size != 1 or int(start.reshape(())) != 0:
        raise _Refused("a Range index that does not start at a constant 0")
    if step is None or step.size != 1 or int(step.reshape(())) != 1:
        raise _Refused("a Range index whose step is not a constant 1")
    return _dim(node.inputs[1], depth + 1)


def _shape(value: ir.Value | None, depth: int = 0) -> list[Dim]:
    """`value`'s symbolic shape, derived through the ops index grids are built from; a graph input's, a value
    another op makes, or one deeper than index grids go, as the graph declares it."""
    if value is None:
        raise _Refused("a missing value")
    const, node = _const(value), value.producer()
    if const is not None:
        return list(const.shape)
    if node is None or node.domain not in ("", "ai.onnx") or depth > _MAX_DEPTH:
        return _declared(value)
    inputs = list(node.inputs)
    if is_op(node, "Range") and len(inputs) == 3:
        return [_range_length(node, depth)]
    if is_op(node, "Unsqueeze"):
        shape = _shape(inputs[0], depth + 1)
        return _unsqueezed(shape, _inserted(node, len(shape)))
    if is_op(node, "Expand") and len(inputs) == 2:
        return _broadcast(_shape(inputs[0], depth + 1), _dims(inputs[1], depth + 1))
    if is_op(node, *_UNARY) and len(inputs) == 1:
        return _shape(inputs[0], depth + 1)
    if is_op(node, *_BROADCAST):
        return _broadcast(*(_shape(i, depth + 1) for i in inputs))
    if is_op(node, "Concat"):
        shapes = [_shape(i, depth + 1) for i in inputs]
        rank = len(shapes[0])
        axis = node.attributes.get_int("axis", 0) % rank
        if any(len(s) != rank or s[:axis] + s[axis + 1:] != shapes[0][:axis] + shapes[0][axis + 1:] for s in shapes):
            raise _Refused("a Concat of inputs not provably the same size off its axis")
        along = [s[axis] for s in shapes]
        if not all(isinstance(d, int) for d in along):
            raise _Refused("a Concat along an axis of named size")
        return [*shapes[0][:axis], sum(int(d) for d in along), *shapes[0][axis + 1:]]
    return _declared(value)


def _dims(value: ir.Value | None, depth: int) -> list[Dim]:
    """The elements of a 1-D shape tensor as sizes: a constant, Shape(x)[start:end] or a Concat of such."""
    const = _const(value)
    node = None if value is None else value.producer()
    if const is not None:
        return [int(d) for d in const.reshape(-1)]
    if depth > _MAX_DEPTH or node is None:
        raise _Refused("a shape that is neither a constant nor read from a Shape")
    if is_op(node, "Shape"):
        shape = _shape(node.inputs[0], depth + 1)
        start, end = node.attributes.get_int("start", 0), node.attributes.get_int("end", len(shape))
        return shape[start:end]
    if is_op(node, "Concat"):
        return [d for i in node.inputs for d in _dims(i, depth + 1)]
    raise _Refused(f"a shape made by {node.op_type}")


def _dim(value: ir.Value | None, depth: int) -> Dim:
    """A one-element size tensor's size: a constant, or a Squeeze / Reshape / Gather of one element of a shape."""
    const = _const(value)
    node = None if value is None else value.producer()
    if const is not None and const.size == 1:
        return int(const.reshape(()))
    if node is not None and is_op(node, "Squeeze", "Reshape"):
        dims = _dims(node.inputs[0], depth + 1)
        if len(dims) == 1:
            return dims[0]
    if node is not None and is_op(node, "Gather") and node.attributes.get_int("axis", 0) == 0:
        index = _const(node.inputs[1])
        if index is not None and index.size == 1:
            dims, position = _dims(node.inputs[0], depth + 1), int(index.reshape(()))
            if -len(dims) <= position < len(dims):  # else the refusal below, not an IndexError out of the rule
                return dims[position]
    raise _Refused("a Range length that is not one element of a shape")


def _coordinate_axes(const: np.ndarray) -> list[int]:
    """The axes o with const[p] = p[o] at every position p."""
    grids = np.indices(const.shape)
    return [axis for axis in range(const.ndim) if np.array_equal(const, grids[axis])]


def _grid_axes(value: ir.Value | None, depth: int = 0) -> list[int]:
    """The axes o along which `value` is a coordinate grid, value[p] = p[o] at every position p of its shape."""
    if value is None or depth > _MAX_DEPTH:
        raise _Refused("index cone too deep")
    const, node = _const(value), value.producer()
    if const is not None:
        return _coordinate_axes(const)
    if node is None or not is_op(node, "Range", "Unsqueeze", "Expand"):
        raise _Refused(f"an index made by {'an input' if node is None else node.op_type}, not a coordinate grid")
    if is_op(node, "Range"):
        _range_length(node, depth)
        return [0]
    source = _grid_axes(node.inputs[0], depth + 1)
    shape, out = _shape(node.inputs[0], depth + 1), _shape(value, depth)
    if is_op(node, "Unsqueeze"):
        kept = [a for a in range(len(out)) if a not in _inserted(node, len(shape))]
        return [kept[a] for a in source]
    offset = len(out) - len(shape)  # Expand aligns the right: the grid survives where the expanded size is the grid's
    return [a + offset for a in source if out[a + offset] == shape[a]]


def _components(indices: ir.Value) -> list[ir.Value | np.ndarray]:
    """indices[..., i] for each i, each of last dim 1: the slices of a constant, or the inputs of a Concat on the last axis."""
    const, node = _const(indices), indices.producer()
    if const is not None:
        return [const[..., i:i + 1] for i in range(const.shape[-1])]
    if node is not None and is_op(node, "Concat") and node.attributes.get_int("axis", 0) in (-1, len(_shape(indices)) - 1):
        return [c for i in node.inputs if i is not None for c in _components(i)]
    if _shape(indices)[-1] != 1:
        raise _Refused("indices that are neither a constant nor a Concat of one-wide index grids")
    return [indices]


def _identity_axes(data: ir.Value, indices: ir.Value) -> tuple[list[int], list[Dim]]:
    """The output axes the data's axes land on (o_0 < ... < o_{k-1}) and the output shape, when GatherND(data, indices)
    reads data at the identity coordinates; else _Refused."""
    shape, index_shape = _shape(data), _shape(indices)
    out, components = index_shape[:-1], _components(indices)
    if index_shape[-1] != len(shape) or len(components) != len(shape):
        raise _Refused(f"indices {index_shape[-1]} deep into data of rank {len(shape)}")
    landed: list[int] = []
    for i, component in enumerate(components):
        axes = _coordinate_axes(component[..., 0]) if isinstance(component, np.ndarray) else _grid_axes(component)
        sized = [o for o in axes if o < len(out) and out[o] == shape[i]]
        fits = [o for o in sized if o > (landed[-1] if landed else -1)]
        if not fits:
            reason = "permuted: it runs along an output axis before the previous index's" if sized else "not the coordinates along an output axis of its size"
            raise _Refused(f"index {i} (data axis of size {shape[i]}) is {reason} (grid axes {axes} of output {out})")
        landed.append(fits[0])  # a later axis only leaves the next indices less room
    if any(out[o] != 1 for o in range(len(out)) if o not in landed):
        raise _Refused(f"output {out} repeats the data along an axis of size other than 1")
    return landed, out


class IdentityGather(FusionRule):
    """GatherND(D, I) -> Unsqueeze(D, the output axes no index reads) when I holds the identity coordinates."""

    def __init__(self, target: str | Target) -> None:
        super().__init__(FAMILY, target)
        self.inserted: list[int] = []

    def pattern(self, op, data, indices):
        return op.GatherND(data, indices, _allow_other_attributes=True, _outputs=["gathered"])

    def check(self, context, data, indices, gathered, **_) -> MatchResult:
        fail = MatchResult().fail
        if gathered.producer().attributes.get_int("batch_dims", 0) != 0:
            return fail("batch_dims is not 0", gathered)
        try:
            landed, out = _identity_axes(data, indices)
        except _Refused as refused:
            return fail(str(refused), indices)
        self.inserted = [o for o in range(len(out)) if o not in landed]
        return MatchResult()

    def rewrite(self, op, data, gathered, **_):
        if not self.inserted:
            return op.Identity(data)
        read = op.Unsqueeze(data, op.Constant(value=ir.tensor(np.array(self.inserted, np.int64))))
        read.dtype, read.shape = data.dtype, gathered.shape
        return read


def rules(target: str | Target) -> list[pattern.RewriteRule]:
    """The rule where the target lowers it (ort-cuda); none elsewhere."""
    return [IdentityGather.rule(target)] if get_target(target).lowering(FAMILY) else []
