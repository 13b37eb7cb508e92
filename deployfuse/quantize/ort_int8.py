"""INT8 for the ort-cpu target through ONNX Runtime's own quantizer and its int8 CPU kernels.

`dynamic` (the default, this module): weights int8 per output channel, activations quantized at
run time per tensor (DynamicQuantizeLinear → MatMulInteger, which ORT's optimizer turns into
DynamicQuantizeMatMul; com.microsoft Attention → QAttention; Conv → ConvInteger). No scale is
fitted to data, so calibration samples only feed the gate. `static`: activation scales fitted on
the calibration samples, the same QuantizeLinear/DequantizeLinear placement the GPU targets get
(`qdq.place_qdq`), which ORT's CPU optimizer folds into its int8 kernels. (ORT's own static QDQ
quantizer hands the dequantized tensor to every consumer, residual sums included: on a tiny BERT
that alone cost 1.4e-2 of relative error whichever single layer was quantized.)

Quantization runs after deployfuse's fusions (less `SKIPPED_FAMILIES`, so the Q/K/V projections
stay MatMuls that quantize): fusing after quantization would find no attention pattern left in a
graph of MatMulInteger nodes (bench/results/cpu_int8.md measures both orders).
Only GEMM-bearing ops are quantized; norms, softmax, residual sums and embeddings stay fp32.
A com.microsoft Attention node (which these fusions no longer emit) with inputs beyond `mask_index` (an additive attention bias, past state) stays
fp32 too: QAttention has no such inputs and ORT's quantizer drops them silently (the mask with
them: a tiny BERT's attention output then differs by 27 % of its range on padded batches).
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import onnx

MODES = ("dynamic", "static")
# Fusion families that would hide GEMMs from ORT's int8 quantizer: com.microsoft FusedConv (Conv +
# activation) has no int8 form, and packed_qkv's Attention node carries the attention mask as an
# additive bias that QAttention cannot take, so it stays fp32 with the Q/K/V projections inside;
# unpacked, attention is a MultiHeadAttention fed by three MatMuls that quantize (BERT-base 1x128,
# 2 threads: 0.55x of the fused fp32 graph's time instead of 0.65x).
SKIPPED_FAMILIES = ("fused_conv", "packed_qkv")
OP_TYPES = ("MatMul", "Gemm", "Attention", "Conv")  # what dynamic quantization quantizes


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


def layers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    """The nodes dynamic quantization quantizes, by name: `OP_TYPES`, less Attention nodes that
    QAttention cannot express (any input after mask_index)."""
    return {n.name: n for n in model.graph.node if n.name and n.op_type in OP_TYPES and not (n.op_type == "Attention" and any(n.input[4:]))}


def quantizer(model: onnx.ModelProto) -> Callable[[set[str]], onnx.ModelProto]:
    """A function that quantizes `model` to dynamic int8, leaving the named nodes in fp32
    (`model` itself is left as it is)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    serialized = model.SerializeToString()
    quantizable = sorted(layers(model))

    def quantize(exclude: set[str]) -> onnx.ModelProto:
        with tempfile.TemporaryDirectory(prefix="deployfuse-int8-") as tmp, _quiet_root_logger():
            out = Path(tmp) / "int8.onnx"
            source = onnx.load_from_string(serialized)  # the quantizer edits the model it is given
            quantize_dynamic(source, out, per_channel=True, weight_type=QuantType.QInt8, nodes_to_quantize=[n for n in quantizable if n not in exclude])
            return onnx.load(str(out))

    return quantize


__all__ = ["MODES", "OP_TYPES", "SKIPPED_FAMILIES", "layers", "quantizer"]
