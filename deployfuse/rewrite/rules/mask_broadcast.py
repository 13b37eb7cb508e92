"""A FusedMHA Mask that is only broadcast over the query axis -> the row it was broadcast from,
so the Hopper kernel reads one mask row per batch (its kRow path) instead of a [S, S] tile.

    FusedMHA(Q, K, V, f(broadcast(M), c...)) = FusedMHA(Q, K, V, f(M, c...))

HF's SDPA mask preparation turns a [B, S] padding mask into [B, 1, S, S] before the attention:
in the dynamo export `And(T, padding)` with T an all-True [1, 1, S, 1] (the "every query row"
half of its mask functions: a folded constant with static shapes, `q_idx >= 0` over a Range with
dynamic ones), then a Where into 0 / the dtype's min; other spellings use an Expand. FusedMHA
broadcasts its Mask to [batch, heads, q_seq, k_seq] itself, so the broadcast only costs
bandwidth. Walking back from the Mask through element-wise ops (`_ELEMENTWISE`), the rule drops
each broadcast-only step it meets: an Expand, or an And / Or / Add / Sub / Mul / Div whose other
operand is that op's identity everywhere (provably all True; a constant all False, 0 or 1).
Element-wise ops commute with broadcasting, so the rebuilt Mask, broadcast to the old one's
shape, is the old Mask value for value. The rule applies only where the rebuilt Mask has rank
<= 4 (FusedMHA broadcasts numpy-style; a lower rank is not reshaped, the exports never need it)
and a query axis (axis -2) of 1: a genuinely per-query mask (GPT-2's: causal `k_idx <= q_idx`
and an Equal of packed-sequence ids) keeps its shape and the node is left alone.

The rebuilt chain is new nodes feeding this FusedMHA only; the old chain stays for any other reader
and is removed when FusedMHA was its last (so a shared Expand is kept, never reshaped under a
reader that needs its shape). Every layer's FusedMHA rebuilds the same small chain; the merge of
duplicates after the last family (`fuser._merge_duplicates`) makes them one again. ort-cuda only
(its FusedMHA kernel has the row path); runs right after packed_mha, which makes the FusedMHA nodes.

A Mask broadcast over the batch axis goes first (`BatchRowMask`, rule `mask_broadcast_batch`): with
a dynamic batch and no attention-mask input, HF expands GPT-2's position ids to [B, S] and builds
its causal and packed-sequence mask from them at run time (Expand, Slice, Sub, Concat, CumSum,
GatherND, Equal, And, Where: some 20 small kernels a call, all folded away when the batch is
static). Every batch row of that Mask is the same tensor, which no input's data or dims decide
(`_same_rows` proves it op by op); the rule computes that row once on ONNX Runtime's CPU at batch
1 and hands every FusedMHA it as one [1, ...] constant, which the kernel broadcasts back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx_ir as ir
from onnxscript.rewriter import MatchResult, pattern

from deployfuse.rewrite.rules._common import FusionRule, default_opset, is_op
from deployfuse.targets import DEPLOYFUSE, Target, get_target

FAMILY = "mask_broadcast"

# Ops that compute each output element from the same-index elements of their (broadcast) inputs.
_ELEMENTWISE = frozenset({"Cast", "Sub", "Add", "Mul", "Div", "Where", "Not", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual",
                          "And", "Or", "Xor", "Neg"})
# op -> (identity element, operand positions the identity may take): op(identity, x) == x broadcast.
_IDENTITY = {"And": (True, (0, 1)), "Or": (False, (0, 1)), "Add": (0, (0, 1)), "Mul": (1, (0, 1)), "Sub": (0, (1,)), "Div": (1, (1,))}
_MAX_DEPTH = 16  # a Mask chain is a handful of ops; deeper walks are not masks
_MAX_CONE_BYTES = 1 << 24  # a Mask built from shapes reads small constants; a cone reading weights is no such Mask
_MAX_CONE_NODES = 256  # GPT-2's causal mask is 40 nodes: a cone this large is no such Mask, and not evaluated


@dataclass
class _Plan:
    """How to compute a value with its broadcasts dropped: `value` itself (node None), or `node`
    rebuilt on the plans of its inputs."""

    value: ir.Value
    node: ir.Node | None = None
    inputs: list[_Plan] = field(default_factory=list)

    def shape(self) -> list[int | str] | None:
        """The rebuilt value's shape as numpy broadcasting gives it (1, or a dim that is not 1), or None if unknown."""
        if self.node is None:
            if self.value.shape is None:
                return None
            return [d if isinstance(d, int) else "?" for d in self.value.shape]
        shapes = [p.shape() for p in self.inputs]
        if any(s is None for s in shapes):
            return None
        rank = max(len(s) for s in shapes if s is not None)
        dims: list[int | str] = []
        for axis in range(-rank, 0):
            sizes = {s[axis] for s in shapes if s is not None and len(s) >= -axis} - {1}
            dims.append(1 if not sizes else next(iter(sizes)))
        return dims


