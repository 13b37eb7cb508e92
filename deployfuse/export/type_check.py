"""Find a node whose inputs give one type parameter two element types (fp32 beside fp16).

ONNX shape inference (strict too) takes such a node's output type from its first input and
goes on; ONNX Runtime refuses the model when it loads it ("Type parameter (T) ... bound to
different types"), long after the exporter that wrote it. The TorchScript exporter writes such
graphs for fp16 models: its scaled_dot_product_attention with a boolean mask builds the mask
from fp32 constants (onnxscript#2445 fixed the dynamo exporter's), so the attention, and the
LayerNormalization after it, mix fp32 with the model's fp16 weights.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto


def _element_types(model: onnx.ModelProto) -> dict[str, int]:
    inferred = onnx.shape_inference.infer_shapes(model)
    infos = [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]
    types = {vi.name: vi.type.tensor_type.elem_type for vi in infos if vi.type.HasField("tensor_type")}
    types.update({t.name: t.data_type for t in model.graph.initializer})
    for node in model.graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if value is not None:
                types[node.output[0]] = value.data_type
    return types


def mistyped_node(model: onnx.ModelProto) -> str | None:
    """'<op> <name>: <T> is float and float16' for the first standard node that mixes element
    types under one type parameter, None when none does (or the graph cannot be inferred)."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None:
        return None
    try:
        types = _element_types(model)
    except Exception:  # noqa: BLE001 - an uninferable graph is left to the runtime's own checks
        return None
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        try:
            schema = onnx.defs.get_schema(node.op_type, opset)
        except onnx.defs.SchemaError:
            continue
        bound: dict[str, set[int]] = {}
        for index, name in enumerate(node.input):
            if not name or not schema.inputs:
                continue
            formal = schema.inputs[min(index, len(schema.inputs) - 1)]  # the last formal input may be variadic
            if not formal.is_homogeneous:  # a variadic input of mixed types (Loop's state)
                continue
            if name in types and types[name] != TensorProto.UNDEFINED:
                bound.setdefault(formal.type_str, set()).add(types[name])
        for param, elem_types in bound.items():
            if len(elem_types) > 1:
                names = " and ".join(sorted(TensorProto.DataType.Name(t).lower() for t in elem_types))
                return f"{node.op_type} {node.name or node.output[0]}: {param} is {names}"
    return None
