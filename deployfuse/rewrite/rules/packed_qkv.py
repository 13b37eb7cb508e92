"""Self-attention with separate Q, K, V projections → com.microsoft.Attention (packed QKV).

    MHA(x·Wq + bq, x·Wk + bk, x·Wv + bv, attention_bias=A)
        = Attention(x, [Wq | Wk | Wv], [bq | bk | bv], attention_bias=A)

x·[Wq | Wk | Wv] + [bq | bk | bv] = [x·Wq + bq | x·Wk + bk | x·Wv + bv] column block by block, and
Attention splits its one projection at D and 2D into Q, K, V; so three GEMMs and three bias adds
become one GEMM inside the fused kernel. A projection without bias gets a zero block; a query
scaled after its projection (Whisper) has the scale folded into its weight and bias.

Only what maps exactly: one x for all three (self-attention; cross-attention is left to
MultiHeadAttention), constant weights of one shape [Din, D], constant biases [D], and a
MultiHeadAttention (as the attention family emits it) with no packed bias, key padding mask,
past or extra output. num_heads and scale carry over; the bias A, [B|1, H|1, S, L], is
Attention's `attention_bias` input as it is (no mask_index; GPT-2's combined causal mask stays
a bias: `unidirectional` would need the mask proven exactly causal). Runs right after `attention`.

Already packed (GPT-2's Conv1D, a Linear(D, 3D) split in three):

    MHA(Split(x·W + b, 3, axis=-1)) = Attention(x, W, b)          W [Din, 3D] = [Wq | Wk | Wv]

Q, K, V must be outputs 0, 1, 2 of one Split into equal thirds of the last axis, each read
only by the MultiHeadAttention; x·W + b is read with `_projection.projection` (MatMul [+ Add],
or Gemm with alpha / beta / transB folded, transA and non-row C refused, also on the flattened
tokens), so W's column blocks are already Attention's Q | K | V layout.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult, pattern

from deployfuse.rewrite.rules._attention_shapes import constant, rank
from deployfuse.rewrite.rules._common import FusionRule, Lowering, is_op, stored_once
from deployfuse.rewrite.rules._projection import QKVWeights, projection, self_attention_qkv
from deployfuse.targets import MS, Target, get_target

FAMILY = "packed_qkv"

_MHA_ATTRIBUTES = {"num_heads", "scale"}


def unpacked_inputs_refusal(attended: ir.Value) -> str | None:
    """Why the MultiHeadAttention producing `attended` is not one on Q, K, V and an optional
    attention bias alone, with num_heads and scale only (None when it is)."""
    node = attended.producer()
    assert node is not None
    if len(node.inputs) > 6 or any(v is not None for v in node.inputs[3:5]) or len(node.outputs) != 1:
        return "MultiHeadAttention has a packed bias, key padding mask, past or extra outputs"
    if set(node.attributes) - _MHA_ATTRIBUTES:
        return f"MultiHeadAttention has attributes besides {sorted(_MHA_ATTRIBUTES)}"
    return None


def _split_thirds(query: ir.Value, key: ir.Value, value: ir.Value) -> ir.Value | str | None:
    """The tensor Q, K, V were cut from when they are outputs 0, 1, 2 of one Split into thirds
    of its last axis, each read once; None when Q is no Split output; else why not."""
    node = query.producer()
    if not is_op(node, "Split"):
        return None
    if list(node.outputs) != [query, key, value]:
        return "Q, K, V are not outputs 0, 1, 2 of one Split"
    if any(len(v.uses()) != 1 for v in node.outputs):
        return "a Split output of the packed projection has other consumers"
    packed, axis = node.inputs[0], node.attributes.get_int("axis", 0)
    if axis != -1 and (rank(packed) is None or axis % rank(packed) != rank(packed) - 1):  # -1: the last axis at any rank
        return "the Split is not over the last axis"
    sizes = node.inputs[1] if len(node.inputs) > 1 else None
    if sizes is not None:
        array = constant(sizes)
        if array is None or len(set(array.reshape(-1).tolist())) != 1:
            return "the Split's sizes are not three equal constants"
    elif node.attributes.get_int("num_outputs", 3) != 3:
        return "the Split does not cut three equal parts"
    return packed


def _from_split(packed: ir.Value) -> QKVWeights | str:
    """x, W, b when `packed` = x·W [+ b] (Split in three equal parts: W's column blocks are Q | K | V); or why not."""
    found = projection(packed)
    if isinstance(found, str):
        return f"the packed Q|K|V projection: {found}"
    weight, hidden = found.weight, found.weight.shape[1] // 3
    if rank(found.x) != 3 or weight.shape[1] != 3 * hidden:
        return "x is not [B, S, Din] or the packed weight is not [Din, 3D]"
    bias = np.zeros(3 * hidden, weight.dtype) if found.bias is None else found.bias
    if bias.shape != (3 * hidden,) or bias.dtype != weight.dtype:
        return "the packed bias is not a vector [3D] of the weight's dtype"
    return QKVWeights(found.x, weight, bias, found.weight_value.name or "qkv")


class PackedQKV(FusionRule):
    """MultiHeadAttention(x·Wq [+ bq], x·Wk [+ bk], x·Wv [+ bv], ∅, ∅, A?) or
    MultiHeadAttention(Split(x·W [+ b], 3), ∅, ∅, A?) → Attention(x, W, b, ∅, ∅, A?)."""

    def __init__(self, target: str | Target, name: str = FAMILY) -> None:
        super().__init__(name, target)
        self._parts: QKVWeights | None = None

    def pattern(self, op, query, key, value):
        return op.MultiHeadAttention(query, key, value, _allow_other_inputs=True, _allow_other_attributes=True, _domain=MS, _outputs=["attended"])

    def check(self, context, query, key, value, attended, **_) -> MatchResult:
        fail = MatchResult().fail
        refusal = unpacked_inputs_refusal(attended)
        if refusal is not None:
            return fail(refusal, attended)
        packed = _split_thirds(query, key, value)
        parts = _from_split(packed) if isinstance(packed, ir.Value) else packed if isinstance(packed, str) else self_attention_qkv(query, key, value)
        if isinstance(parts, str):
            return fail(parts, attended)
        self._parts = parts
        return self.choose(context, parts.x, [Lowering(MS, "Attention")])

    def rewrite(self, op, attended, **_):
        x, packed_w, packed_b = self._packed(op, attended)
        return self._emit_as(op, attended, x, packed_w, packed_b)

    def _packed(self, op, attended: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value]:
        """x and the matched [Wq | Wk | Wv] and [bq | bk | bv] as initializers named after Wq and the rule, stored once for
        the layers that share them (`stored_once`: ALBERT's)."""
        assert self._parts is not None
        x, weight, bias, name = self._parts
        node = attended.producer()
        assert node is not None
        return x, *(stored_once(op, node.graph, array, f"{name}_{self.name}_{part}", f"{node.name}_{self.name}_{part}")
                    for array, part in ((weight, "weight"), (bias, "bias")))

    def _emit_as(self, op, attended: ir.Value, *first: ir.Value) -> ir.Value:
        """The chosen lowering on `first` (its first three inputs), with the attention bias and the
        attributes of the MultiHeadAttention producing `attended`."""
        node = attended.producer()
        assert node is not None
        mask = node.inputs[5] if len(node.inputs) > 5 else None
        inputs = [*first] + ([None, None, mask] if mask is not None else [])
        return self.emit(op, *inputs, **{k: a.value for k, a in node.attributes.items()})


def rules(target: str | Target) -> list[pattern.RewriteRule]:
    """The packed-QKV rule for ONNX Runtime targets; none for tensorrt (FusedMHA has no packed form)."""
    if not get_target(target).emits(MS, "Attention", opset=0):
        return []
    return [PackedQKV.rule(target)]