def _const(value: ir.Value | None) -> np.ndarray | None:
    """A constant value's elements, else None."""
    const = None if value is None else ir.convenience.get_const_tensor(value)
    return None if const is None else np.asarray(const.numpy())


def _non_negative(value: ir.Value | None, depth: int = 0) -> bool:
    """True when every element of `value` is provably >= 0: a constant, or a Range from a constant
    start >= 0 by a constant step > 0 (query / key indices), through shape-only ops."""
    const = _const(value)
    if const is not None:
        return bool(np.all(const >= 0))
    node = None if value is None else value.producer()
    if node is None or depth > _MAX_DEPTH:
        return False
    if is_op(node, "Range") and len(node.inputs) == 3:
        start, step = _const(node.inputs[0]), _const(node.inputs[2])
        return start is not None and step is not None and bool(np.all(start >= 0) and np.all(step > 0))
    return is_op(node, "Unsqueeze", "Squeeze", "Reshape", "Expand") and _non_negative(node.inputs[0], depth + 1)


def _all_true(value: ir.Value | None, depth: int = 0) -> bool:
    """True when every element of `value` is provably True: a constant, an And of such, or
    `indices >= c` with c <= 0 (HF's bidirectional mask function, `q_idx >= 0`, as the dynamo export
    spells it when the sequence length is dynamic)."""
    const = _const(value)
    if const is not None:
        return bool(np.all(const))
    node = None if value is None else value.producer()
    if node is None or depth > _MAX_DEPTH or len(node.inputs) != 2:
        return False
    if is_op(node, "And"):
        return _all_true(node.inputs[0], depth + 1) and _all_true(node.inputs[1], depth + 1)
    if is_op(node, "GreaterOrEqual"):
        bound = _const(node.inputs[1])
        return bound is not None and bool(np.all(bound <= 0)) and _non_negative(node.inputs[0], depth + 1)
    return False


def _is_identity(value: ir.Value | None, op_type: str) -> bool:
    """True when every element of `value` is `op_type`'s identity (And: provably True; else a constant)."""
    if op_type == "And":
        return _all_true(value)
    const = _const(value)
    return const is not None and bool(np.all(const == _IDENTITY[op_type][0]))


def _narrowed(value: ir.Value, depth: int = 0, seen: dict[int, _Plan] | None = None) -> _Plan:
    """The plan computing `value` without the broadcast-only steps behind it; `value` itself where
    some op on the way is neither element-wise nor a broadcast (the caller checks the plan's shape).
    `seen`: the plans made so far, so a value read twice is walked once."""
    seen = {} if seen is None else seen
    if id(value) not in seen:
        seen[id(value)] = _walked(value, depth, seen)
    return seen[id(value)]


def _walked(value: ir.Value, depth: int, seen: dict[int, _Plan]) -> _Plan:
    """`_narrowed` for a value not seen yet: one step back through its producer."""
    node = value.producer()
    shape = value.shape
    if node is None or depth > _MAX_DEPTH or len(node.outputs) != 1 or (shape is not None and (len(shape) < 2 or shape[-2] == 1)):
        return _Plan(value)
    if is_op(node, "Expand") and node.inputs[0] is not None:
        return _narrowed(node.inputs[0], depth + 1, seen)
    if is_op(node, *_IDENTITY) and len(node.inputs) == 2:
        for position in _IDENTITY[node.op_type][1]:
            other = node.inputs[1 - position]
            if other is not None and other.dtype == value.dtype and _is_identity(node.inputs[position], node.op_type):
                return _narrowed(other, depth + 1, seen)
    if not is_op(node, *_ELEMENTWISE) or any(i is None for i in node.inputs):
        return _Plan(value)
    inputs = [_narrowed(i, depth + 1, seen) for i in node.inputs if i is not None]
    if all(p.node is None and p.value is i for p, i in zip(inputs, node.inputs)):
        return _Plan(value)  # nothing behind it changed
    return _Plan(value, node, inputs)


