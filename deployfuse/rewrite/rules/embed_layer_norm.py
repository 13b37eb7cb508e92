"""BERT-style embeddings -> one com.microsoft.EmbedLayerNormalization.

    LayerNorm(W[ids] + P[0..S-1] (+ T[types]), γ, β, ε)
        = EmbedLayerNormalization(int32(ids), int32(types), W, P, T, γ, β; epsilon=ε)

ids and types are [B, S] token / segment ids, W, P, T the [V, H] word, position and segment
tables; the sum is [B, S, H] and the norm is over H. ONNX Runtime's kernel gathers the three rows
of each token, adds them and normalises them in one pass (without position_ids it reads position
s for token s). On an H200 (ORT CUDA EP, the fp8 artefact of bench/results/h200_quant.md section 5)
BERT-base's embeddings at batch 64 were two Gathers, two broadcast Adds and a SkipLayerNormFp8: 0.088 ms
and five launches; the kernel takes 0.028 ms (section 6).

Matched: a LayerNormalization over the last axis of a sum of 2 or 3 terms (Adds in any order and
operand order, each intermediate sum read only by the next Add):
- the word lookup: a Gather (axis 0) of a [V, H] table by 2-D int ids; with two such lookups the
  larger table is the word table, the other the segment table, whose ids must be 2-D with no
  static size unlike the word ids' (sizes not known statically the kernel checks: it fails where
  the graph would have broadcast);
- the positions: a Gather of a [N, H] table by arange(S), a Slice [0, S) of a constant buffer
  whose values are checked to be 0, 1, ..., N-1 (HF BERT / DistilBERT's `position_ids`), S proven
  the word ids' axis 1 (a constant end with static shapes, or the size of axis 1 of a tensor
  declared to share it); or that Gather constant-folded by a static export into a [1, S, H] or
  [S, H] constant, passed as the position table;
- or, where no term is such positions, a third lookup by 2-D ids (RoBERTa's, computed from the
  ids with a padding offset; a buffer that is not 0..N-1; a position_ids input): its ids are passed
  as position_ids ([B, S] or [1, S]; the one of two lookups whose ids have a first axis of 1, else
  the larger table);
- a segment lookup by all-zero ids (HF's token_type_ids buffer, when the caller passes none)
  whose shape is known to broadcast into [B, S]: every token gets row T[0], folded into the
  position rows (P[s] + T[0], rounded once in the table's dtype); the node has no segment input.
The mask_index output is named and unused: the CUDA kernel writes it, and ORT's type inference
wants it. Refused: a term that is neither a lookup nor folded position rows, a lone word lookup
(no position term), bfloat16 (no kernel), a sum another node also reads (GPT-2's: the residual
stream). Invalid ids (negative or past a table) are an error in ORT's CPU kernel and recent CUDA ones, where ONNX's Gather wraps
a negative one; PyTorch's Embedding rejects both.

ort-cuda only: ONNX Runtime's CPU kernel is fp32-only (fp16 runs through ORT's inserted casts),
and CPU lookups cost little next to the encoder; TensorRT parses no com.microsoft op. `deployfuse
export` applies it only with --cuda-graph (`rules.CUDA_GRAPH_ONLY`: outside a graph ORT's CUDA kernel
synchronises the stream on every call); `fuse` itself, given no family list, runs it. Runs right
after `layernorm` (which writes the LayerNormalization it matches) and before `skip_layernorm`,
which would otherwise take the last Add. In an fp8 export `fp8_norm` cannot take this norm, so
the first layer's QKV GEMM quantizes its X itself (tiny BERT fp8: Slice, 3 Gathers, 2 Adds and a
SkipLayerNormFp8 become 2 Casts and this node).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult, pattern

from deployfuse.rewrite.rules._attention_shapes import constant, constant_ints
from deployfuse.rewrite.rules._common import FusionRule, is_op, last_dim
from deployfuse.targets import Target, get_target

FAMILY = "embed_layer_norm"

_INT_IDS = (ir.DataType.INT64, ir.DataType.INT32)
# Ops whose output is elements of their first input (picked, repeated or reshaped), whatever the other inputs.
_PICKING = ("Expand", "GatherElements", "Gather", "Slice", "Reshape", "Unsqueeze", "Squeeze", "Identity", "Tile", "Flatten")


class _Lookup(NamedTuple):
    """A Gather of a [V, H] table by integer ids."""

    table: ir.Value
    ids: ir.Value


class _Plan(NamedTuple):
    """What the fused node reads: the word lookup, the position table (a graph value, or the folded
    position rows to store), the optional segment lookup, and the norm's parameters."""

    word: _Lookup
    positions: ir.Value | np.ndarray
    segment: _Lookup | None
    position_ids: ir.Value | None  # None: position s for token s
    epsilon: float


