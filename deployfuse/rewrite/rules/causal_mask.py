"""A FusedMHA Mask that is a constant causal mask -> no Mask and `causal = 1`, so the kernels skip the key tiles
above the diagonal instead of adding a large negative number to them.

    FusedMHA(Q, K, V, M) = FusedMHA(Q, K, V; causal = 1)   when M[..., i, j] = 0 for j <= i and <= -1e4 for j > i

A decoder's export carries its causal mask as data: with static shapes (or after mask_broadcast's batch-row rule, for
GPT-2 with a dynamic batch) it is a constant [1, 1, S, S] of 0 on and below the diagonal and the dtype's minimum
(or -inf) above. FusedMHA adds the Mask before its softmax, so every query row still scores every key; with
`causal = 1` the Hopper and tensor-core kernels stop each query block at its diagonal (about half the key tiles at
long sequences; none at S = 128 on Hopper, whose key tile is 128 wide) and read no Mask: GPT-2's attention at batch 64
went from 0.396 to 0.373 ms on the H200 (bench/results/h200_quant.md section 7).

The math is the same wherever the masked scores vanish: a masked key's weight exp(s + M - max) is exactly 0 in
float32 once s + M - max < -104. The key on the diagonal is never masked, so `max` is at least its score, and a mask
value <= -1e4 (HF's old masking value; today's is -65504 in fp16, -3.4e38 in fp32) vanishes whenever a row's
scores span less than about 9,900. Any other value, a non-zero on or below the diagonal, a Mask that is not a
constant, or FusedMHA with its YQ output already (fp8_attention_out runs later) leaves the node as it is. So does a
Mask of one row or one column that broadcasts over the queries or keys ([1, S_k]: every query sees key 0 alone; [1, 1]
of 0: no mask at all), unless Q's and K's static sequence lengths are that 1.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult, pattern

from deployfuse.rewrite.rules._common import FusionRule
from deployfuse.targets import DEPLOYFUSE, Target, get_target

FAMILY = "causal_mask"

MASKED = -1e4
"""A Mask value at or below this counts as masked (see the module: it vanishes in the softmax)."""


def is_causal(mask: np.ndarray) -> bool:
    """True when every [..., S_q, S_k] slice of `mask` is 0 for key j <= query i and <= MASKED for j > i."""
    if mask.ndim < 2 or not np.issubdtype(mask.dtype, np.floating):
        return False
    values = mask.astype(np.float32)
    above = np.triu(np.ones(mask.shape[-2:], bool), k=1)
    return bool(np.all(values[..., ~above] == 0) and np.all(values[..., above] <= MASKED))


def _sequence(value: ir.Value) -> int | None:
    """The static sequence length of a FusedMHA input [B, S, ...], else None."""
    dim = None if value.shape is None or len(value.shape) < 2 else value.shape[1]
    return dim if isinstance(dim, int) else None


class CausalMask(FusionRule):
    """FusedMHA(Q, K, V, M, ...) -> FusedMHA(Q, K, V, "", ...; causal = 1) when M is a constant causal mask."""

    def __init__(self, target: str | Target) -> None:
        super().__init__(FAMILY, target)

    def pattern(self, op, query, key, value, mask):
        return op.FusedMHA(query, key, value, mask, _allow_other_inputs=True, _allow_other_attributes=True, _domain=DEPLOYFUSE, _outputs=["attended"])

    def check(self, context, query, key, mask, attended, **_) -> MatchResult:
        fail = MatchResult().fail
        const = None if mask is None else ir.convenience.get_const_tensor(mask)
        if const is None:
            return fail("no Mask, or a Mask that is not a constant", attended)
        values = np.asarray(const.numpy())
        if not is_causal(values):
            return fail(f"the constant Mask is not 0 on and below the diagonal and <= {MASKED:g} above it", mask)
        rows, cols = values.shape[-2:]
        if 1 in (rows, cols) and (rows, cols) != (_sequence(query), _sequence(key)):
            return fail(f"the constant Mask's [{rows}, {cols}] broadcasts over the queries or keys", mask)
        return self.choose(context, attended, self.target.lowering(FAMILY))

    def rewrite(self, op, attended, **_):
        node = attended.producer()
        assert node is not None
        inputs: list[ir.Value | None] = list(node.inputs)
        inputs[3] = None
        while inputs and inputs[-1] is None:
            inputs.pop()
        attrs = {k: a.value for k, a in node.attributes.items()} | {"causal": 1}
        return self.emit(op, *inputs, **attrs)


def rules(target: str | Target) -> list[pattern.RewriteRule]:
    """The rule where the target's FusedMHA takes `causal` (ort-cuda, tensorrt); none elsewhere."""
    if not get_target(target).lowering(FAMILY):
        return []
    return [CausalMask.rule(target)]