class RowMask(FusionRule):
    """FusedMHA(Q, K, V, f(broadcast(M)), ...) -> FusedMHA(Q, K, V, f(M), ...) when f(M) is one row over the query axis."""

    def __init__(self, target: str | Target) -> None:
        super().__init__(FAMILY, target)
        self.plan: _Plan | None = None

    def pattern(self, op, query, key, value, mask):
        return op.FusedMHA(query, key, value, mask, _allow_other_inputs=True, _allow_other_attributes=True, _domain=DEPLOYFUSE, _outputs=["attended"])

    def check(self, context, mask, attended, **_) -> MatchResult:
        fail = MatchResult().fail
        if mask is None or mask.shape is None or len(mask.shape) < 2 or mask.shape[-2] == 1:
            return fail("no Mask, a Mask of unknown shape, or already one row over the query axis", attended)
        plan = _narrowed(mask)
        shape = plan.shape()
        if shape is None or len(shape) > 4 or (len(shape) >= 2 and shape[-2] != 1):
            return fail(f"without its broadcasts the Mask is {shape}, not one row over the query axis (rank <= 4)", mask)
        self.plan = plan
        return self.choose(context, attended, self.target.lowering(FAMILY))

    def rewrite(self, op, attended, **_):
        node = attended.producer()
        assert node is not None and self.plan is not None
        inputs = list(node.inputs)
        old, inputs[3] = inputs[3], _emit(op, self.plan)
        shape = self.plan.shape()
        if self.plan.node is not None and old is not None and old.shape is not None and shape is not None:  # a new value: the old dims where they stay
            inputs[3].dtype = old.dtype
            inputs[3].shape = ir.Shape([1 if d == 1 else old.shape[axis] for axis, d in zip(range(-len(shape), 0), shape)])
        attrs = {k: a.value for k, a in node.attributes.items()}
        return self.emit(op, *inputs, **attrs)


def _emit(op, plan: _Plan, made: dict[int, ir.Value] | None = None) -> ir.Value:
    """The plan's value: the kept value, or its node rebuilt on the rebuilt inputs (once per plan: `made`)."""
    if plan.node is None:
        return plan.value
    made = {} if made is None else made
    if id(plan) not in made:
        attrs = {k: a.value for k, a in plan.node.attributes.items()}
        made[id(plan)] = getattr(op, plan.node.op_type)(*(_emit(op, p, made) for p in plan.inputs), _domain=plan.node.domain, **attrs)
    return made[id(plan)]


def _static_rows(value: ir.Value | None) -> bool:
    """True when `value`'s shape is known with every axis but the first a number."""
    shape = None if value is None else value.shape
    return shape is not None and len(shape) >= 1 and all(isinstance(d, int) for d in list(shape)[1:])


def _axes(value: ir.Value | None, rank: int) -> list[int] | None:
    """A constant axes operand as non-negative axes of a rank-`rank` value, else None."""
    const = _const(value)
    return None if const is None else [int(a) % rank for a in const.reshape(-1)]


