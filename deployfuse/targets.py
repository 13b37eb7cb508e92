"""Deployment targets: what `--target` names, as one typed value.

A `Target` carries everything that differs between runtimes: the ONNX Runtime execution
providers its artefacts run on, the profile of non-standard ops it has kernels for (in which
dtypes), and its lowering preferences (which op a rule emits when several would do, and which
activations a fused op takes there). Rules ask their target; nothing else compares target names.

Kernel facts: com.microsoft GroupNorm / BiasAdd have no CPU kernel, most CPU contrib kernels are
float32 only, GroupQueryAttention has no fp32 CUDA kernel, TensorRT parses no com.microsoft op.
`deployfuse` ops are always allowed from their minimum opset: their ONNX function bodies run
anywhere, and the custom-op library / TensorRT plugins back them natively. The kernel-registry
test checks the CPU table against ONNX Runtime's own registry (and the CUDA one where present).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from deployfuse.errors import UsageError
from deployfuse.ops.body import MIN_OPSET

MS = "com.microsoft"
DEPLOYFUSE = "deployfuse"
CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"

FLOATS = frozenset({"float", "float16", "bfloat16", "double"})
F32 = frozenset({"float"})
F32_F16 = frozenset({"float", "float16"})
F16 = frozenset({"float16", "bfloat16"})

# ONNX Runtime contrib ops that live in the ONNX domain without an ONNX schema, with the opset
# from which a standard op of that name replaces ORT's own (None: never). ORT registers its
# LayerNormalization there for opsets 1-16, before the standard one came in 17.
ORT_ONNX_DOMAIN_OPS: dict[str, int | None] = {"SimplifiedLayerNormalization": None, "LayerNormalization": 17}

# Standard ops rules emit, with the default-domain opset that introduced them.
STANDARD_OPSET = {"LayerNormalization": 17, "Gelu": 20, "RMSNormalization": 23, "Attention": 23, "RotaryEmbedding": 23}


def ort_private(op_type: str, opset: int) -> bool:
    """True when an ONNX-domain `op_type` node in a model of default-domain `opset` is one of
    ONNX Runtime's schema-less contrib ops (`ORT_ONNX_DOMAIN_OPS`), not a standard op."""
    if op_type not in ORT_ONNX_DOMAIN_OPS:
        return False
    until = ORT_ONNX_DOMAIN_OPS[op_type]
    return until is None or opset < until


@dataclass(frozen=True)
class Lowering:
    """One way to emit a fused node: `domain::op_type` with fixed attributes."""

    domain: str
    op_type: str
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Target:
    """One deployment target.

    Attributes:
        name: what `--target` takes ("ort-cpu", "ort-cuda", "tensorrt").
        providers: the ONNX Runtime execution providers its artefacts are verified and run on.
        kernels: (domain, op) -> dtypes with a kernel, for every non-standard op the target may
            receive ("" is ORT's contrib ops registered in the ONNX domain).
        lowerings: rule key -> the ops that rule may emit here, in order of preference (a rule
            whose key is absent does not run on this target).
        activations: fused-op rule key -> the activations it fuses here.
        runtime: "onnxruntime", or "tensorrt" (verified on ORT, timed and run by its engine).
    """

    name: str
    providers: tuple[str, ...]
    runtime: str = "onnxruntime"
    kernels: Mapping[tuple[str, str], frozenset[str]] = field(default_factory=dict)
    lowerings: Mapping[str, tuple[Lowering, ...]] = field(default_factory=dict)
    activations: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.name

    @property
    def cuda(self) -> bool:
        """True when the target runs on the GPU (CUDA provider options, CUDA graphs, TF32)."""
        return CUDA_PROVIDER in self.providers

    def emits(self, domain: str, op_type: str, opset: int, dtype: str = "float") -> bool:
        """True when a `domain::op_type` node on `dtype` data in a model of default-domain
        `opset` has a kernel on this target (opset 0: at some opset, for rules deciding whether
        to exist)."""
        if domain == DEPLOYFUSE:
            return opset == 0 or opset >= MIN_OPSET
        key = ("" if domain == "ai.onnx" else domain, op_type)
        if key[0] == "" and ort_private(op_type, opset):
            return dtype in self.kernels.get(key, ())
        if key[0] == "" and opset < STANDARD_OPSET.get(op_type, 1):
            return False
        if key in self.kernels:
            return dtype in self.kernels[key]
        return key[0] == ""

    def lowering(self, key: str) -> tuple[Lowering, ...]:
        """The ops rule `key` may emit here, preferred first; () when it does not run here."""
        return self.lowerings.get(key, ())


_ORT_SIMPLIFIED_LN = (Lowering("", "SimplifiedLayerNormalization"),)
_MHA = (Lowering(MS, "MultiHeadAttention"),)
_NORM_ACT = {"layernorm_gelu": (Lowering(DEPLOYFUSE, "LayerNormGelu"),), "groupnorm_act": (Lowering(DEPLOYFUSE, "GroupNormAct"),)}

