"""MultiHeadAttention on K/V the model repeated per query group → com.microsoft.GroupQueryAttention.

    Kᵣ = repeat_kv(K) = Reshape(Expand(Unsqueeze(K, 2), [B, G, r, L, D]), [B, G·r, L, D])
    MHA(Q, merge(Kᵣ), merge(Vᵣ), bias) = GQA(Q, merge(K), merge(V), bias; kv_num_heads = G, causal = 0)

for K, V [B, G, L, D] and H = G·r query heads: query head h attends to K/V head ⌊h / r⌋,
which is what repeat_kv builds by copying. GQA reads the G heads directly, so the copies go.
`causal = 0` with the model's additive mask as `attention_bias` keeps the model's own masking,
whatever it is (causal, padding, packed sequences), so nothing about the mask is assumed; no
past is given, so `total_sequence_length` = L and `seqlens_k` = L - 1 for every batch entry,
computed in the graph from K's shape. Q and K must have the same length (GQA's prompt case).

ort-cpu only, and only where the installed ONNX Runtime's GroupQueryAttention has the `causal`
attribute and the `attention_bias` input (1.32): its CUDA kernel is fp16-only and its support
for both was not run here.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult, pattern

from deployfuse.rewrite.rules._attention_shapes import DimOf, rank, same_dim, static_dim, static_ints
from deployfuse.rewrite.rules._common import FusionRule
from deployfuse.rewrite.rules.attention import merged_heads
from deployfuse.targets import MS, Target, get_target

FAMILY = "grouped_attention"


@functools.cache
def ort_runs_bidirectional_gqa() -> bool:
    """True when onnxruntime's GroupQueryAttention schema has `causal` and `attention_bias`."""
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    for schema in C.get_all_operator_schema():
        if schema.name == "GroupQueryAttention" and schema.domain == MS:
            return "causal" in schema.attributes and "attention_bias" in [i.name for i in schema.inputs]
    return False


def _repeated(merged: ir.Value) -> tuple[ir.Value, int] | str:
    """(K [B, G, L, D], r) when `merged` = Reshape(Transpose(repeat_kv(K), [0,2,1,3]), [B, L, G·r·D]); else why not."""
    node = merged.producer()
    if node is None or node.op_type != "Reshape":
        return "K/V is not a merge of heads"
    transpose = node.inputs[0].producer()
    if transpose is None or transpose.op_type != "Transpose" or list(transpose.attributes.get_ints("perm", [])) != [0, 2, 1, 3]:
        return "K/V is not a merge of transposed heads"
    flat = transpose.inputs[0].producer()  # [B, G·r, L, D]
    expand = flat.inputs[0].producer() if flat is not None and flat.op_type == "Reshape" else None
    unsqueeze = expand.inputs[0].producer() if expand is not None and expand.op_type == "Expand" else None
    if unsqueeze is None or unsqueeze.op_type != "Unsqueeze" or static_ints(unsqueeze.inputs[1]) != [2]:
        return "K/V heads are not repeated by Unsqueeze(2) → Expand → Reshape"
    kv, expanded, repeated = unsqueeze.inputs[0], expand.outputs[0], flat.outputs[0]
    if rank(kv) != 4 or rank(expanded) != 5 or rank(repeated) != 4:
        return "repeat_kv ranks are not 4 → 5 → 4"
    groups, reps, head_dim = static_dim(kv, 1), static_dim(expanded, 2), static_dim(kv, 3)
    if None in (groups, reps, head_dim):
        return "K/V groups, repeats or head size are not static"
    kept = [(DimOf(expanded, 0), DimOf(kv, 0)), (DimOf(expanded, 1), groups), (DimOf(expanded, 3), DimOf(kv, 2)), (DimOf(expanded, 4), head_dim),
            (DimOf(repeated, 0), DimOf(kv, 0)), (DimOf(repeated, 1), groups * reps), (DimOf(repeated, 2), DimOf(kv, 2)), (DimOf(repeated, 3), head_dim)]
    if not all(same_dim(a, b) for a, b in kept):
        return "the repeat is not [B, G, L, D] → [B, G, r, L, D] → [B, G·r, L, D]"
    return kv, reps


class GroupedAttention(FusionRule):
    """MultiHeadAttention(Q, merge(repeat_kv(K)), merge(repeat_kv(V)), '', '', [bias])."""

    def __init__(self, target: str | Target) -> None:
        super().__init__("grouped_attention", target)

    def pattern(self, op, query, key, value):
        return op.MultiHeadAttention(query, key, value, _domain=MS, _allow_other_inputs=True, _allow_other_attributes=True, _outputs=["out"])

    def check(self, context, query, key, value, out, **_) -> MatchResult:
        result = MatchResult()
        node = out.producer()
        extra = list(node.inputs[3:])
        if any(v is not None for v in extra[:2]) or len(extra) > 3 or len(node.outputs) != 1:
            return result.fail("MultiHeadAttention has a QKV bias, key padding mask, past state or present outputs", out)
        heads = node.attributes.get_int("num_heads", 0)
        k_part, v_part = _repeated(key), _repeated(value)
        if isinstance(k_part, str) or isinstance(v_part, str):
            return result.fail(k_part if isinstance(k_part, str) else v_part, out)
        (k, reps), (v, v_reps) = k_part, v_part
        groups = static_dim(k, 1)
        if reps != v_reps or static_dim(v, 1) != groups or groups * reps != heads:
            return result.fail("K and V are not the same G groups of H / G heads", out)
        if not same_dim(DimOf(query, 1), DimOf(k, 2)):
            return result.fail("queries and keys differ in length (GQA without a past needs them equal)", out)
        if not ort_runs_bidirectional_gqa():
            return result.fail("this onnxruntime's GroupQueryAttention has no causal=0 / attention_bias (needs 1.32)", out)
        self.parts = (k, v, groups, heads, node.attributes.get_float("scale", 0.0), extra[2] if len(extra) == 3 else None)
        return self.choose(context, query, self.target.lowering("grouped_attention"))

    def rewrite(self, op, query, out, **_):
        k, v, groups, heads, scale, bias = self.parts
        key, value = merged_heads(op, k, groups, static_dim(k, 3)), merged_heads(op, v, groups, static_dim(v, 3))
        shape = op.Shape(key)
        total = op.Cast(op.Gather(shape, op.Constant(value=ir.tensor(np.array(1, dtype=np.int64))), axis=0), to=ir.DataType.INT32)
        one = op.Constant(value=ir.tensor(np.array(1, dtype=np.int32)))
        seqlens = op.Expand(op.Sub(total, one), op.Shape(key, start=0, end=1))
        fused = self.emit(op, query, key, value, None, None, seqlens, total, None, None, None, bias,
                          num_heads=heads, kv_num_heads=groups, scale=scale, causal=0)
        fused.dtype, fused.shape = out.dtype, out.shape
        return fused


def rules(target: str | Target) -> list[pattern.RewriteRule]:
    """The grouped-query rule for ort-cpu; none elsewhere (see the module docstring)."""
    return [GroupedAttention.rule(target)] if get_target(target).lowering("grouped_attention") else []
