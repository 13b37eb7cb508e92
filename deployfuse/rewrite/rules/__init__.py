"""The ONE ordered registration list of fusion-rule families.

Families run in this order; each module exposes `FAMILY: str` and
`rules(target) -> list[RewriteRule]` (empty when it has nothing for that target). The order
matters: BatchNorm folds first (Conv + activation rules then see the folded Conv), norms and GELU are recognised first so that attention, skip-norm, bias+activation and
norm+activation rules can match the fused forms; rotary runs right before attention (its 3-D
outputs let Q and K feed the fused node without a re-merge); gemm_act (ort-cuda) runs after the
attention and skip-norm families have taken their projections and biases, and before bias_gelu and
bias_act, whose epilogues it leaves alone when cuBLASLt cannot compute them; bias_gelu runs before
bias_act so ONNX Runtime gets its own BiasGelu kernel and bias_act keeps the remaining epilogues.
split_qkv (Q, K, V as one GEMM and a Split) runs right after packed_qkv, so it only takes the
self-attentions packed_qkv leaves: all of them where an export skips packed_qkv (fp8 on ort-cuda,
whose Q/DQ must reach the QKV GEMM; int8 on ort-cpu skips both). packed_mha, right after it, lets
deployfuse.FusedMHA read Q, K, V out of that Split's input in place (ort-cuda); mask_broadcast,
right after it (it only rewrites FusedMHA nodes), hands them the padding row their Mask was
broadcast from over the query axis, or as a constant the one batch row of a Mask built at the batch
size from shapes only (GPT-2's causal mask with a dynamic batch); identity_gather, right after it, turns
the GatherND a dynamic export's padding mask reads its [B, S] input with (at index grids) into an Unsqueeze; causal_mask, then, turns a FusedMHA Mask that
is then a constant causal mask into the kernel's `causal` attribute. patch_embed (a ViT's patchify Conv as a MatMul + Add) runs
before gemm_act, bias_gelu and bias_act, so its new MatMul + Add can take their epilogues, and an
fp8 export (which skips those) quantizes it. embed_layer_norm (BERT's embedding lookups and their
LayerNorm as one EmbedLayerNormalization, ort-cuda) runs right after layernorm writes that norm and
before skip_layernorm would take its last Add; an export applies it only with --cuda-graph (`CUDA_GRAPH_ONLY`).

`fp8_gemm` (float8 Q/DQ'd GEMMs -> deployfuse.Fp8GemmAct) is no family here: the guard's
element-wise comparison cannot judge rewrites of a quantized graph, so the fp8 quantizer applies
it after these families have run on the float graph, and the accuracy gate judges it
(`fp8_gemm.lower`, `quantize.lowering`).
"""

from __future__ import annotations

import importlib
from types import ModuleType

FAMILY_MODULES: tuple[str, ...] = (
    "batchnorm_fold",
    "layernorm",
    "embed_layer_norm",
    "gelu",
    "rmsnorm",
    "rotary",
    "attention",
    "grouped_attention",
    "packed_qkv",
    "split_qkv",
    "packed_mha",
    "mask_broadcast",
    "identity_gather",
    "causal_mask",
    "skip_layernorm",
    "patch_embed",
    "gemm_act",
    "bias_gelu",
    "bias_act",
    "norm_act",
    "fused_conv",
)

# Families an export applies only with --cuda-graph: ONNX Runtime's EmbedLayerNormalization (1.31) copies an id-range flag
# back to the host and synchronises the stream on every call it does not capture. Measured on the H200 without a CUDA graph,
# BERT-base fp8 batch 8 went from 1.12 to 1.80 ms a call (bench/results/h200_quant.md sections 5 to 6); inside a graph the
# one kernel replaces two lookups, two Adds and a norm (0.088 -> 0.028 ms at batch 64).
CUDA_GRAPH_ONLY: tuple[str, ...] = ("embed_layer_norm",)


def families() -> list[ModuleType]:
    """The rule-family modules, in run order."""
    return [importlib.import_module(f"{__name__}.{name}") for name in FAMILY_MODULES]
