"""The fp8 accuracy gate's `Switchboard`: every fp8-quantizable GEMM behind an If of its own.

Without it the gate ranked the layers by quantizing each alone on a fresh artefact (`place_qdq`,
`fp8_gemm.lower`, an ONNX Runtime session per layer): BERT-base's fp8 ort-cuda export spent ~143 s
of its ~214 s on that on a 2-core CPU (~27 s on the switchboard, ~90 s in all). On the switchboard a
bool input `<layer>.fp8` picks, per layer and per run, between the original node (false) and the
layer's GEMM as Fp8GemmAct's function body computes it (true), with the scales `place_qdq`
calibrates (`fp8_activation_scales`) and the float8 weight it stores (`fp8_weight`):

    Cast(Cast(float32(x) / XScale -> float8 e4m3, saturating) -> float32) * XScale  @  float32(Wq) * WScale

in float32 (a Gemm's C added there too), cast back to the graph's type; Wq stays float8 (the
switchboard holds 1.5x fp16 weights, 1.25x fp32 ones). A MatMul's bias Add and the activation stay outside the
If, in the graph's type, as in the Q/DQ graph: `fp8_gemm.lower` takes them into the float32
epilogue, a rounding apart, and the gate measures the choice it finds on the real artefact anyway.
In an fp16 graph even a layer switched off is a rounding apart (ONNX Runtime's CPU runs an fp16
MatMul and the Add after it in float32 in one go; an If's output is fp16). Casts, not
QuantizeLinear / DequantizeLinear: ONNX Runtime's CPU optimizer rewrites a DequantizeLinear ->
MatMul into integer kernels (`ops.defs.fp8_gemm_act.body`).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from deployfuse.quantize.calibration import Calibration
from deployfuse.quantize.gate import Switchboard
from deployfuse.quantize.qdq import PROTOBUF_LIMIT, fp8_activation_scales, fp8_weight, quantizable_nodes


def switchboard(model: onnx.ModelProto, calibration: Calibration) -> Switchboard | None:
    """`model` (the float graph `place_qdq` quantizes in fp8) with each of its `quantizable_nodes`
    behind an If on a bool input `<node>.fp8`: true computes that GEMM in fp8 as its Fp8GemmAct
    would, false runs the node as it is. None when no node is quantizable."""
    chosen = set(quantizable_nodes(model, "fp8"))
    if not chosen:
        return None
    x_scales = fp8_activation_scales(model, calibration)
    weights = {t.name: t for t in model.graph.initializer}
    stored: dict[str, tuple[str, str]] = {}  # float weight -> its float8 values and their float32 scale

    def branches(node: onnx.NodeProto, board: onnx.ModelProto, switch: str) -> tuple[onnx.GraphProto, onnx.GraphProto]:
        weight = node.input[1]
        if weight not in stored:
            values, scale = fp8_weight(weights[weight])
            stored[weight] = (f"{weight}.fp8", f"{weight}.fp8_scale")
            board.graph.initializer.extend([numpy_helper.from_array(values, stored[weight][0]),
                                            numpy_helper.from_array(np.array(scale, np.float32), stored[weight][1])])
        board.graph.initializer.append(numpy_helper.from_array(np.array(x_scales[node.name], np.float32), f"{switch}.x_scale"))
        graph_type = weights[weight].data_type
        float_out = f"{node.output[0]}.float"
        original = helper.make_node(node.op_type, list(node.input), [float_out], name=f"{node.name}.float", domain=node.domain)
        original.attribute.extend(node.attribute)
        unchanged = helper.make_graph([original], f"{node.name}_float", [], [helper.make_tensor_value_info(float_out, graph_type, None)])
        return _fp8_branch(node, stored[weight], f"{switch}.x_scale", graph_type), unchanged

    board = Switchboard.of(model, chosen, "fp8", branches)
    if board.model.ByteSize() > PROTOBUF_LIMIT:  # no session could load it from memory: the gate measures artefacts
        return None
    return board


def _fp8_branch(node: onnx.NodeProto, weight: tuple[str, str], x_scale: str, graph_type: int) -> onnx.GraphProto:
    """The If's fp8 branch of GEMM `node` (MatMul, or Gemm with its attributes and C): x rounded
    to float8 e4m3 at `x_scale` and back, times the float8 `weight` (values, scale) in float32."""
    prefix = f"{node.name}.fp8."
    parts = ("x", "x_scaled", "x_q", "x_q_float", "x_dq", "w_float", "w_dq", "c", "y", "out")
    x, x_scaled, x_q, x_q_float, x_dq, w_float, w_dq, c, y, out = (prefix + part for part in parts)
    steps = [helper.make_node("Cast", [node.input[0]], [x], to=TensorProto.FLOAT),
             helper.make_node("Div", [x, x_scale], [x_scaled]),
             helper.make_node("Cast", [x_scaled], [x_q], to=TensorProto.FLOAT8E4M3FN, saturate=1),
             helper.make_node("Cast", [x_q], [x_q_float], to=TensorProto.FLOAT),
             helper.make_node("Mul", [x_q_float, x_scale], [x_dq]),
             helper.make_node("Cast", [weight[0]], [w_float], to=TensorProto.FLOAT),
             helper.make_node("Mul", [w_float, weight[1]], [w_dq])]
    gemm_inputs = [x_dq, w_dq]
    if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2]:
        steps.append(helper.make_node("Cast", [node.input[2]], [c], to=TensorProto.FLOAT))
        gemm_inputs.append(c)
    gemm = helper.make_node(node.op_type, gemm_inputs, [y])
    gemm.attribute.extend(node.attribute)
    steps += [gemm, helper.make_node("Cast", [y], [out], to=graph_type)]
    for index, step in enumerate(steps):
        step.name = f"{prefix}{index}"
    return helper.make_graph(steps, f"{node.name}_fp8", [], [helper.make_tensor_value_info(out, graph_type, None)])


__all__ = ["switchboard"]
