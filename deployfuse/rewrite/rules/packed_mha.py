"""MultiHeadAttention on the three thirds of one packed QKV tensor -> deployfuse.FusedMHA reading
them in place (packed_qkv=1), so the Split's three copies disappear.

    MHA(Split(P, [D, D, D], axis=-1), ∅, ∅, A?) = FusedMHA(P, P, P, A?, packed_qkv=1)

P is [B, S, 3D] laid out [Q | K | V]: split_qkv's packed GEMM (an fp8 ort-cuda export, where
packed_qkv is skipped so the Q/DQ reach that GEMM) or a model's own packed projection (GPT-2's
Conv1D). FusedMHA reads Q, K and V with a row stride of 3D at offsets 0, D and 2D (its
`packed_qkv` form); ONNX Runtime's MultiHeadAttention takes a packed QKV only on CUDA, and the
artefacts must run on every runtime. num_heads and scale carry over (MultiHeadAttention's default
scale 1/sqrt(head_dim) is FusedMHA's scale 0); the attention bias A, [B|1, H|1, S, L], is
FusedMHA's additive Mask as it is. Q, K, V must be outputs 0, 1, 2 of one Split into equal thirds
of the last axis, each read only by the MultiHeadAttention (`packed_qkv._split_thirds`); a packed
bias, key padding mask, past or other attribute is refused. Runs right after split_qkv, on
ort-cuda only (tensorrt's FusedMHA plugin refuses the packed form; the non-quantized ort-cuda
export has no such Split left: packed_qkv turned those attentions into com.microsoft.Attention).
"""

from __future__ import annotations

from onnxscript.rewriter import MatchResult, pattern

from deployfuse.rewrite.rules._attention_shapes import rank
from deployfuse.rewrite.rules._common import FusionRule
from deployfuse.rewrite.rules.packed_qkv import _split_thirds, unpacked_inputs_refusal
from deployfuse.targets import MS, Target, get_target

FAMILY = "packed_mha"


class PackedMHA(FusionRule):
    """MultiHeadAttention(Split(P, 3)[0..2], ∅, ∅, A?) -> FusedMHA(P, P, P, A?, packed_qkv=1)."""

    def __init__(self, target: str | Target) -> None:
        super().__init__(FAMILY, target)

    def pattern(self, op, query, key, value):
        return op.MultiHeadAttention(query, key, value, _allow_other_inputs=True, _allow_other_attributes=True, _domain=MS, _outputs=["attended"])

    def check(self, context, query, key, value, attended, **_) -> MatchResult:
        fail = MatchResult().fail
        refusal = unpacked_inputs_refusal(attended)
        packed = refusal if refusal is not None else _split_thirds(query, key, value)
        if packed is None:
            return fail("Q is not cut from a packed tensor by a Split", attended)
        if isinstance(packed, str):
            return fail(packed, attended)
        if rank(packed) not in (3, None):  # None: a value a rule just made (split_qkv's); a MultiHeadAttention given K and V has a 3-D Q
            return fail("the packed tensor is not [B, S, 3D]", attended)
        return self.choose(context, attended, self.target.lowering(FAMILY))  # attended: typed even where P is new

    def rewrite(self, op, query, attended, **_):
        split, mha = query.producer(), attended.producer()
        assert split is not None and mha is not None
        packed = split.inputs[0]
        mask = mha.inputs[5] if len(mha.inputs) > 5 else None
        attrs = {k: a.value for k, a in mha.attributes.items()}
        return self.emit(op, packed, packed, packed, *([mask] if mask is not None else []), **attrs)


def rules(target: str | Target) -> list[pattern.RewriteRule]:
    """The packed-MHA rule where the target lowers it (ort-cuda); none elsewhere."""
    if not get_target(target).lowering(FAMILY):
        return []
    return [PackedMHA.rule(target)]