def _lookup(value: ir.Value) -> _Lookup | None:
    node = value.producer()
    if not is_op(node, "Gather") or node.attributes.get_int("axis", 0) != 0:
        return None
    table, ids = node.inputs[0], node.inputs[1]
    if table is None or ids is None or table.shape is None or len(table.shape) != 2 or ids.dtype not in _INT_IDS:
        return None
    return _Lookup(table, ids)


def _terms(value: ir.Value, depth: int = 0) -> list[ir.Value]:
    """The operands of the Add tree that computes `value` (intermediate sums read only by their Add)."""
    node = value.producer()
    if depth > 2 or not is_op(node, "Add") or (depth and len(value.uses()) != 1) or value.is_graph_output():
        return [value]
    assert node is not None
    return [t for v in node.inputs if v is not None for t in _terms(v, depth + 1)]


def _equal_dims(x: int | ir.SymbolicDim, y: int | ir.SymbolicDim) -> bool:
    """True when two dims are declared the same size (one int, or one named symbol)."""
    if isinstance(x, int) or isinstance(y, int):
        return x == y
    return x.value is not None and x.value == y.value


def _same_dim(a: ir.Value, b: ir.Value, axis: int) -> bool:
    """True when axis `axis` of `a` and `b` is declared the same size."""
    if a.shape is None or b.shape is None or len(a.shape) <= axis or len(b.shape) <= axis:
        return False
    return _equal_dims(a.shape[axis], b.shape[axis])


def _is_seq_len(end: ir.Value, ids: ir.Value) -> bool:
    """True when `end` is [S], S the size of the ids' axis 1: Shape(v)[1:2] (the dynamo export) or
    Unsqueeze(Gather(Shape(v), 1), [0]) (TorchScript), v's axis 1 declared the ids' axis 1."""
    node = end.producer()
    if is_op(node, "Unsqueeze") and node is not None and node.inputs[0] is not None:
        axes = constant_ints(node.inputs[1]) if len(node.inputs) > 1 else list(node.attributes.get_ints("axes", []) or [])
        picked = node.inputs[0].producer()
        if axes != [0] or not is_op(picked, "Gather") or picked is None or constant_ints(picked.inputs[1]) != [1] or picked.inputs[1].shape != ir.Shape([]):
            return False
        node = picked.inputs[0].producer() if picked.inputs[0] is not None else None
        if not is_op(node, "Shape") or node is None or node.attributes.get_int("start", 0) != 0 or "end" in node.attributes:
            return False
    elif is_op(node, "Shape") and node is not None and node.inputs[0] is not None and node.inputs[0].shape is not None:
        end = node.attributes.get_int("end", len(node.inputs[0].shape))
        if node.attributes.get_int("start", 0) != 1 or end != 2:
            return False
    else:
        return False
    source = node.inputs[0]
    return source is not None and (source is ids or _same_dim(source, ids, 1))


