"""Self-attention with separate Q, K, V projections -> one packed GEMM and a Split, for a
MultiHeadAttention that `packed_qkv` did not take (it runs first; fp8 and int8 exports skip it).

    MHA(x·Wq + bq, x·Wk + bk, x·Wv + bv, attention_bias=A)
        = MHA(Split(x·[Wq | Wk | Wv] + [bq | bk | bv], [D, D, D], axis=-1), attention_bias=A)

x·[Wq | Wk | Wv] is [x·Wq | x·Wk | x·Wv] column block by block, so the Split gives back each
projection exactly. One GEMM reads and (in an fp8 export, as one deployfuse.Fp8GemmAct) quantizes
x once instead of three times. The projections are read and refused as `packed_qkv` reads them
(`_projection.self_attention_qkv`: one x, constant weights [Din, D] and biases [D], a zero block
for a missing bias, Whisper's query scale folded); the MultiHeadAttention keeps its attributes and
its attention bias. The Split takes its sizes as an input (opset 13 and later).
"""

from __future__ import annotations

import numpy as np
from onnxscript.rewriter import MatchResult, pattern

from deployfuse.rewrite.rules._common import Lowering, default_opset, stored_once
from deployfuse.rewrite.rules._projection import self_attention_qkv
from deployfuse.rewrite.rules.packed_qkv import PackedQKV, unpacked_inputs_refusal
from deployfuse.targets import MS, Target, get_target

FAMILY = "split_qkv"

_SPLIT_SIZES_INPUT_OPSET = 13


class SplitQKV(PackedQKV):
    """MultiHeadAttention(x·Wq [+ bq], x·Wk [+ bk], x·Wv [+ bv], ∅, ∅, A?) ->
    MultiHeadAttention(Split(x·W + b, [D, D, D]), ∅, ∅, A?): packed_qkv's match, another rewrite."""

    def __init__(self, target: str | Target) -> None:
        super().__init__(target, FAMILY)

    def check(self, context, query, key, value, attended, **_) -> MatchResult:
        fail = MatchResult().fail
        if default_opset(context) < _SPLIT_SIZES_INPUT_OPSET:
            return fail(f"opset {default_opset(context)} < {_SPLIT_SIZES_INPUT_OPSET}: Split takes no sizes input", attended)
        refusal = unpacked_inputs_refusal(attended)
        parts = refusal if refusal is not None else self_attention_qkv(query, key, value)
        if isinstance(parts, str):
            return fail(parts, attended)
        self._parts = parts
        return self.choose(context, parts.x, [Lowering(MS, "MultiHeadAttention")])

    def rewrite(self, op, attended, **_):
        assert self._parts is not None
        x, packed_w, packed_b = self._packed(op, attended)
        hidden = self._parts.weight.shape[1] // 3
        node = attended.producer()
        assert node is not None
        sizes = stored_once(op, node.graph, np.array([hidden] * 3, np.int64), f"{self._parts.name}_{self.name}_sizes", f"{node.name}_{self.name}_sizes")
        query, key, value = op.Split(op.Add(op.MatMul(x, packed_w), packed_b), sizes, axis=-1, _outputs=3)
        return self._emit_as(op, attended, query, key, value)


def rules(target: str | Target) -> list[pattern.RewriteRule]:
    """The split-QKV rule where the attention family emits MultiHeadAttention (ONNX Runtime
    targets); none for tensorrt (FusedMHA takes Q, K, V as they come)."""
    if not get_target(target).emits(MS, "MultiHeadAttention", opset=0):
        return []
    return [SplitQKV.rule(target)]