def _same_rows(value: ir.Value | None, depth: int = 0) -> bool:
    """True when every slice of `value` along axis 0 is one tensor that neither the graph inputs' data nor their
    dims decide: a constant whose rows are equal, or an Expand / element-wise op / Unsqueeze / Slice / Concat /
    CumSum (all off axis 0) / GatherND of such values, with every other axis a number. The batch axis (any size)
    only enters through an Expand's shape, and through the first index of a GatherND reading such a value,
    which picks one of its equal rows (HF's `packed_sequence_mask[batch_idx, q_idx]` over position ids expanded
    to the batch)."""
    const = _const(value)
    if const is not None:
        return const.ndim >= 1 and bool(np.all(const == const[:1]))
    node = None if value is None else value.producer()
    if node is None or depth > _MAX_DEPTH or not _static_rows(value) or len(node.outputs) != 1 or node.domain not in ("", "ai.onnx"):
        return False
    assert value is not None and value.shape is not None
    rank, inputs = len(value.shape), list(node.inputs)
    if is_op(node, "Expand"):
        return _operand_rows(inputs[0], rank, depth)
    if is_op(node, *_ELEMENTWISE):
        return all(_operand_rows(i, rank, depth) for i in inputs)
    if is_op(node, "Unsqueeze", "CumSum") and len(inputs) == 2:
        axes = _axes(inputs[1], rank)  # Unsqueeze's axes index its output, CumSum's its input: both of this rank
        return axes is not None and 0 not in axes and _same_rows(inputs[0], depth + 1)
    if is_op(node, "Slice") and len(inputs) >= 4:
        axes = _axes(inputs[3], rank)
        fixed = all(_const(i) is not None for i in inputs[1:] if i is not None)
        return axes is not None and 0 not in axes and fixed and _same_rows(inputs[0], depth + 1)
    if is_op(node, "Concat"):
        axis = node.attributes.get_int("axis", 0) % rank
        return axis != 0 and all(_same_rows(i, depth + 1) for i in inputs)
    if is_op(node, "GatherND") and node.attributes.get_int("batch_dims", 0) == 0 and len(inputs) == 2:
        return _same_rows(inputs[0], depth + 1) and _batch_first_index(inputs[1], depth + 1)
    return False


def _operand_rows(operand: ir.Value | None, rank: int, depth: int) -> bool:
    """An operand of a rank-`rank` broadcast: a constant below that rank (it broadcasts over axis 0), or a value of
    that rank with `_same_rows`."""
    if operand is None or operand.shape is None:
        return False
    if len(operand.shape) < rank:
        return _const(operand) is not None
    return len(operand.shape) == rank and _same_rows(operand, depth + 1)


def _batch_first_index(indices: ir.Value | None, depth: int) -> bool:
    """GatherND indices Concat(b, rest..., axis=-1) with b one index wide (whatever it holds: it picks among equal
    rows) and every `rest` of `_same_rows`."""
    node = None if indices is None else indices.producer()
    if node is None or not is_op(node, "Concat") or indices is None or indices.shape is None or len(indices.shape) < 2:
        return False
    rank = len(indices.shape)
    first = node.inputs[0]
    if node.attributes.get_int("axis", 0) % rank != rank - 1 or first is None or first.shape is None or first.shape[-1] != 1:
        return False
    return all(i is not None and i.shape is not None and len(i.shape) == rank and _same_rows(i, depth) for i in node.inputs[1:])


def _cone(value: ir.Value) -> tuple[list[ir.Node], list[ir.Value], list[ir.Value]]:
    """The nodes computing `value` in topological order, the initializers and the graph inputs they read."""
    nodes: list[ir.Node] = []
    constants: dict[int, ir.Value] = {}
    inputs: dict[int, ir.Value] = {}
    seen: set[int] = set()

    def visit(v: ir.Value) -> None:
        node = v.producer()
        if node is None:
            (constants if v.const_value is not None else inputs)[id(v)] = v
        elif id(node) not in seen:
            seen.add(id(node))
            for i in node.inputs:
                if i is not None:
                    visit(i)
            nodes.append(node)

    visit(value)
    return nodes, list(constants.values()), list(inputs.values())