ORT_CPU = Target(
    "ort-cpu", (CPU_PROVIDER,),
    kernels={
        (MS, "Gelu"): F32, (MS, "FastGelu"): F32, (MS, "QuickGelu"): F32, (MS, "BiasGelu"): F32,
        (MS, "FusedConv"): F32, (MS, "SkipLayerNormalization"): FLOATS,
        (MS, "SkipSimplifiedLayerNormalization"): FLOATS, ("", "SimplifiedLayerNormalization"): FLOATS,
        ("", "LayerNormalization"): FLOATS, ("", "Gelu"): F32, (MS, "MultiHeadAttention"): F32, (MS, "Attention"): F32,
        (MS, "GroupQueryAttention"): F32_F16, (MS, "RotaryEmbedding"): F32_F16,
    },
    lowerings={
        "gelu_erf": (Lowering("", "Gelu"), Lowering(MS, "Gelu")),
        "gelu_tanh": (Lowering("", "Gelu", {"approximate": "tanh"}), Lowering(MS, "FastGelu")),
        "rmsnorm": _ORT_SIMPLIFIED_LN,
        "attention": _MHA,
        "grouped_attention": (Lowering(MS, "GroupQueryAttention"),),  # the CUDA kernel is fp16/bf16 only
    },
    activations={"conv_act": ("Relu", "Sigmoid", "Tanh", "LeakyRelu")},  # com.microsoft FusedConv (CPU kernel only)
)

ORT_CUDA = Target(
    "ort-cuda", (CUDA_PROVIDER, CPU_PROVIDER),
    kernels={
        (MS, "Gelu"): FLOATS - {"double"}, (MS, "FastGelu"): FLOATS - {"double"}, (MS, "QuickGelu"): FLOATS - {"double"},
        (MS, "BiasGelu"): FLOATS - {"double"}, (MS, "FusedConv"): F32, (MS, "SkipLayerNormalization"): F32_F16,
        (MS, "SkipSimplifiedLayerNormalization"): F32_F16, ("", "SimplifiedLayerNormalization"): FLOATS,
        ("", "LayerNormalization"): FLOATS, (MS, "MultiHeadAttention"): F32_F16, (MS, "Attention"): F32_F16, (MS, "GroupQueryAttention"): F16,
        (MS, "RotaryEmbedding"): FLOATS - {"double"}, (MS, "EmbedLayerNormalization"): F32_F16,
    },
    lowerings={
        "gelu_erf": (Lowering(MS, "Gelu"),),
        "gelu_tanh": (Lowering(MS, "FastGelu"),),
        "rmsnorm": _ORT_SIMPLIFIED_LN,
        "attention": _MHA,
        "gemm_act": (Lowering(DEPLOYFUSE, "GemmAct"),),
        "fp8_gemm": (Lowering(DEPLOYFUSE, "Fp8GemmAct"),),  # float8 Q/DQ'd GEMMs (--precision fp8); tensorrt keeps the Q/DQ
        "fp8_norm": (Lowering(DEPLOYFUSE, "SkipLayerNormFp8"),),  # a norm quantizing its fp8 GEMMs' X (after fp8_gemm)
        "fp8_attention_out": (Lowering(DEPLOYFUSE, "FusedMHA"),),  # FusedMHA writing its fp8 output projection's X (after fp8_norm)
        "packed_mha": (Lowering(DEPLOYFUSE, "FusedMHA", {"packed_qkv": 1}),),  # MHA on a Split packed QKV (fp8's split_qkv, GPT-2)
        # a FusedMHA Mask broadcast over the query axis -> its row (the kernel's row path); one built per batch row from shapes -> one constant row
        "mask_broadcast": (Lowering(DEPLOYFUSE, "FusedMHA"),),
        "identity_gather": (Lowering("", "Unsqueeze"),),  # a GatherND at index grids (a dynamic export's padding mask) -> its data unsqueezed
        "causal_mask": (Lowering(DEPLOYFUSE, "FusedMHA"),),  # a constant causal FusedMHA Mask -> causal = 1 (the kernels skip the tiles above the diagonal)
        "patch_embed": (Lowering("", "MatMul"),),  # a patchify Conv as a GEMM (not faster on ORT CPU; TensorRT runs the Conv well)
        "embed_layer_norm": (Lowering(MS, "EmbedLayerNormalization"),),  # BERT's word + position (+ segment) lookups and their LayerNorm
        **_NORM_ACT,
    },
    # gemm_act, fp8_gemm: cuBLASLt's epilogues
    activations={"bias_act": ("relu", "silu", "sigmoid"), "gemm_act": ("relu", "gelu_tanh"), "fp8_gemm": ("relu", "gelu_tanh")},
)

TENSORRT = Target(
    "tensorrt", (CPU_PROVIDER,), "tensorrt",  # verified on ORT CPU; the engine is built by `deployfuse build`
    lowerings={
        "gelu_erf": (Lowering("", "Gelu"),),
        "gelu_tanh": (Lowering("", "Gelu", {"approximate": "tanh"}),),
        "rmsnorm": (Lowering("", "RMSNormalization"),),
        "attention": (Lowering(DEPLOYFUSE, "FusedMHA"),),
        "causal_mask": (Lowering(DEPLOYFUSE, "FusedMHA"),),
        **_NORM_ACT,
    },
    activations={"bias_act": ("relu", "silu", "sigmoid", "gelu", "gelu_tanh")},
)

BY_NAME: dict[str, Target] = {t.name: t for t in (ORT_CPU, ORT_CUDA, TENSORRT)}
TARGETS: tuple[str, ...] = tuple(BY_NAME)  # the names `--target` takes


def get_target(target: str | Target) -> Target:
    """`target` as a Target (a name is looked up); UsageError for an unknown name."""
    if isinstance(target, Target):
        return target
    try:
        return BY_NAME[target]
    except KeyError:
        raise UsageError(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}") from None
