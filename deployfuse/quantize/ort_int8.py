"""INT8 for the ort-cpu target through ONNX Runtime's own quantizer and its int8 CPU kernels.

`dynamic` (the default): weights int8 per output channel, activations quantized at run time per
tensor (DynamicQuantizeLinear → MatMulInteger, which ORT's optimizer turns into
DynamicQuantizeMatMul; com.microsoft Attention → QAttention; Conv → ConvInteger). No scale is
fitted to data, so calibration samples only feed the gate. `static`: activation scales fitted on
the calibration samples (MinMax), written as QuantizeLinear/DequantizeLinear pairs that ORT's CPU
optimizer folds into QLinear kernels.

Quantization runs after deployfuse's fusions: ORT's quantizer knows the com.microsoft Attention
node the ort-cpu fusions emit (as QAttention), while fusing after quantization would find no
attention pattern left in a graph of MatMulInteger nodes (bench/results/cpu_int8.md measures both).
Only GEMM-bearing ops are quantized; norms, softmax, residual sums and embeddings stay fp32.
An Attention node with inputs beyond `mask_index` (an additive attention bias, past state) stays
fp32 too: QAttention has no such inputs and ORT's quantizer drops them silently (the mask with
them: a tiny BERT's attention output then differs by 27 % of its range on padded batches).
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx

from deployfuse.quantize.calibration import Calibration

MODES = ("dynamic", "static")
# Fusion families that would hide GEMMs from ORT's int8 quantizer: com.microsoft FusedConv (Conv +
# activation) has no int8 form, and packed_qkv's Attention node carries the attention mask as an
# additive bias that QAttention cannot take, so it stays fp32 with the Q/K/V projections inside;
# unpacked, attention is a MultiHeadAttention fed by three MatMuls that quantize (BERT-base 1x128,
# 2 threads: 0.55x of the fused fp32 graph's time instead of 0.65x).
SKIPPED_FAMILIES = ("fused_conv", "packed_qkv")
OP_TYPES = {"dynamic": ("MatMul", "Gemm", "Attention", "Conv"), "static": ("MatMul", "Gemm", "Conv")}


@contextmanager
def _quiet_root_logger() -> Iterator[None]:
    """ONNX Runtime's quantizer logs advice through the root logger ("consider pre-processing")."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


class _Samples:
    """A CalibrationDataReader over numpy feeds, restricted to the inputs the graph declares."""

    def __init__(self, feeds: Sequence[Mapping[str, np.ndarray]], names: set[str]):
        self._feeds = iter([{k: v for k, v in feed.items() if k in names} for feed in feeds])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)


def layers(model: onnx.ModelProto, mode: str) -> dict[str, onnx.NodeProto]:
    """The nodes `mode` quantizes, by name: its op types, less Attention nodes that QAttention
    cannot express (any input after mask_index)."""
    return {n.name: n for n in model.graph.node if n.name and n.op_type in OP_TYPES[mode] and not (n.op_type == "Attention" and any(n.input[4:]))}


def quantizer(model: onnx.ModelProto, mode: str, calibration: Calibration) -> Callable[[set[str]], onnx.ModelProto]:
    """A function that quantizes `model` to int8 in `mode`, leaving the named nodes in fp32.

    Static scales are fitted on `calibration.samples`; `model` itself is left as it is.
    """
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, quantize_static

    serialized = model.SerializeToString()
    names = {i.name for i in model.graph.input}
    quantizable = sorted(layers(model, mode))

    class Reader(_Samples, CalibrationDataReader):
        pass

    def quantize(exclude: set[str]) -> onnx.ModelProto:
        with tempfile.TemporaryDirectory(prefix="deployfuse-int8-") as tmp, _quiet_root_logger():
            out = Path(tmp) / "int8.onnx"
            source = onnx.load_from_string(serialized)  # the quantizer edits the model it is given
            if mode == "dynamic":
                quantize_dynamic(source, out, per_channel=True, weight_type=QuantType.QInt8,
                                 nodes_to_quantize=[n for n in quantizable if n not in exclude])
            else:
                quantize_static(source, out, Reader(calibration.feeds(), names), quant_format=QuantFormat.QDQ,
                                per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                                nodes_to_quantize=[n for n in quantizable if n not in exclude],
                                calibration_providers=["CPUExecutionProvider"])
            return onnx.load(str(out))

    return quantize


__all__ = ["MODES", "OP_TYPES", "SKIPPED_FAMILIES", "layers", "quantizer"]
