"""Reading a scaled dot-product attention core off the graph, whatever exporter wrote it.

The core every exporter emits, on 4-D tensors Q [B, H, S, D], K [B, H, L, D], V [B, H, L, Dv]:

    scores = (Q·a) @ (Kᵀ·b) · c  [+ mask]          a, b, c scalar constants (Mul, or Div by 1/x)
    P      = Softmax(scores, axis=-1)  [NaN → 0]   (the NaN guard of torch's SDPA decomposition)
    O      = P @ V                                 O = softmax(Q Kᵀ · abc + mask) V

Hand-written attention often masks by selection instead: `scores.masked_fill(c, F)` (nanoGPT, minGPT) is
Where(c, F, scores), and `torch.where(c, scores, F)` (GPT-Neo) is Where(c, scores, F), either around the scores or
under the additive mask. With F = -inf that is scores + Where(c, -inf, 0) exactly. With a finite F ≤ -1e4 the masked
scores become s + F instead of F: both lie ≤ F + max|s|, and softmax gives them weight exp(F + s - rowmax), which
underflows to 0 as exp(F - rowmax) does; only a row with every score masked (a padding query) differs. So the selection
becomes an additive mask (`Core.select`); a larger F is a score, not a mask, and is refused.

Kᵀ comes as Transpose(K, [0,1,3,2]), as Transpose(K_bshd, [0,2,3,1]) straight from the
[B, L, H, D] split, or as Reshape→Transpose([0,2,1])→Reshape through 3-D (torch's
decomposition). With static shapes the exporter's optimiser merges the reshape that repeats
grouped K/V heads ([B, G, r, L, D] → [B, G·r, L, D]) into that 3-D flattening, so the flattened
tensor may also be the 5-D repeat itself (layout "grouped"; the rule reshapes it back to
[B, H, L, D]). Each reshape is proven with `_attention_shapes`, never assumed.

Some models run the core on heads flattened into the batch (BLOOM: Q, K, V as [B·H, S, D], the scores
[B·H, S, L] plus ALiBi's [B·H, 1, L] bias, then reshaped to [B, H, S, L] for the mask and the softmax).
A [B·H, S, D] tensor that is a Reshape of a [B, H, S, D] one keeping its last two axes is that tensor's
flat view (the first axis is then forced to B·H), so the core is read on the 4-D tensors, and the flat
bias, whose first axis is the flat scores' own, is reshaped to [B, H, ·, L] and added to the mask.
`read_core` walks back from Softmax's input and returns a `Core`, or the reason it declines.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from deployfuse.rewrite.rules._attention_shapes import DimOf, partial_reshape_target, rank, reshape_target, same_dim, scalar, split_heads_source, split_source, static_dim
from deployfuse.rewrite.rules._common import is_op


@dataclass
class Core:
    """The parts of one attention core.

    Attributes:
        query: Q as [B, H, S, D].
        key: K as [B, H, L, D] (`key_layout` "bhsd"), [B, L, H, D] ("bshd") or grouped heads
            repeated [B, G, r, L, D] with G·r = H ("grouped").
        value: V as [B, H, L, Dv].
        mask: the additive mask (broadcastable to [B, H, S, L]) or None.
        scale: the product of every constant factor on the scores.
        heads, head_dim, value_head_dim: H, D, Dv.
        select: a mask by selection, to add to `mask`, or None.
        flat_bias: an additive [B·H, 1|S, L] term of flat scores (BLOOM's ALiBi), to add to `mask` as [B, H, 1|S, L].
    """

    query: ir.Value
    key: ir.Value
    key_layout: str
    value: ir.Value
    mask: ir.Value | None
    scale: float
    heads: int
    head_dim: int
    value_head_dim: int
    select: Select | None = None
    flat_bias: ir.Value | None = None


@dataclass(frozen=True)
class Select:
    """Scores replaced by `fill` where `condition` is `where` (True: Where(c, F, s); False: Where(c, s, F))."""

    condition: ir.Value
    fill: float
    where: bool


_MASKING_FILL = -1e4  # the largest fill taken as a mask: fp16's lowest is -65504, BERT's old additive masks -1e4


def _peel_select(value: ir.Value) -> tuple[ir.Value, Select | None] | str:
    """`(s, Select)` when `value` is Where(c, F, s) or Where(c, s, F) with F a scalar constant, `(value, None)` when it
    is no Where; or why the selection is not a mask."""
    node = value.producer()
    if not is_op(node, "Where"):
        return value, None
    condition, on_true, on_false = node.inputs
    for where, fill_value, kept in ((True, on_true, on_false), (False, on_false, on_true)):
        fill = scalar(fill_value)
        if fill is not None and scalar(kept) is None:
            if not fill <= _MASKING_FILL:
                return f"the scores are selected against {fill}, above {_MASKING_FILL}: a score, not a mask"
            return kept, Select(condition, fill, where)
    return value, None


def _peel_scale(value: ir.Value) -> tuple[ir.Value, float]:
    """`(x, f)` with value = x·f, peeling Mul / Div by scalar constants."""
    factor = 1.0
    while True:
        node = value.producer()
        if is_op(node, "Mul"):
            a, b = node.inputs
            if scalar(b) is not None:
                value, factor = a, factor * scalar(b)
                continue
            if scalar(a) is not None:
                value, factor = b, factor * scalar(a)
                continue
        if is_op(node, "Div") and scalar(node.inputs[1]) not in (None, 0.0):
            value, factor = node.inputs[0], factor / scalar(node.inputs[1])
            continue
        return value, factor


def _perm(node: ir.Node) -> list[int] | None:
    perm = node.attributes.get("perm")
    return list(perm.as_ints()) if perm is not None else None


def _matches(entries: list, wanted: list[DimOf]) -> int:
    return sum(1 for e, w in zip(entries, wanted) if same_dim(e, w))


def _untranspose_key(key_t: ir.Value) -> tuple[ir.Value, str] | None:
    """K and its layout from Kᵀ ([B, H, D, L]), or None when Kᵀ is not provably a transpose."""
    node = key_t.producer()
    if is_op(node, "Transpose"):
        perm = _perm(node)
        if perm == [0, 1, 3, 2]:
            return node.inputs[0], "bhsd"
        if perm == [0, 2, 3, 1]:
            return node.inputs[0], "bshd"
        return None
    if not is_op(node, "Reshape"):
        return None
    transpose = node.inputs[0].producer()
    if not is_op(transpose, "Transpose") or _perm(transpose) != [0, 2, 1]:
        return None
    flatten = transpose.inputs[0].producer()
    if not is_op(flatten, "Reshape"):
        return None
    key = flatten.inputs[0]
    key_rank = rank(key)
    if key_rank not in (4, 5):
        return None
    flat, back = reshape_target(flatten), reshape_target(node)
    if flat is None or back is None or len(flat) != 3 or len(back) != 4:
        return None
    # [X, L, D] keeps the last two axes (X is then forced to B·H); [B, H, D, L] restores them
    # swapped: three provable entries force the fourth, the element count being fixed.
    length, depth = DimOf(key, key_rank - 2), DimOf(key, key_rank - 1)
    if _matches(flat[1:], [length, depth]) != 2:
        return None
    if key_rank == 4:
        if _matches(back, [DimOf(key, 0), DimOf(key, 1), depth, length]) < 3:
            return None
        return key, "bhsd"
    # [B, G, r, L, D]: B, D and L provable and G·r = H, all four entries pinned.
    groups, reps = static_dim(key, 1), static_dim(key, 2)
    if groups is None or reps is None or not same_dim(back[1], groups * reps) or _matches([back[0], back[2], back[3]], [DimOf(key, 0), depth, length]) != 3:
        return None
    return key, "grouped"


def unflat_heads(flat: ir.Value) -> ir.Value | None:
    """The [B, H, S, D] tensor whose flat view [B·H, S, D] `flat` is (a Reshape keeping the last two axes), else None."""
    node = flat.producer()
    if not is_op(node, "Reshape") or rank(node.inputs[0]) != 4 or rank(flat) != 3:
        return None
    heads, target = node.inputs[0], partial_reshape_target(node)  # the first entry, B·H, is forced by the others
    if target is None or len(target) != 3 or _matches(target[1:], [DimOf(heads, 2), DimOf(heads, 3)]) != 2:
        return None
    return heads


def _flat_core(scores: ir.Value) -> tuple[ir.Value, ir.Value | None] | None:
    """(flat scores [B·H, S, L] without their additive bias, the bias or None) when the 4-D `scores` is a Reshape of
    (scaled) flat Q·Kᵀ [+ bias]; the Reshape's target is checked against Q and K by `read_core`."""
    node = scores.producer()
    if not is_op(node, "Reshape") or rank(node.inputs[0]) != 3:
        return None
    flat = node.inputs[0]
    added = flat.producer()
    candidates = [(added.inputs[side], added.inputs[1 - side]) for side in (0, 1)] if is_op(added, "Add") else [(flat, None)]
    for product, bias in candidates:
        if not is_op(_peel_scale(product)[0].producer(), "MatMul"):
            continue
        if bias is None or (rank(bias) == 3 and same_dim(DimOf(bias, 0), DimOf(flat, 0))):
            return product, bias
    return None


def _heads(value: ir.Value, layout: str = "bhsd") -> tuple[int | None, int | None]:
    """(H, D) of a [B, H, S, D] ("bhsd") or [B, S, H, D] ("bshd") tensor: from its shape, else
    from the split that made it."""
    heads_axis, find_source = (1, split_heads_source) if layout == "bhsd" else (2, split_source)
    heads, head_dim = static_dim(value, heads_axis), static_dim(value, 3)
    if heads is None or head_dim is None:
        source = find_source(value)
        if source is not None:
            heads, head_dim = heads or source[1], head_dim or source[2]
    return heads, head_dim


def read_core(scores: ir.Value, value: ir.Value) -> Core | str:
    """The attention core whose Softmax input is `scores` and whose P @ V uses `value`; or why not."""
    mask = None
    peeled = _peel_select(scores)
    if isinstance(peeled, str):
        return peeled
    scores, select = peeled
    node = scores.producer()
    if is_op(node, "Add"):
        for side in (0, 1):
            operand, inner_select = node.inputs[side], None
            if select is None:  # GPT-Neo: Where(c, s, F) + mask
                peeled = _peel_select(operand)
                if isinstance(peeled, str):
                    return peeled
                operand, inner_select = peeled
            inner, _ = _peel_scale(operand)
            if is_op(inner.producer(), "MatMul") or _flat_core(operand) is not None:
                scores, mask = operand, node.inputs[1 - side]
                select = select if select is not None else inner_select
                break
        else:
            return "Softmax input is an Add without a Q·Kᵀ MatMul operand"
    unflattened, flat = scores, _flat_core(scores)
    flat_bias = None
    if flat is not None:
        scores, flat_bias = flat
    product, score_scale = _peel_scale(scores)
    matmul = product.producer()
    if not is_op(matmul, "MatMul"):
        return "Softmax input is not (scaled, masked) Q·Kᵀ"
    if len(product.uses()) != 1:
        return "the attention scores have other consumers"
    query, query_scale = _peel_scale(matmul.inputs[0])
    key_t, key_scale = _peel_scale(matmul.inputs[1])
    if flat is not None:
        transpose = key_t.producer()
        query = unflat_heads(query)
        key = unflat_heads(transpose.inputs[0]) if is_op(transpose, "Transpose") and _perm(transpose) == [0, 2, 1] else None
        target = partial_reshape_target(unflattened.producer())
        if query is None or key is None or target is None or len(target) != 4:
            return "the flat scores are not Q·Kᵀ of flat [B·H, S, D] views"
        # [B, H, S, L]: B, H, S proven from Q; L (or -1) is then forced by the element count
        if _matches(target[:3], [DimOf(query, 0), DimOf(query, 1), DimOf(query, 2)]) != 3:
            return "the flat scores are not reshaped back to [B, H, S, L]"
        key_and_layout: tuple[ir.Value, str] | None = (key, "bhsd")
    else:
        key_and_layout = _untranspose_key(key_t)
    if key_and_layout is None:
        return "the key operand is not a provable transpose of K"
    key, layout = key_and_layout
    if rank(query) != 4 or rank(key) != (5 if layout == "grouped" else 4) or rank(value) != 4:
        return "Q, K, V are not 4-D"
    heads, head_dim = _heads(query)
    value_heads, value_head_dim = _heads(value)
    if layout == "grouped":
        key_heads, key_head_dim = static_dim(key, 1) * static_dim(key, 2), static_dim(key, 4)
    else:
        key_heads, key_head_dim = _heads(key, layout)
    if None in (heads, head_dim, value_head_dim):
        return "heads / head sizes are not static"
    if key_heads != heads or key_head_dim != head_dim or value_heads != heads:
        return "K / V heads or head size differ from Q's (grouped K/V must be expanded first)"
    if mask is not None and (rank(mask) is None or rank(mask) > 4):
        return "the mask's rank is unknown or above 4"
    if select is not None and rank(select.condition) not in (1, 2, 3, 4):
        return "the selection's condition has an unknown rank or one above 4"
    return Core(query, key, layout, value, mask, query_scale * key_scale * score_scale, heads, head_dim, value_head_dim, select, flat_bias)
