"""The ONE ordered registration list of fusion-rule families.

Families run in this order; each module exposes `FAMILY: str` and
`rules(target) -> list[RewriteRule]` (empty when it has nothing for that target). The order
matters: BatchNorm folds first (Conv + activation rules then see the folded Conv), norms and GELU are recognised first so that attention, skip-norm, bias+activation and
norm+activation rules can match the fused forms; fp8_gemm (ort-cuda, a float8 Q/DQ graph) runs
right after gelu (tanh GELU is FastGelu by then, an epilogue it takes) and before attention,
skip_layernorm and bias_gelu: each Q/DQ'd GEMM becomes an Fp8GemmAct with its bias in the epilogue,
whose output MultiHeadAttention takes as Q, K or V and SkipLayerNormalization as a residual sum's
term, as they take a MatMul + Add (checked on tiny BERT, GPT-2 and ViT); rotary runs right before attention (its 3-D
outputs let Q and K feed the fused node without a re-merge); gemm_act (ort-cuda) runs after the
attention and skip-norm families have taken their projections and biases, and before bias_gelu and
bias_act, whose epilogues it leaves alone when cuBLASLt cannot compute them; bias_gelu runs before
bias_act so ONNX Runtime gets its own BiasGelu kernel and bias_act keeps the remaining epilogues.
"""

from __future__ import annotations

import importlib
from types import ModuleType

FAMILY_MODULES: tuple[str, ...] = (
    "batchnorm_fold",
    "layernorm",
    "gelu",
    "fp8_gemm",
    "rmsnorm",
    "rotary",
    "attention",
    "grouped_attention",
    "packed_qkv",
    "skip_layernorm",
    "gemm_act",
    "bias_gelu",
    "bias_act",
    "norm_act",
    "fused_conv",
)


def families() -> list[ModuleType]:
    """The rule-family modules, in run order."""
    return [importlib.import_module(f"{__name__}.{name}") for name in FAMILY_MODULES]
