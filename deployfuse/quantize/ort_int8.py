"""INT8 for the ort-cpu target through ONNX Runtime's own quantizer and its int8 CPU kernels.

`dynamic` (the default, this module): weights int8 per output channel, activations quantized at
run time per tensor (DynamicQuantizeLinear → MatMulInteger, which ORT's optimizer turns into
DynamicQuantizeMatMul; com.microsoft Attention → QAttention; Conv → ConvInteger). No scale is
fitted to data; the calibration samples choose how the MatMul weights round (`rounding`: GPTQ,
ONNX Runtime's scales, other integers) and feed the gate. `static`: activation scales fitted on
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

import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from deployfuse.quantize.gate import Switchboard
from deployfuse.quantize.qdq import fresh_name
from deployfuse.quantize.rounding import int8_per_column, weighted_matmuls
from deployfuse.quiet_logs import quieted

MODES = ("dynamic", "dynamic-7bit", "static")
"""dynamic-7bit: dynamic int8 with weights in -64..64 (ONNX Runtime's reduce_range), for x86 CPUs without VNNI. There its u8 x s8
kernels add two products in 16 bits: 8-bit weights saturate them and run as uint8 in the slower u8 x u8 kernels
(`backends.u8s8`), 7-bit ones cannot (255 * 128 < 32768) and keep the faster kernels, at one bit less of weight precision that the
gate judges (bench/results/cpu_int8.md, "On a CPU without VNNI")."""
WEIGHT_LEVELS = {"dynamic": 127, "dynamic-7bit": 64}  # the largest |weight| of each dynamic mode
# Fusion families that would hide GEMMs from ORT's int8 quantizer: com.microsoft FusedConv (Conv +
# activation) has no int8 form, and packed_qkv's Attention node carries the attention mask as an
# additive bias that QAttention cannot take, so it stays fp32 with the Q/K/V projections inside;
# unpacked, attention is a MultiHeadAttention fed by three MatMuls that quantize (BERT-base 1x128,
# 2 threads: 0.55x of the fused fp32 graph's time instead of 0.65x). split_qkv, which would take
# the self-attentions packed_qkv leaves, is skipped with it: the int8 artefacts stay as measured
# in bench/results/cpu_int8.md (three quantized Q, K, V MatMuls per layer).
SKIPPED_FAMILIES = ("fused_conv", "packed_qkv", "split_qkv")
# What dynamic quantization quantizes (ONNX Runtime's IntegerOps registry): not Gemm, which its
# quantizer rewrites into an fp32 MatMul of another name that `nodes_to_quantize` then misses;
# `gemms_as_matmuls` hands it those as MatMuls of the Gemms' names first.
OP_TYPES = ("MatMul", "Attention", "Conv")


def gemms_as_matmuls(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` (left as it is) with each Gemm that is a plain weight GEMM, Y = A B (+ C): B an
    initializer, transA=0, alpha=beta=1, rewritten as a MatMul (B stored transposed where
    transB=1) and an Add of C, an exact rewrite. Why: ONNX Runtime's dynamic quantizer does not
    quantize a Gemm it is named (it renames it to an fp32 MatMul first), so GPT-2's Conv1D
    projections and MLPs (torch addmm), or a classifier head, stayed fp32 in an int8 export. As
    MatMuls they quantize, get GPTQ rounding and a switch on the gate's switchboard like any
    other; the MatMul keeps the Gemm's name, so the gate's layer names still name that node.
    Other Gemms (transA=1, a computed B, scaled terms) stay as they are, in fp32."""
    inputs = {i.name for i in model.graph.input}  # an initializer also listed as an input can be fed: not a constant
    initializers = {t.name: t for t in model.graph.initializer if t.name not in inputs}
    result = onnx.ModelProto()
    result.CopyFrom(model)
    transposed: set[str] = set()
    taken = {name for node in model.graph.node for name in (node.name, *node.input, *node.output)} | set(initializers)
    nodes = []
    for node in result.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if (node.op_type != "Gemm" or node.domain not in ("", "ai.onnx") or node.input[1] not in initializers or attrs.get("transA", 0)
                or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0 or len(initializers[node.input[1]].dims) != 2):
            nodes.append(node)
            continue
        weight = node.input[1]
        if attrs.get("transB", 0):
            transposed.add(weight)
            weight = fresh_name(f"{weight}_transposed", taken)
            result.graph.initializer.append(numpy_helper.from_array(numpy_helper.to_array(initializers[node.input[1]]).T.copy(), weight))
        has_bias = len(node.input) > 2 and node.input[2] != ""
        product = fresh_name(f"{node.output[0]}_matmul", taken) if has_bias else node.output[0]
        nodes.append(helper.make_node("MatMul", [node.input[0], weight], [product], name=node.name or fresh_name("Gemm_MatMul", taken)))
        if has_bias:
            nodes.append(helper.make_node("Add", [product, node.input[2]], [node.output[0]], name=fresh_name(f"{node.name}_bias", taken)))
    del result.graph.node[:]
    result.graph.node.extend(nodes)
    unused = transposed - _inputs_read(result.graph)  # weights only their Gemms read, now stored transposed
    kept = [t for t in result.graph.initializer if t.name not in unused]
    del result.graph.initializer[:]
    result.graph.initializer.extend(kept)
    return result


def _inputs_read(graph: onnx.GraphProto) -> set[str]:
    """Every tensor name a node of `graph` or of its subgraphs reads."""
    names = set()
    for node in graph.node:
        names.update(node.input)
        for attribute in node.attribute:
            for subgraph in (attribute.g, *attribute.graphs) if attribute.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) else ():
                names |= _inputs_read(subgraph)
    return names


