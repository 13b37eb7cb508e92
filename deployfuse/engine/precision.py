"""Lower a float32 ONNX graph to float16 or bfloat16 for a strongly typed TensorRT network.

TensorRT-RTX builds only strongly typed networks (each tensor keeps the ONNX type) and
TensorRT 10 deprecates the weakly typed fp16/bf16 builder flags, so `--fp16`/`--bf16` rewrite
the graph instead: every float32 tensor, initializer, constant and `Cast(to=float)` becomes the
lower type, and the model inputs and outputs stay float32 through a `Cast` at each boundary, so
the engine's interface does not change. Inputs ONNX requires in float32 (Resize scales and
roi) stay float32.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from deployfuse.engine.preflight import walk_nodes

PRECISIONS = {"fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}
_FLOAT32_INPUTS = {("", "Resize"): (1, 2), ("", "Upsample"): (1,)}


def lower_precision(model: onnx.ModelProto, precision: str) -> int:
    """Rewrite `model` in place to `precision` ("fp16" or "bf16"); return the tensors converted."""
    target = PRECISIONS[precision]
    keep = _float32_only(model)
    graph = model.graph
    count = 0
    for tensor in graph.initializer:
        if tensor.data_type == TensorProto.FLOAT and tensor.name not in keep:
            tensor.CopyFrom(_converted(tensor, target))
            count += 1
    for node in _nodes(model):
        if node.op_type == "Constant" and node.output[0] in keep:
            continue
        count += _convert_attributes(node, target)
    for info in graph.value_info:
        if info.type.tensor_type.elem_type == TensorProto.FLOAT and info.name not in keep:
            info.type.tensor_type.elem_type = target
    count += _cast_boundaries(model, target)
    return count


def _converted(tensor: TensorProto, target: int) -> TensorProto:
    """The tensor in the target type, clipped to its finite range first.

    Clipping keeps "minus infinity" attention-mask constants (float32's lowest value) finite:
    a fully masked row then softmaxes to a uniform row instead of NaN.
    """
    import ml_dtypes

    dtype = np.dtype(np.float16) if target == TensorProto.FLOAT16 else np.dtype(ml_dtypes.bfloat16)
    limit = float(ml_dtypes.finfo(dtype).max)
    array = np.clip(numpy_helper.to_array(tensor).astype(np.float32), -limit, limit)
    return numpy_helper.from_array(array.astype(dtype), tensor.name)


def _convert_attributes(node: onnx.NodeProto, target: int) -> int:
    """Float32 attribute values and dtype choices of one node; returns how many changed."""
    changed = 0
    for i, attr in enumerate(node.attribute):
        if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == TensorProto.FLOAT:
            attr.t.CopyFrom(_converted(attr.t, target))
            changed += 1
        elif attr.type == onnx.AttributeProto.INT and attr.name in ("to", "dtype") and attr.i == TensorProto.FLOAT:
            attr.i = target
            changed += 1
        elif node.op_type == "Constant" and attr.name in ("value_float", "value_floats"):
            values = np.array(attr.f if attr.name == "value_float" else list(attr.floats), dtype=np.float32)
            tensor = _converted(numpy_helper.from_array(values), target)
            node.attribute[i].CopyFrom(onnx.helper.make_attribute("value", tensor))
            changed += 1
    return changed


def _cast_boundaries(model: onnx.ModelProto, target: int) -> int:
    """Cast float32 graph inputs down on entry and float32 graph outputs back up on exit."""
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    casts: list[onnx.NodeProto] = []
    count = 0
    for value in graph.output:
        if value.type.tensor_type.elem_type == TensorProto.FLOAT:
            low = f"{value.name}__{'fp16' if target == TensorProto.FLOAT16 else 'bf16'}"
            _rename_everywhere(model, value.name, low)
            casts.append(onnx.helper.make_node("Cast", [low], [value.name], name=f"{value.name}__to_fp32", to=TensorProto.FLOAT))
            count += 1
    entry: list[onnx.NodeProto] = []
    for value in graph.input:
        if value.name not in initializers and value.type.tensor_type.elem_type == TensorProto.FLOAT:
            low = f"{value.name}__lowp"
            _rename_uses(model, value.name, low)
            entry.append(onnx.helper.make_node("Cast", [value.name], [low], name=f"{value.name}__to_lowp", to=target))
            count += 1
    nodes = entry + list(graph.node) + casts
    del graph.node[:]
    graph.node.extend(nodes)
    return count


def _rename_everywhere(model: onnx.ModelProto, old: str, new: str) -> None:
    for node in _nodes(model, functions=False):
        node.output[:] = [new if o == old else o for o in node.output]
    _rename_uses(model, old, new)


def _rename_uses(model: onnx.ModelProto, old: str, new: str) -> None:
    for node in _nodes(model, functions=False):
        node.input[:] = [new if i == old else i for i in node.input]


def _float32_only(model: onnx.ModelProto) -> set[str]:
    """Names fed into inputs that ONNX types as float32 regardless of the data type."""
    keep = set()
    for node in _nodes(model, functions=False):
        for index in _FLOAT32_INPUTS.get((node.domain, node.op_type), ()):
            if index < len(node.input) and node.input[index]:
                keep.add(node.input[index])
    return keep


def _nodes(model: onnx.ModelProto, functions: bool = True) -> Iterator[onnx.NodeProto]:
    """Every node: graph, subgraphs, and (when asked) function bodies."""
    return walk_nodes(model.graph.node, *((f.node for f in model.functions) if functions else ()))
