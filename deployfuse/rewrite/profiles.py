"""Target profiles: which fused ops, in which dtypes, each deployment target may receive.

A rule asks its profile before it emits anything, so a target never gets an op without a kernel
there: com.microsoft GroupNorm / BiasAdd have no CPU kernel, most CPU contrib kernels are
float32 only, GroupQueryAttention has no fp32 CUDA kernel, TensorRT parses no com.microsoft op.
`deployfuse` ops are always allowed: their ONNX function bodies run anywhere, and the custom-op
library / TensorRT plugins back them natively. The kernel-registry test checks the CPU table
against ONNX Runtime's own registry (and the CUDA one where a CUDA build is present).
"""

from __future__ import annotations

from dataclasses import dataclass

from deployfuse.errors import UsageError

TARGETS: tuple[str, ...] = ("ort-cpu", "ort-cuda", "tensorrt")

MS = "com.microsoft"
DEPLOYFUSE = "deployfuse"
FLOATS = frozenset({"float", "float16", "bfloat16", "double"})
F32 = frozenset({"float"})
F32_F16 = frozenset({"float", "float16"})
F16 = frozenset({"float16", "bfloat16"})
DEPLOYFUSE_MIN_OPSET = 17  # the ops' function bodies use LayerNormalization-17 (deployfuse.ops.functions)

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
class Profile:
    """What one target can run.

    Attributes:
        target: the target name.
        kernels: (domain, op) -> dtypes with a kernel, for every non-standard op the target
            may receive ("" is ORT's contrib ops registered in the ONNX domain).
    """

    target: str
    kernels: dict[tuple[str, str], frozenset[str]]

    def emits(self, domain: str, op_type: str, opset: int, dtype: str = "float") -> bool:
        """True when a `domain::op_type` node on `dtype` data in a model of default-domain
        `opset` has a kernel on this target."""
        if domain == DEPLOYFUSE:  # opset 0: "at some opset", for rules deciding whether to exist
            return opset == 0 or opset >= DEPLOYFUSE_MIN_OPSET
        key = ("" if domain == "ai.onnx" else domain, op_type)
        if key[0] == "" and ort_private(op_type, opset):
            return dtype in self.kernels.get(key, ())
        if key[0] == "" and opset < STANDARD_OPSET.get(op_type, 1):
            return False
        if key in self.kernels:
            return dtype in self.kernels[key]
        return key[0] == ""


_ORT_CPU = {
    (MS, "Gelu"): F32, (MS, "FastGelu"): F32, (MS, "QuickGelu"): F32, (MS, "BiasGelu"): F32,
    (MS, "FusedConv"): F32, (MS, "SkipLayerNormalization"): FLOATS,
    (MS, "SkipSimplifiedLayerNormalization"): FLOATS, ("", "SimplifiedLayerNormalization"): FLOATS,
    ("", "LayerNormalization"): FLOATS, ("", "Gelu"): F32, (MS, "MultiHeadAttention"): F32, (MS, "Attention"): F32,
    (MS, "GroupQueryAttention"): F32_F16, (MS, "RotaryEmbedding"): F32_F16,
}
_ORT_CUDA = {
    (MS, "Gelu"): FLOATS - {"double"}, (MS, "FastGelu"): FLOATS - {"double"}, (MS, "QuickGelu"): FLOATS - {"double"},
    (MS, "BiasGelu"): FLOATS - {"double"}, (MS, "FusedConv"): F32, (MS, "SkipLayerNormalization"): F32_F16,
    (MS, "SkipSimplifiedLayerNormalization"): F32_F16, ("", "SimplifiedLayerNormalization"): FLOATS,
    ("", "LayerNormalization"): FLOATS, (MS, "MultiHeadAttention"): F32_F16, (MS, "Attention"): F32_F16, (MS, "GroupQueryAttention"): F16,
    (MS, "RotaryEmbedding"): FLOATS - {"double"},
}

PROFILES: dict[str, Profile] = {
    "ort-cpu": Profile("ort-cpu", _ORT_CPU),
    "ort-cuda": Profile("ort-cuda", _ORT_CUDA),
    "tensorrt": Profile("tensorrt", {}),
}


def profile(target: str) -> Profile:
    """The profile of `target`; UsageError for an unknown one."""
    try:
        return PROFILES[target]
    except KeyError:
        raise UsageError(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}") from None