def layers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    """The nodes dynamic quantization quantizes, by name: `OP_TYPES`, less Attention nodes that
    QAttention cannot express (any input after mask_index)."""
    return {n.name: n for n in model.graph.node if n.name and n.op_type in OP_TYPES and not (n.op_type == "Attention" and any(n.input[4:]))}


def quantizer(model: onnx.ModelProto, weights: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None,
              levels: int = 127) -> Callable[[set[str]], onnx.ModelProto]:
    """A function that quantizes `model` to dynamic int8, leaving the named nodes in fp32
    (`model` itself is left as it is); `weights` (`rounding.rounded_weights`: int8 weight and
    per-column scales by weight name) replace the integers ONNX Runtime's quantizer rounds;
    `levels` 64: every weight in -64..64 (`WEIGHT_LEVELS`, ONNX Runtime's reduce_range)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    serialized = model.SerializeToString()
    quantizable = sorted(layers(model))

    def quantize(exclude: set[str]) -> onnx.ModelProto:
        source = onnx.load_from_string(serialized)  # the quantizer edits the model it is given
        nodes = [n for n in quantizable if n not in exclude]
        if not nodes:  # ONNX Runtime's quantizer reads an empty nodes_to_quantize as "all of them"
            return source
        # ONNX Runtime's quantizer logs advice through the root logger ("consider pre-processing")
        with tempfile.TemporaryDirectory(prefix="deployfuse-int8-") as tmp, quieted():
            out = Path(tmp) / "int8.onnx"
            quantize_dynamic(source, out, per_channel=True, reduce_range=levels < 127, weight_type=QuantType.QInt8, nodes_to_quantize=nodes)
            quantized = onnx.load(str(out))
        _replace_weights(quantized, weights or {})
        return quantized

    return quantize


def _replace_weights(quantized: onnx.ModelProto, weights: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> None:
    """Put `weights` in place of the int8 weights and scales ONNX Runtime's quantizer wrote
    (`{weight}_quantized`, `{weight}_scale`), where it quantized that weight."""
    initializers = {t.name: t for t in quantized.graph.initializer}
    for name, (int8_weight, scale) in weights.items():
        old = initializers.get(f"{name}_quantized")
        if old is None:  # kept in fp32
            continue
        old_scale = initializers.get(f"{name}_scale")
        if tuple(old.dims) != int8_weight.shape or old.data_type != TensorProto.INT8 or old_scale is None or tuple(old_scale.dims) != scale.shape:
            raise ValueError(f"ONNX Runtime's quantizer wrote {name}_quantized as {tuple(old.dims)} (type {old.data_type}), not the per-column int8 "
                             f"{int8_weight.shape} this module rounds")
        old.CopyFrom(numpy_helper.from_array(int8_weight, old.name))
        old_scale.CopyFrom(numpy_helper.from_array(scale, old_scale.name))


def switchboard(model: onnx.ModelProto, weights: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None, levels: int = 127) -> Switchboard | None:
    """`model` with each of its `layers` behind an If on a bool input of its own: true runs it in
    dynamic int8 (com.microsoft DynamicQuantizeMatMul: per-column int8 weights, the activation
    quantized at run time per tensor, the same numbers as `quantizer`'s MatMulInteger chain, with
    the same `weights` when given, else rounded to nearest as ONNX Runtime rounds them), false
    in fp32. One session of it measures any choice of int8 layers, where `quantizer` would run
    ONNX Runtime's quantizer and build a session per choice (BERT-base: 72 layers, ~9 s each).

    Only MatMuls with a 2-D initializer weight get a switch; other layers (Conv, Attention) stay
    fp32 on it, and the gate measures them on the artefact. None when no layer has a switch."""
    initializers = {t.name: t for t in model.graph.initializer}
    chosen = weighted_matmuls(model, layers(model))
    if not chosen:
        return None

    def branches(node: onnx.NodeProto, board: onnx.ModelProto, switch: str) -> tuple[onnx.GraphProto, onnx.GraphProto]:
        int8_weight, scale = (weights or {}).get(node.input[1]) or int8_per_column(numpy_helper.to_array(initializers[node.input[1]]), levels=levels)
        names = [f"{switch}.weight", f"{switch}.scale", f"{switch}.zero_point"]
        board.graph.initializer.extend([numpy_helper.from_array(int8_weight, names[0]), numpy_helper.from_array(scale, names[1]),
                                        numpy_helper.from_array(np.zeros(scale.shape, np.int8), names[2])])
        made = []
        for branch, op, inputs, domain in (("int8", "DynamicQuantizeMatMul", [node.input[0], *names], "com.microsoft"), ("fp32", "MatMul", list(node.input), "")):
            out = f"{node.output[0]}.{branch}"
            made.append(helper.make_graph([helper.make_node(op, inputs, [out], name=f"{node.name}.{branch}", domain=domain)], f"{node.name}_{branch}", [],
                                          [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)]))
        return made[0], made[1]

    return Switchboard.of(model, chosen, "int8", branches)


__all__ = ["MODES", "OP_TYPES", "WEIGHT_LEVELS", "SKIPPED_FAMILIES", "gemms_as_matmuls", "layers", "quantizer", "switchboard"]
