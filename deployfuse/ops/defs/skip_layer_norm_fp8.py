"""SkipLayerNormFp8: a (skip) LayerNorm that also writes its output quantized to float8 for the fp8 GEMMs it feeds.

    Sum = X [+ Skip] + Bias                              (with Ids: X[Ids] [+ Skip] + Bias, X then a [V, H] table)
    Y   = LayerNorm(Sum) · Gamma + Beta                   (statistics over the last axis, as com.microsoft.SkipLayerNormalization)
    YQ  = q(Y, YScale) = saturate_e4m3(round_nearest_even(Y / YScale))   (Y as rounded to T: the quantize pass it replaces)

In an fp8 export the X of the QKV GEMM and of the MLP comes out of a (Skip)LayerNormalization, and each
deployfuse.Fp8GemmAct / Fp8Mlp then runs its own quantize pass over it (one kernel and one fp16 read of
[tokens, hidden] each). Here the norm's kernel writes the float8 copy while the row is in registers; the GEMMs
take it as a float8 X (`rules.fp8_norm`). Y stays for the residual, Sum is the residual GPT-2's pre-LN blocks
carry (SkipLayerNormalization's input_skip_bias_sum); the node may omit either.

GPT-2's embeddings (Gather(wte, ids) + Gather(wpe, positions) -> the first norm) are two more kernels and a [B, S, H]
round trip; with Ids the norm does the lookups (`rules.fp8_embed`): row r of the sum reads X[Ids[r]] (the output is
Ids.shape + [H]), Skip the folded position rows [S, H] broadcast over the leading axes (row r reads Skip[r % rows(Skip)],
Skip's shape, leading 1s dropped, a suffix of the output's). An id i < 0 reads row i + V (Gather's rule); one still
outside [0, V) is clamped into it (reads row 0 or V - 1: never out of bounds, where Gather would fail).

Inputs in this order so that the optional inputs are last: Beta and Bias are required (the rule writes zeros
where the norm had none: a [hidden] read), Skip optional (LayerNormalization), Ids optional (int64). The math is float32 (the sum, the
statistics, the affine), Y and Sum rounded to T once, YQ from Y in T. The tensorrt target never receives it
(no TensorRT plugin): it keeps standard Q/DQ pairs, which TensorRT fuses into its own norms and fp8 GEMMs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

import onnx
import onnxscript
import torch
import torch.nn.functional as F
from onnx import helper
from onnxscript.onnx_types import FLOAT, INT64

from deployfuse.ops.body import Body
from deployfuse.ops.defs._onnxscript import DF, TFloat
from deployfuse.ops.defs.fp8_gemm_act import quantize_e4m3
from deployfuse.ops.schema import E4M3_MAX, Attr, OpSpec, RandFn, case_flags, to_element_type


def table_rows(ids: torch.Tensor, rows: int) -> torch.Tensor:
    """The table rows Ids read: i + rows for i < 0 (Gather's rule), then clamped into [0, rows)."""
    ids = ids.long()
    return torch.where(ids < 0, ids + rows, ids).clamp(0, rows - 1)


def reference_outputs(
    x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, bias: torch.Tensor, y_scale: torch.Tensor, skip: torch.Tensor | None = None,
    ids: torch.Tensor | None = None, *, epsilon: float, out_dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(Y, YQ, Sum): Y and Sum in `out_dtype` (X's by default), YQ as float8e4m3fn (torch.float8_e4m3fn) quantized
    from Y in that type. Inputs in any float dtype (Ids any integer or integral float dtype); the math in float32
    (float64 when X is); Skip broadcast against the rows."""
    wide = torch.float64 if x.dtype == torch.float64 else torch.float32
    out_dtype = out_dtype or x.dtype
    if ids is not None:
        x = x[table_rows(ids, x.shape[0])]
    total = x.to(wide) + bias.to(wide) + (0 if skip is None else skip.to(wide))
    y = F.layer_norm(total, total.shape[-1:], gamma.to(wide), beta.to(wide), epsilon).to(out_dtype)
    yq = quantize_e4m3(y, y_scale).to(torch.float8_e4m3fn)
    return y, yq, total.to(out_dtype)


def reference(
    x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, bias: torch.Tensor, y_scale: torch.Tensor, skip: torch.Tensor | None = None,
    ids: torch.Tensor | None = None, *, epsilon: float
) -> torch.Tensor:
    """Y (the op's first output; `reference_outputs` gives all three)."""
    return reference_outputs(x, gamma, beta, bias, y_scale, skip, ids, epsilon=epsilon)[0]


def body(b: Body, variant: dict[str, Any]) -> str:
    """Float32 throughout, as the reference: Y from LayerNormalization over the float32 sum; YQ by Cast(saturate=1)
    (Fp8GemmAct's quantizer, which ONNX Runtime runs in every float type). Writes YQ and Sum itself; returns Y. Ids:
    Gather of the table by the ids made non-negative and clamped (`table_rows`)."""
    x = "X"
    if variant.get("Ids"):
        zero, rows = b.op("Constant", value_int=0), b.op("Squeeze", b.op("Shape", "X", start=0, end=1), b.ints(0))
        wrapped = b.op("Where", b.op("Less", "Ids", zero), b.op("Add", "Ids", rows), "Ids")
        last = b.op("Sub", rows, b.op("Constant", value_int=1))
        x = b.op("Gather", "X", b.op("Max", b.op("Min", wrapped, last), zero), axis=0)
    total = b.op("Add", b.to_float(x), b.to_float("Bias"))
    if variant.get("Skip"):
        total = b.op("Add", total, b.to_float("Skip"))
    normed = b.op("LayerNormalization", total, b.to_float("Gamma"), b.to_float("Beta"), axis=-1, refs={"epsilon": "float"})
    y = b.op("CastLike", normed, "X")
    yq = b.op("Cast", b.op("Div", b.to_float(y), "YScale"), to=onnx.TensorProto.FLOAT8E4M3FN, saturate=1)
    b.nodes.append(helper.make_node("Identity", [yq], ["YQ"]))
    b.nodes.append(helper.make_node("Identity", [b.op("CastLike", total, "X")], ["Sum"]))
    return y


EXAMPLE_VOCAB = 11
"""The table rows of the example with Ids."""


def example_inputs(shape: Sequence[int], rand: RandFn, attrs: dict[str, Any]) -> list[Any]:
    """Outputs of `shape`; attrs["mask"] (the cases' flag for the optional inputs) names those given: True or "skip" a
    Skip of `shape`, "ids" Ids of shape[:-1] into an [EXAMPLE_VOCAB, H] table X (a Skip then of shape[1:], broadcast over the
    first axis), "skip,ids" both. Gamma, Beta, Bias over the last axis; YScale = 0.8·amax(Y)/448 for Gamma ~ 1 ± 1 (|Y| up to
    ~4·|Gamma|), so the largest |Y| saturate. The ids lie in [-V, V) (the negative ones read from the end), the first three
    -V - 3 and V (clamped) and -1 where there are that many."""
    given = {"skip"} if attrs.get("mask") is True else case_flags(attrs)
    hidden, vocab = shape[-1], EXAMPLE_VOCAB if "ids" in given else 0
    gamma = rand(hidden, shift=1.0)
    y_scale = to_element_type(abs(gamma).max() * (4.0 * 0.8 / E4M3_MAX), "float")
    skip = (rand(*shape[1:]) if vocab else rand(*shape)) if "skip" in given else None
    x = rand(*((vocab, hidden) if vocab else shape), scale=2.0, shift=0.5)
    ids = None
    if vocab:
        ids = to_element_type(rand(*shape[:-1], scale=float(vocab)), "int64") % (2 * vocab) - vocab
        flat = ids.reshape(-1)
        for k, value in enumerate((-vocab - 3, vocab, -1)[: flat.shape[0]]):
            flat[k] = value
    return [x, gamma, rand(hidden), rand(hidden), y_scale, skip, ids]


SPEC = OpSpec(
    name="SkipLayerNormFp8",
    inputs=("X", "Gamma", "Beta", "Bias", "YScale", "Skip", "Ids"),
    optional=("Skip", "Ids"),
    outputs=("Y", "YQ", "Sum"),
    attrs={"epsilon": Attr("float", 1e-5)},
    doc="Sum = X [+ Skip] + Bias (with Ids: X[Ids], X a [V, H] table, ids < 0 from the end, then clamped into [0, V); "
    "Skip broadcast over the leading axes), Y = LayerNorm(Sum) * Gamma + Beta over the last axis (com.microsoft.SkipLayerNormalization), "
    "YQ = saturate_e4m3(round_nearest_even(Y / YScale)) (float8e4m3fn, from Y in T: QuantizeLinear with a float8 zero point); "
    "X, Skip, Gamma, Beta, Bias, Y and Sum in T, YScale a float32 scalar; computed in float32. Any output may be omitted. "
    "Needs opset 19 (float8 types, Cast's saturate). No TensorRT plugin: the tensorrt target keeps standard Q/DQ pairs.",
    reference_fn=reference,
    body_fn=body,
    example_fn=example_inputs,
    input_types={"YScale": "float", "Ids": "int64"},
    trt_plugin=False,
    min_opset=19,
)


@torch.library.custom_op("deployfuse::skip_layer_norm_fp8", mutates_args=())
def torch_op(
    x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, bias: torch.Tensor, y_scale: torch.Tensor, skip: torch.Tensor | None = None,
    ids: torch.Tensor | None = None, epsilon: float = 1e-5
) -> torch.Tensor:
    """Y = LayerNorm(x[ids] [+ skip] + bias) * gamma + beta over the last axis (the node's YQ and Sum: `reference_outputs`)."""
    return SPEC.reference(x, gamma, beta, bias, y_scale, skip, ids, epsilon=epsilon)


@torch_op.register_fake
def _(x, gamma, beta, bias, y_scale, skip=None, ids=None, epsilon=1e-5):
    return x.new_empty((*ids.shape, x.shape[-1])) if ids is not None else torch.empty_like(x)


@onnxscript.script(opset=DF)
def skip_layer_norm_fp8_onnx(
    x: TFloat,
    gamma: TFloat,
    beta: TFloat,
    bias: TFloat,
    y_scale: FLOAT,
    skip: Optional[TFloat] = None,  # noqa: UP045 (onnxscript reads the annotation)
    ids: Optional[INT64] = None,  # noqa: UP045
    epsilon: float = 1e-5,
) -> TFloat:
    return DF.SkipLayerNormFp8(x, gamma, beta, bias, y_scale, skip, ids, epsilon=epsilon)


to_onnx = skip_layer_norm_fp8_onnx  # the exporter inlines it by name: one name per op
