"""Rotary position embeddings (rotate-half form) → com.microsoft.RotaryEmbedding.

    y = x·cos + rotate_half(x)·sin,   rotate_half(x) = [-x₂, x₁],   cos = [c, c], sin = [s, s]

with x [B, H, S, D] split in halves x₁, x₂. RotaryEmbedding computes exactly this from half-width
caches c, s [rows, D/2] read at `position_ids` [B, S]; the rule recognises cos / sin by what they
hold, whichever way the export wrote them:

- **angles**: cos = Cos([θ, θ]), sin = Sin([θ, θ]) for θ [B', S, D/2] computed in the graph
  (dynamic shapes; B' is 1 or B): the caches are Cos(θ), Sin(θ) flattened to [B'·S, D/2], read at
  b·S + s. Exact for any way the model computes θ (rope scaling, NTK, position ids from input);
  fp16 / bf16 models compute them in float and Cast cos / sin to x's dtype, and so do the caches.
- **constant tables**: with static shapes the exporter folds cos / sin to constants
  [B'|1, 1, S, D] (any rank ≤ 4 that broadcasts so): the caches are their halves, read the same way.
- **gathered tables**: cos = Unsqueeze(Gather(C, position_ids), 1) from a constant table C [P, D]
  (precomputed caches indexed by position): the caches are C's halves, read at the model's own
  position ids.

The two halves of every table must provably repeat (equal constants, or Concat(θ, θ)), else the
rule declines. When x was split from [B, S, H·D] the node takes that 3-D tensor, so the
attention rule can take its output as Q or K without a re-merge.

`tensorrt` gets nothing: RotaryEmbedding is com.microsoft (the standard op needs opset 23).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult, pattern

from deployfuse.rewrite.rules._attention_shapes import DimOf, constant, rank, same_dim, scalar, split_heads_source, static_dim, static_ints
from deployfuse.targets import MS, get_target

FAMILY = "rotary"


def _ints(value: ir.Value | None) -> list[int] | None:
    return static_ints(value) if value is not None else None


def _uncast(value: ir.Value) -> tuple[ir.Value, bool]:
    """`(v, True)` when `value` is Cast(v), else `(value, False)`."""
    node = value.producer()
    if node is not None and node.op_type == "Cast" and node.domain in ("", "ai.onnx"):
        return node.inputs[0], True
    return value, False


def _angles(value: ir.Value, function: str) -> tuple[ir.Value, float, bool] | None:
    """`(θ, f, cast)` when `value` is Unsqueeze(f·function(Concat(θ, θ, axis=-1)), axis 1),
    with a Cast (to the activations' dtype: fp16 / bf16 models compute the angles in float)
    before or after the Unsqueeze when `cast`."""
    value, cast_after = _uncast(value)
    node = value.producer()
    if node is None or node.op_type != "Unsqueeze" or _ints(node.inputs[1] if len(node.inputs) > 1 else None) != [1]:
        return None
    value, cast_before = _uncast(node.inputs[0])
    if cast_before and cast_after:
        return None
    factor = 1.0
    node = value.producer()
    if node is not None and node.op_type == "Mul":
        for side in (0, 1):
            if scalar(node.inputs[side]) is not None:
                factor, value = scalar(node.inputs[side]), node.inputs[1 - side]
                node = value.producer()
                break
    if node is None or node.op_type != function or node.domain not in ("", "ai.onnx"):
        return None
    concat = node.inputs[0].producer()
    if concat is None or concat.op_type != "Concat" or len(concat.inputs) != 2 or concat.inputs[0] is not concat.inputs[1]:
        return None
    angles = concat.inputs[0]
    axis = concat.attributes["axis"].as_int()
    if rank(angles) != 3 or axis not in (-1, 2):
        return None
    return angles, factor, cast_before or cast_after


def _table_halves(array: np.ndarray, half: int) -> np.ndarray | None:
    """The first half of `array`'s last axis when both halves are equal, else None."""
    if array.shape[-1] != 2 * half or not np.array_equal(array[..., :half], array[..., half:]):
        return None
    return array[..., :half]


def _constant_tables(cos: ir.Value, sin: ir.Value, x: ir.Value, half: int) -> tuple[np.ndarray, np.ndarray, int] | str:
    """`(c, s, B')` for constant cos / sin broadcasting to x [B, H, S, D] as [B', 1, S, D]:
    the half-width caches [B'·S, D/2]; else why not."""
    tables = [constant(cos), constant(sin)]
    if x.dtype is None:
        return "x's dtype is unknown"
    if tables[0] is None or tables[1] is None:
        return "cos / sin are neither Cos / Sin of one repeated angle tensor, nor constants, nor gathered from constant tables"
    seq, batch = static_dim(x, 2), static_dim(x, 0)
    shaped = []
    for table in tables:
        if table.ndim > 4 or table.dtype != x.dtype.numpy():
            return "constant cos / sin tables are above rank 4 or not of x's dtype"
        table = table.reshape((1,) * (4 - table.ndim) + table.shape)
        if table.shape[1] != 1 or seq is None or table.shape[2] != seq or table.shape[0] not in (1, batch):
            return "constant cos / sin tables are not [1|B, 1, S, D] with a static S"
        shaped.append(table)
    if shaped[0].shape != shaped[1].shape:
        return "constant cos / sin tables differ in shape"
    caches = [_table_halves(t[:, 0], half) for t in shaped]
    if caches[0] is None or caches[1] is None:
        return "the halves of the constant cos / sin tables differ"
    return caches[0].reshape(-1, half), caches[1].reshape(-1, half), shaped[0].shape[0]


def _gathered(value: ir.Value) -> tuple[np.ndarray, ir.Value] | None:
    """`(C, position_ids)` when `value` is Unsqueeze(Gather(C, position_ids, axis 0), axis 1) of a
    constant table C [P, D] and 2-D integer position ids (or GatherND(C, Unsqueeze(position_ids, -1)))."""
    node = value.producer()
    if node is None or node.op_type != "Unsqueeze" or _ints(node.inputs[1] if len(node.inputs) > 1 else None) != [1]:
        return None
    gather = node.inputs[0].producer()
    if gather is None or gather.domain not in ("", "ai.onnx"):
        return None
    positions = gather.inputs[1]
    if gather.op_type == "GatherND" and gather.attributes.get_int("batch_dims", 0) == 0:
        index = positions.producer()  # table[position_ids] as the dynamo exporter writes it
        if index is None or index.op_type != "Unsqueeze" or _ints(index.inputs[1] if len(index.inputs) > 1 else None) not in ([-1], [2]):
            return None
        positions = index.inputs[0]
    elif gather.op_type != "Gather" or gather.attributes.get_int("axis", 0) != 0:
        return None
    table = constant(gather.inputs[0])
    if table is None or table.ndim != 2 or rank(positions) != 2 or positions.dtype != ir.DataType.INT64:
        return None
    return table, positions


def _gathered_tables(cos: ir.Value, sin: ir.Value, x: ir.Value, half: int) -> tuple[np.ndarray, np.ndarray, ir.Value] | str | None:
    """`(c, s, position_ids)` when cos / sin are rows of constant tables gathered at the same
    position ids [1|B, S]; None when they are not gathered; a reason when they are but do not fit."""
    cos_found, sin_found = _gathered(cos), _gathered(sin)
    if cos_found is None or sin_found is None:
        return None
    (cos_table, positions), (sin_table, sin_positions) = cos_found, sin_found
    if positions is not sin_positions or x.dtype is None:
        return "cos / sin are gathered at different positions"
    if cos_table.dtype != x.dtype.numpy() or sin_table.dtype != x.dtype.numpy():
        return "the gathered cos / sin tables are not of x's dtype"
    if not same_dim(DimOf(positions, 1), DimOf(x, 2)) or not (static_dim(positions, 0) == 1 or same_dim(DimOf(positions, 0), DimOf(x, 0))):
        return "the position ids are not [1|B, S] for x [B, H, S, D]"
    caches = _table_halves(cos_table, half), _table_halves(sin_table, half)
    if caches[0] is None or caches[1] is None:
        return "the halves of the gathered cos / sin tables differ"
    return caches[0], caches[1], positions


class _RotateHalf(pattern.RewriteRuleClassBase):
    """x·cos + Concat(-x[..., D/2:], x[..., :D/2])·sin on 4-D x."""

    def __init__(self) -> None:
        super().__init__(name="rotary_embedding")
        self._caches: tuple[str, tuple] | None = None
        self._split: tuple[int, ir.Value | None, int] = (0, None, 0)  # heads, merged [B, S, H·D] source, D
        self._expand_angles = False

    def pattern(self, op, x, cos, sin, s1, e1, a1, st1, s2, e2, a2, st2, axis):
        first = op.Slice(x, s1, e1, a1, st1)
        second = op.Slice(x, s2, e2, a2, st2)
        rotated = op.Concat(op.Neg(second), first, axis=axis)
        return op.Add(op.Mul(x, cos), op.Mul(rotated, sin))

    def check(self, context, x, cos, sin, s1, e1, a1, st1, s2, e2, a2, st2, axis, **_) -> MatchResult:
        result = MatchResult()
        head_dim = static_dim(x, 3) if rank(x) == 4 else None
        source = split_heads_source(x) if rank(x) == 4 else None
        head_dim = head_dim or (source[2] if source else None)
        if head_dim is None or head_dim % 2:
            return result.fail("x is not 4-D with an even static head size", x)
        half = head_dim // 2
        if axis.as_int() not in (-1, 3) or any(_ints(a) not in ([3], [-1]) for a in (a1, a2)) or any(_ints(s) != [1] for s in (st1, st2)):
            return result.fail("the halves are not cut from the last axis", x)
        ends = _ints(e2)
        if _ints(s1) != [0] or _ints(e1) != [half] or _ints(s2) != [half] or ends is None or ends[0] < head_dim:
            return result.fail("x is not cut into two equal halves", x)
        self._split = (source[1], source[0], head_dim) if source else (0, None, head_dim)
        cos_angles, sin_angles = _angles(cos, "Cos"), _angles(sin, "Sin")
        if cos_angles is not None and sin_angles is not None:
            if cos_angles[0] is not sin_angles[0] or cos_angles[1:] != sin_angles[1:]:
                return result.fail("cos / sin are not Cos / Sin of one repeated angle tensor", cos)
            angles, factor, cast = cos_angles
            if (angles.dtype != x.dtype) != cast or x.dtype is None:
                return result.fail("cos / sin reach x's dtype through other than one Cast", cos)
            if static_dim(angles, 2) != half:
                return result.fail("the angles are not [B', S, D/2]", angles)
            self._caches = ("angles", (angles, factor, half, x.dtype if cast else None))
            self._expand_angles = not same_dim(DimOf(angles, 1), DimOf(x, 2))
            return result
        gathered = _gathered_tables(cos, sin, x, half)
        if isinstance(gathered, str):
            return result.fail(gathered, cos)
        if gathered is not None:
            self._caches = ("gathered", gathered)
            return result
        tables = _constant_tables(cos, sin, x, half)
        if isinstance(tables, str):
            return result.fail(tables, cos)
        self._caches = ("constant", tables)
        return result

    def rewrite(self, op, x, **_):
        assert self._caches is not None
        kind, plan = self._caches
        if kind == "angles":
            caches, positions = self._angle_caches(op, x, *plan)
        elif kind == "gathered":
            cos, sin, positions = plan
            caches = [op.initializer(ir.tensor(np.ascontiguousarray(t)), name=f"{x.name}_rotary_{n}_cache") for t, n in ((cos, "cos"), (sin, "sin"))]
            if static_dim(positions, 0) == 1:
                positions = op.Expand(positions, op.Concat(op.Shape(x, start=0, end=1), op.Shape(positions, start=1, end=2), axis=0))
        else:
            cos, sin, batch = plan
            caches = [op.initializer(ir.tensor(np.ascontiguousarray(t)), name=f"{x.name}_rotary_{n}_cache") for t, n in ((cos, "cos"), (sin, "sin"))]
            seq = cos.shape[0] // batch
            rows = np.arange(batch * seq, dtype=np.int64).reshape(batch, seq)  # b·S + s, or s for one shared table
            positions = op.Expand(op.Constant(value=ir.tensor(rows)), op.Concat(op.Shape(x, start=0, end=1), _i64(op, seq), axis=0))
        return self._emit(op, x, caches, positions)

    def _angle_caches(self, op, x, angles, factor, half, cast_to):
        """Cos(θ), Sin(θ) flattened to [B'·S, D/2] (cast to x's dtype as the model did) and positions b·S + s."""
        if self._expand_angles:  # broadcast over x's sequence as the model's Mul did
            target = op.Concat(op.Shape(angles, start=0, end=1), op.Shape(x, start=2, end=3), _i64(op, half), axis=0)
            angles = op.Expand(angles, target)
        caches = []
        for function in (op.Cos, op.Sin):
            rows = function(angles)
            if factor != 1.0:
                rows = op.Mul(rows, op.Constant(value=ir.tensor(np.array(factor, dtype=angles.dtype.numpy()))))
            if cast_to is not None:
                rows = op.Cast(rows, to=cast_to)
            caches.append(op.Reshape(rows, _i64(op, -1, half)))
        rows = op.Div(op.Size(angles), _i64(op, half, scalar=True))  # B'·S
        seq = op.Shape(angles, start=1, end=2)
        positions = op.Reshape(op.Range(_i64(op, 0, scalar=True), rows, _i64(op, 1, scalar=True)), op.Concat(_i64(op, -1), seq, axis=0))
        positions = op.Expand(positions, op.Concat(op.Shape(x, start=0, end=1), seq, axis=0))
        return caches, positions

    def _emit(self, op, x, caches, positions):
        heads, merged, head_dim = self._split
        if merged is None:
            out = op.RotaryEmbedding(x, positions, *caches, interleaved=0, _domain=MS)
            out.dtype, out.shape = x.dtype, x.shape
            return out
        rotated = op.RotaryEmbedding(merged, positions, *caches, interleaved=0, num_heads=heads, _domain=MS)
        rotated.dtype, rotated.shape = merged.dtype, merged.shape
        split = op.Reshape(rotated, _i64(op, 0, 0, heads, head_dim))
        split.dtype = merged.dtype
        if merged.shape is not None:
            split.shape = ir.Shape([merged.shape[0], merged.shape[1], heads, head_dim])
        out = op.Transpose(split, perm=[0, 2, 1, 3])
        out.dtype, out.shape = x.dtype, x.shape
        return out


def _i64(op, *values: int, scalar: bool = False) -> ir.Value:
    return op.Constant(value=ir.tensor(np.array(values[0] if scalar else values, dtype=np.int64)))


def rules(target: str) -> list[pattern.RewriteRule]:
    """The rotary rule where the target runs com.microsoft.RotaryEmbedding, else none."""
    if not get_target(target).emits(MS, "RotaryEmbedding", opset=0):
        return []
    return list(_RotateHalf.rule().commute())  # x·cos / cos·x, both Add orders