def batch_row(value: ir.Value, opset: int) -> np.ndarray | None:
    """`value`'s first slice along axis 0 ([1, ...]), computed on ONNX Runtime's CPU with every graph input it reads
    at 1 on its dynamic axes (zeros: `_same_rows` proved the row independent of them), or None when that fails, when
    the cone is too big to be a Mask built from shapes, or when the row is not the shape `value` declares."""
    from onnx import TensorProto, helper

    from deployfuse.backends.ort import run, session

    const = _const(value)
    if const is not None:
        return const[:1]
    nodes, constants, inputs = _cone(value)
    if len(nodes) > _MAX_CONE_NODES or any(n.domain not in ("", "ai.onnx") for n in nodes) or any(i.shape is None or i.dtype is None for i in inputs):
        return None
    if sum(c.const_value.nbytes for c in constants if c.const_value is not None) > _MAX_CONE_BYTES:
        return None
    try:  # a failure here (an input dtype numpy lacks, an Expand or index the dummy inputs make invalid) refuses this Mask only
        feeds = {i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape], i.dtype.numpy()) for i in inputs}
        graph = helper.make_graph([ir.serde.serialize_node(n) for n in nodes], "batch_row",
                                  [helper.make_tensor_value_info(i.name, i.dtype.value, feeds[i.name].shape) for i in inputs],
                                  [helper.make_tensor_value_info(value.name, value.dtype.value if value.dtype else TensorProto.UNDEFINED, None)],
                                  [_named(ir.serde.serialize_tensor(c.const_value), c.name) for c in constants if c.const_value is not None])
        row = next(iter(run(session(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10), optimize=False), feeds).values()))
    except Exception:
        return None
    declared = None if value.shape is None else list(value.shape)[1:]
    return row[:1] if row.ndim >= 1 and row.shape[0] >= 1 and list(row.shape[1:]) == declared else None


def _named(tensor: onnx.TensorProto, name: str | None) -> onnx.TensorProto:
    """`tensor` named as the value it initializes."""
    tensor.name = name or tensor.name
    return tensor


def _row_name(mask: ir.Value | None) -> str:
    """The name of the initializer holding `mask`'s batch row, one for every FusedMHA reading it."""
    return f"{None if mask is None else mask.name}_batch_row"


class BatchRowMask(FusionRule):
    """FusedMHA(Q, K, V, M) -> FusedMHA(Q, K, V, M[:1]) as a constant, when M's rows over the batch axis are one
    tensor made from constants and shapes only (`_same_rows`): a causal mask built at the batch size."""

    def __init__(self, target: str | Target) -> None:
        super().__init__(f"{FAMILY}_batch", target)
        self.row: np.ndarray | None = None

    def pattern(self, op, query, key, value, mask):
        return op.FusedMHA(query, key, value, mask, _allow_other_inputs=True, _allow_other_attributes=True, _domain=DEPLOYFUSE, _outputs=["attended"])

    def check(self, context, mask, attended, **_) -> MatchResult:
        fail = MatchResult().fail
        if mask is None or mask.shape is None or len(mask.shape) != 4 or mask.shape[0] == 1:
            return fail("no Mask, a Mask of unknown rank, or already one batch row", attended)
        if not _same_rows(mask):
            return fail("the Mask's batch rows are not provably one tensor of constants and shapes", mask)
        graph = attended.producer().graph
        made = None if graph is None else graph.initializers.get(_row_name(mask))  # another layer's FusedMHA reads the same Mask
        self.row = made.const_value.numpy() if made is not None and made.const_value is not None else batch_row(mask, default_opset(context))
        if self.row is None:
            return fail("the Mask's batch row does not evaluate at batch 1", mask)
        return self.choose(context, attended, self.target.lowering(FAMILY))

    def rewrite(self, op, attended, **_):
        node = attended.producer()
        assert node is not None and node.graph is not None and self.row is not None
        inputs = list(node.inputs)
        name = _row_name(inputs[3])
        row = node.graph.initializers.get(name)
        if row is None:  # every layer reads the same Mask: one initializer for them all
            row = ir.Value(name=name, shape=ir.Shape(self.row.shape), type=ir.TensorType(ir.DataType.from_numpy(self.row.dtype)),
                           const_value=ir.tensor(self.row, name=name))
            node.graph.register_initializer(row)
        inputs[3] = row
        attrs = {k: a.value for k, a in node.attributes.items()}
        return self.emit(op, *inputs, **attrs)


def rules(target: str | Target) -> list[pattern.RewriteRule]:
    """The batch-row and row-mask rules where the target lowers them (ort-cuda); none elsewhere."""
    if not get_target(target).lowering(FAMILY):
        return []
    return [BatchRowMask.rule(target), RowMask.rule(target)]
