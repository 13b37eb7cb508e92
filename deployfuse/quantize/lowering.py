"""Which quantizer a precision and target get, the export options they take, and the gate around them.

`int8` on ort-cpu goes through ONNX Runtime's dynamic quantizer by default (`ort_int8`: its int8
CPU kernels); static int8 there, and `int8` and `fp8` on tensorrt and ort-cuda, get standard
QuantizeLinear/DequantizeLinear pairs (`qdq.place_qdq`), which ORT's CPU optimizer folds into
its int8 kernels and TensorRT into its int8/fp8 GEMMs. fp8 has no CPU kernel, so
ort-cpu refuses it. Either way the accuracy gate (`gate.run_gate`) decides which layers stay in float.
In every mode a tied LM head (GPT-2's: its largest GEMM) is quantizable: its weight, a Transpose of
the embedding table at run time, is stored transposed first (`qdq.untransposed_weights`), and read
through the Transpose again if the gate keeps the head in float (one float copy of the table).

fp8 on ort-cuda is exported in fp16 (`float_precision`) and fused, Q/DQ'd, and every float8
Q/DQ'd GEMM becomes a deployfuse.Fp8GemmAct node (`rewrite.rules.fp8_gemm.lower`, in each of the
gate's attempts, so the gate judges the artefact itself): an fp16 graph around cuBLASLt fp8 GEMMs,
the artefact to hold against the fp16 one. Layers the gate leaves out stay fp16 (GemmAct where
`rules.gemm_act` takes them, `fp8_gemm.float_gemms`). The fusions run first, on the float graph,
because their guard cannot judge a quantized one (fp8 roundings flip on any upstream change:
BERT-base's Q/DQ graph failed it in every family); less `FP8_SKIPPED_FAMILIES`, which would take
the GEMMs out of the quantizer's reach (packed QKV, GemmAct) or their bias out of the fp8 GEMM's
epilogue (BiasGelu, BiasAct). With packed QKV skipped, `split_qkv` packs each self-attention's Q,
K and V into one GEMM and a Split instead: one Fp8GemmAct quantizes x once for the three
(BERT-base's 12 layers: 48 GEMMs, not 72).

Where the quantization runs (`before_fusion`): int8 on ort-cuda, on the unfused graph, and deployfuse's
fusions then run on the Q/DQ graph. After the fusions the Q/K/V projections sit inside a packed
com.microsoft Attention node that no Q/DQ can reach (a tiny BERT: 7 of its 13 GEMMs quantizable
instead of 13), while on the Q/DQ graph MultiHeadAttention, SkipLayerNormalization and
BiasGelu/FastGelu still fuse. On tensorrt every GEMM stays a MatMul after the fusions, so the
Q/DQ go on the fused graph; on ort-cpu, fused with QKV left unpacked (`ort_int8.SKIPPED_FAMILIES`),
every GEMM quantizes after the fusions too, and dynamic int8's MatMulInteger chains would leave the
attention fusion no pattern (`ort_int8`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import onnx
import torch

from deployfuse.errors import UsageError
from deployfuse.quantize import fp8_switchboard, ort_int8
from deployfuse.quantize.calibration import Calibration
from deployfuse.quantize.gate import Budget, GateResult, Switchboard, budget_of, layer_costs, run_gate
from deployfuse.quantize.qdq import MIN_OPSET, PRECISIONS as QUANTIZED, place_qdq, quantizable_nodes, retransposed_weights, untransposed_weights
from deployfuse.quantize.rounding import rounded_weights
from deployfuse.rewrite.rules import fp8_gemm
from deployfuse.targets import ORT_CPU, ORT_CUDA, Target


@dataclass(frozen=True)
class QuantizeOptions:
    """What `deployfuse export` was asked about quantization, checked."""

    precision: str
    mode: str  # ort-cpu int8: "dynamic", "dynamic-7bit" or "static" (ort_int8.MODES); "qdq" elsewhere
    budget: Budget
    calibration_data: str | None = None
    float_precision: str = "fp32"  # what the model is exported in, and what the layers the gate leaves unquantized stay in
    fp8_gemms: bool = False  # the Q/DQ'd GEMMs become deployfuse.Fp8GemmAct nodes (fp8 on ort-cuda)


def check_options(precision: str, target: Target, opset: int, calibration_data: str | None, accuracy_budget: str | None,
                  int8_mode: str | None, rtol: float | None) -> QuantizeOptions | None:
    """The quantization options for `precision` (None for float precisions), or a UsageError for
    a combination that cannot work."""
    if precision not in QUANTIZED:
        given = [flag for flag, value in (("--calibration-data", calibration_data), ("--accuracy-budget", accuracy_budget), ("--int8-mode", int8_mode))
                 if value is not None]
        if given:
            raise UsageError(f"{given[0]} applies to quantized exports: add --precision int8 or fp8")
        return None
    if rtol is not None:
        raise UsageError(f"--rtol does not judge a {precision} export: its accuracy gate does, with --accuracy-budget (e.g. cos=0.999,rel=2e-2)")
    if precision == "fp8" and target == ORT_CPU:
        raise UsageError("--precision fp8 needs --target tensorrt or ort-cuda (Hopper-class fp8 GEMMs); ONNX Runtime's CPU has no fp8 kernels: use int8")
    if precision == "fp8" and opset < MIN_OPSET["fp8"]:
        raise UsageError(f"--precision fp8 needs --opset {MIN_OPSET['fp8']} or newer (float8 QuantizeLinear/DequantizeLinear)")
    if int8_mode is not None and (precision != "int8" or target != ORT_CPU):
        raise UsageError("--int8-mode chooses ONNX Runtime's CPU quantization: it needs --precision int8 --target ort-cpu")
    if int8_mode is not None and int8_mode not in ort_int8.MODES:
        raise UsageError(f"--int8-mode {int8_mode!r}: choose {', '.join(ort_int8.MODES)}")
    mode = (int8_mode or "dynamic") if target == ORT_CPU else "qdq"
    fp8_gemms = precision == "fp8" and target == ORT_CUDA
    return QuantizeOptions(precision, mode, budget_of(accuracy_budget), calibration_data, float_precision(precision, target), fp8_gemms)


def float_precision(precision: str, target: Target) -> str:
    """The float precision a `precision` export for `target` is made in, around its quantized
    GEMMs: fp16 for fp8 on ort-cuda, whose artefact must beat the fp16 one (each float8 Q/DQ'd
    GEMM becomes a deployfuse.Fp8GemmAct node, a cuBLASLt fp8 GEMM writing fp16); fp32 otherwise (TensorRT picks its own types for what it does not quantize,
    ONNX Runtime's CPU int8 kernels take fp32)."""
    return "fp16" if precision == "fp8" and target == ORT_CUDA else "fp32"


def before_fusion(target: Target, options: QuantizeOptions | None) -> bool:
    """Whether `options` quantize the unfused graph for `target` (then fused), not the fused one."""
    return options is not None and target == ORT_CUDA and not options.fp8_gemms


FP8_SKIPPED_FAMILIES = ("packed_qkv", "gemm_act", "bias_gelu", "bias_act")
"""Families an fp8 ort-cuda export fuses without: packed QKV and GemmAct nodes hold GEMMs no Q/DQ
reaches (split_qkv, next in line, then packs Q, K, V as one MatMul + Add and a Split that the Q/DQ
reach); BiasGelu and BiasAct would take a bias (and a ReLU) the fp8 GEMM's epilogue adds."""


def skipped_families(target: Target, options: QuantizeOptions | None) -> tuple[str, ...]:
    """The fusion families an export with `options` for `target` runs without."""
    if options is None:
        return ()
    if options.fp8_gemms:
        return FP8_SKIPPED_FAMILIES
    return ort_int8.SKIPPED_FAMILIES if target == ORT_CPU else ()


def quantize(model: onnx.ModelProto, options: QuantizeOptions, calibration: Calibration,
             references: Mapping[str, Sequence[dict[str, torch.Tensor]]] | None) -> tuple[onnx.ModelProto, GateResult | None]:
    """`model` (in `options.float_precision`; fused for the target unless `before_fusion`) quantized as `options.mode` says,
    and the gate's result; without `references` (no verification asked for) every layer is
    quantized and nothing is judged.

    Raises:
        GateFailed: over budget even with the bound on fp32 layers reached.
    """
    switchboard: Callable[[], Switchboard | None] | None = None  # built only if the gate fails
    model, copies = untransposed_weights(model)  # a tied LM head's GEMM, quantizable
    if options.mode in ort_int8.WEIGHT_LEVELS:
        levels = ort_int8.WEIGHT_LEVELS[options.mode]
        model = ort_int8.gemms_as_matmuls(model)
        layers = ort_int8.layers(model)
        weights = rounded_weights(model, layers, calibration.feeds(), levels)
        quantizer = ort_int8.quantizer(model, weights, levels)
        switchboard = partial(ort_int8.switchboard, model, weights, levels)
    else:
        quantizer = _qdq_quantizer(model, options, calibration)
        names = set(quantizable_nodes(model, options.precision))
        layers = {n.name: n for n in model.graph.node if n.name in names}
        if options.precision == "fp8":
            switchboard = partial(fp8_switchboard.switchboard, model, calibration)
    if references is None:
        quantized = quantizer(set())
        result = None
    else:
        quantized, result = run_gate(quantizer, layers, calibration, references, options.budget, switchboard, options.float_precision,
                                     layer_costs(model, layers))
    quantized = retransposed_weights(quantized, copies)  # a head the gate keeps in float: one copy of its table
    quantized.metadata_props.clear()
    quantized.metadata_props.extend(model.metadata_props)  # the export's facts, whatever the quantizer kept
    return quantized, result


def _qdq_quantizer(model: onnx.ModelProto, options: QuantizeOptions, calibration: Calibration) -> Callable[[set[str]], onnx.ModelProto]:
    def quantize(exclude: set[str]) -> onnx.ModelProto:
        quantized = place_qdq(model, options.precision, calibration, exclude)
        return fp8_gemm.lower(quantized, ORT_CUDA)[0] if options.fp8_gemms else quantized

    return quantize


__all__ = ["FP8_SKIPPED_FAMILIES", "QUANTIZED", "QuantizeOptions", "before_fusion", "check_options", "float_precision", "quantize", "skipped_families"]