def _arange_refusal(ids: ir.Value, word_ids: ir.Value) -> str | None:
    """None when `ids` is 0, 1, ..., S-1 as [1, S] or [S] (S: the word ids' axis 1), else why not."""
    seq = word_ids.shape[1] if word_ids.shape is not None and len(word_ids.shape) == 2 else None
    values = constant(ids)
    if values is not None:
        ok = values.ndim in (1, 2) and values.shape[-1] == values.size and values.size == seq
        return None if ok and np.array_equal(values.reshape(-1), np.arange(values.size)) else "constant positions are not arange(S)"
    node = ids.producer()
    if not is_op(node, "Slice") or node is None:
        return "the positions are neither a constant nor a Slice of one"
    buffer = constant(node.inputs[0])
    if buffer is None or buffer.ndim not in (1, 2) or buffer.shape[0] * buffer.shape[-1] != buffer.size:
        return "the positions are not a Slice of a constant [N] or [1, N] buffer"
    if not np.array_equal(buffer.reshape(-1), np.arange(buffer.size)):
        return "the position buffer is not 0, 1, ..., N-1"
    axes = constant_ints(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else list(range(buffer.ndim))
    steps = constant_ints(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else [1]
    if constant_ints(node.inputs[1]) != [0] or axes not in ([buffer.ndim - 1], [-1]) or steps != [1]:
        return "the Slice does not take the buffer's first elements along its last axis"
    end = node.inputs[2]
    assert end is not None
    ends = constant_ints(end)
    if ends is not None:
        return None if len(ends) == 1 and isinstance(seq, int) and min(max(ends[0], 0), buffer.size) == seq else "the Slice's constant end is not S"
    return None if _is_seq_len(end, word_ids) else "the Slice's end is not known to be the ids' sequence length"


def _folded_positions(value: ir.Value, word_ids: ir.Value, hidden: int) -> np.ndarray | None:
    """The [S, H] rows of a constant-folded position lookup ([1, S, H] or [S, H]), else None."""
    rows = constant(value)
    seq = word_ids.shape[1] if word_ids.shape is not None and len(word_ids.shape) == 2 else None
    if rows is None or rows.ndim not in (2, 3) or rows.shape[-2:] != (seq, hidden) or rows.size != seq * hidden:
        return None
    return rows.reshape(seq, hidden)


def _broadcasts_into(ids: ir.Value, word_ids: ir.Value) -> bool:
    """True when `ids`' shape is known to broadcast into the word ids' (each axis 1 or the same size)."""
    if ids.shape is None or len(ids.shape) > 2:
        return False
    words = word_ids.shape
    return words is not None and all(ids.shape[axis] == 1 or _equal_dims(ids.shape[axis], words[axis]) for axis in range(-len(ids.shape), 0))


def _leading_one(ids: ir.Value) -> bool:
    return ids.shape is not None and len(ids.shape) == 2 and ids.shape[0] == 1


def _maybe_same_shape(ids: ir.Value, word_ids: ir.Value, leading_one: bool = False) -> bool:
    """True when `ids` is 2-D with no static size unlike the word ids' (unknown sizes the kernel
    checks at run time); with `leading_one`, a first axis of 1 too (position_ids may be [1, S])."""
    if ids.shape is None or word_ids.shape is None or len(ids.shape) != 2:
        return False
    if leading_one and ids.shape[0] == 1:
        return not _differ(ids.shape[1], word_ids.shape[1])
    return not any(_differ(a, b) for a, b in zip(ids.shape, word_ids.shape))


def _differ(a: int | ir.SymbolicDim, b: int | ir.SymbolicDim) -> bool:
    return isinstance(a, int) and isinstance(b, int) and a != b


def _all_zero(ids: ir.Value, depth: int = 0) -> bool:
    """True when `ids` are all 0: a constant all-zero buffer moved only by ops that pick or repeat
    elements of their first input (HF's `token_type_ids` buffer where the caller passes none)."""
    values = constant(ids)
    if values is not None:
        return values.size > 0 and not values.any()
    node = ids.producer()
    if depth > 8 or not is_op(node, *_PICKING) or node is None or node.inputs[0] is None:
        return False
    return _all_zero(node.inputs[0], depth + 1)


def plan(x: ir.Value, hidden: int) -> _Plan | str:
    """How the sum `x` (the norm's input, [B, S, H]) becomes one EmbedLayerNormalization, or why not
    (epsilon is filled in by the caller)."""
    terms = _terms(x)
    if len(terms) not in (2, 3):
        return f"the norm's input is a sum of {len(terms)} term(s), not 2 or 3"
    lookups = [(t, _lookup(t)) for t in terms]
    tokens = [lk for _, lk in lookups if lk is not None and lk.ids.shape is not None and len(lk.ids.shape) == 2 and constant(lk.ids) is None
              and not is_op(lk.ids.producer(), "Slice") and not _all_zero(lk.ids)]  # a Slice of a buffer: positions, not ids
    if not tokens:
        return "no term is a Gather of a [V, H] table by [B, S] ids"
    word_ids = max(tokens, key=lambda lk: lk.table.shape[0] if isinstance(lk.table.shape[0], int) else 0).ids
    positions: list[ir.Value | np.ndarray] = []
    rows: list[np.ndarray] = []  # lookups by all-zero ids: one row added to every token
    others: list[_Lookup] = []
    reasons = []
    for term, lk in lookups:
        if lk is None:
            folded = _folded_positions(term, word_ids, hidden)
            if folded is None:
                return "a term is neither a Gather of a table nor folded position rows"
            positions.append(folded)
            continue
        if last_dim(lk.table) != hidden:
            return "a table's width is not the norm's"
        refusal = _arange_refusal(lk.ids, word_ids)
        if refusal is None:
            positions.append(lk.table)
        elif lk not in tokens and _all_zero(lk.ids) and _broadcasts_into(lk.ids, word_ids):
            table = constant(lk.table)
            if table is None:
                return "a lookup by all-zero ids reads a table that is not a constant"
            rows.append(table[0])
        else:
            reasons.append(refusal)
            others.append(lk)
    if len(positions) > 1:
        return f"{len(positions)} position terms"
    others.sort(key=lambda lk: lk.ids is not word_ids)  # the word lookup first
    word, rest = others[0], others[1:]
    position_ids = None
    if not positions:  # positions by ids the graph is given or computes (RoBERTa's): passed as position_ids
        if not rest:
            return f"no position term ({'; '.join(reasons) or 'two terms, one a word lookup'})"
        by_position = max(rest, key=lambda lk: (_leading_one(lk.ids), lk.table.shape[0] if isinstance(lk.table.shape[0], int) else 0))
        rest.remove(by_position)
        if not _maybe_same_shape(by_position.ids, word_ids, leading_one=True):
            return "the position ids are not [B, S] or [1, S] like the word ids"
        positions.append(by_position.table)
        position_ids = by_position.ids
    if not all(_maybe_same_shape(lk.ids, word_ids) for lk in rest):  # where they differ, the kernel fails instead of broadcasting
        return "the segment ids are not [B, S] like the word ids"
    position = positions[0]
    if rows:  # folded into the position rows: P[s] + T[0], rounded once in the table's dtype
        table = position if isinstance(position, np.ndarray) else constant(position)
        if table is None:
            return "the position table is not a constant to fold the segment row into"
        position = (table.astype(np.float64) + sum(r.astype(np.float64) for r in rows)).astype(table.dtype)
    return _Plan(word, position, rest[0] if rest else None, position_ids, 0.0)


class EmbedLayerNorm(FusionRule):
    """LayerNormalization(word + position (+ segment) lookups) -> EmbedLayerNormalization."""

    def __init__(self, target: str | Target) -> None:
        super().__init__(FAMILY, target)
        self._plan: _Plan | None = None

    def pattern(self, op, x, scale):
        return op.LayerNormalization(x, scale, _allow_other_inputs=True, _allow_other_attributes=True, _outputs=["normed"])

    def check(self, context, x, scale, normed, **_) -> MatchResult:
        fail = MatchResult().fail
        node = normed.producer()
        hidden = last_dim(x)
        if x.shape is None or len(x.shape) != 3 or hidden is None:
            return fail("the norm's input is not known to be [B, S, H]", x)
        if node.attributes.get_int("axis", -1) not in (-1, 2):
            return fail("the norm is not over the last axis only", normed)
        if any(o.uses() or o.is_graph_output() for o in node.outputs[1:]):
            return fail("the norm's mean / inverse deviation outputs are read", normed)
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        if any(p is not None and (p.shape is None or list(p.shape) != [hidden]) for p in (scale, bias)):
            return fail("the norm's scale or bias is not [H]", scale)
        if x.producer() is None or len(x.uses()) != 1:
            return fail("the embedding sum is read by another node too", x)
        found = plan(x, hidden)
        if isinstance(found, str):
            return fail(found, x)
        self._plan = found._replace(epsilon=node.attributes.get_float("epsilon", 1e-5))
        return self.choose(context, x, self.target.lowering(FAMILY))

    def rewrite(self, op, x, scale, normed, **_):
        p = self._plan
        assert p is not None and x.shape is not None
        node = normed.producer()
        name = (p.positions.name if isinstance(p.positions, ir.Value) else None) or p.word.table.name or FAMILY

        def int32(ids: ir.Value) -> ir.Value:
            if ids.dtype == ir.DataType.INT32:
                return ids
            cast = op.Cast(ids, to=ir.DataType.INT32)
            cast.dtype, cast.shape = ir.DataType.INT32, ids.shape
            return cast

        positions = p.positions
        if isinstance(positions, np.ndarray):
            positions = op.initializer(ir.tensor(np.ascontiguousarray(positions)), name=f"{name}_{FAMILY}_positions")
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        if bias is None:
            dtype = x.dtype.numpy() if x.dtype is not None else np.float32
            bias = op.initializer(ir.tensor(np.zeros(last_dim(x) or 0, dtype)), name=f"{name}_{FAMILY}_beta")
        segment = p.segment
        tail = () if p.position_ids is None else (None, int32(p.position_ids))  # no mask, then the position ids
        y, _mask_index = self.emit(op, int32(p.word.ids), None if segment is None else int32(segment.ids), p.word.table, positions,
                                   None if segment is None else segment.table, scale, bias, *tail, epsilon=p.epsilon, _outputs=2)
        y.dtype, y.shape = normed.dtype, normed.shape  # later rules (attention, fp8) read the dtype and H of what this writes
        return y


def rules(target: str | Target) -> list[pattern.RewriteRule]:
    """The embedding rule where the target lowers it (ort-cuda); none elsewhere."""
    if not get_target(target).lowering(FAMILY):
        return []
    return [EmbedLayerNorm.rule(target)]
