"""Clean an exported graph: constant folding, dead code, shapes; an IR version ORT accepts."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxscript.optimizer
from onnx import numpy_helper

from deployfuse.quiet_logs import quieted

MAX_IR_VERSION = 10  # ONNX Runtime 1.2x accepts <= 10 (1.31 accepts 13); 10 runs everywhere
TINY = 1e-8  # onnxscript's no-op rules take |c| <= 1e-8 for zero and delete x + c
_SHIELD = "deployfuse.shield"  # a private domain no rewrite rule matches, for the duration of the cleanup


FOLDING_LOGGER = "onnxscript.optimizer._constant_folding"
"""onnxscript's constant folding (run by the dynamo exporter's optimize=True and by `clean`) logs a WARNING,
"Evaluation failed: cannot reshape ...", for each value it tries and fails to fold, e.g. a Reshape whose shape is
still symbolic; the node simply stays, but on the user's terminal it reads as an error: `quieted` while they run."""


def clean(model: onnx.ModelProto) -> onnx.ModelProto:
    """Constant-fold, drop dead nodes and unused initializers, infer shapes, cap the IR version.

    `x + ε` and `x - ε` with a tiny non-zero constant survive: onnxscript's optimizer would
    delete them as additions of zero, and a LayerNorm whose ε = 1e-12 (BERT) would then divide
    0 by 0 on a constant row (they are shielded on a copy). Static dims read from partly
    dynamic shapes are folded too.
    """
    tiny = _tiny_constant_adds(model)
    if tiny:
        model = _shielded(model, tiny)
    model = _optimize(model)
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    changed = False
    if _fold_static_shape_reads(inferred, into=model):  # e.g. SDPA's scale 1/√(head size)
        model, changed = _optimize(model), True
    if tiny:
        _unshield(model)
        changed = True
    if changed:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    inferred.ir_version = min(inferred.ir_version, MAX_IR_VERSION)
    return inferred


def _optimize(model: onnx.ModelProto) -> onnx.ModelProto:
    """onnxscript's optimizer, then its lost constants put back.

    Its ReshapeReshape rule names each new shape after the output it rewrites; when two
    rewrites pick the same name, the second shape is renamed (`<name>/shape_1`) but never
    registered as an initializer, and its Reshape reads a value nothing defines: ONNX Runtime
    refuses the model (onnxscript 0.7.2, seen on the TorchScript export of T5; microsoft/onnxscript#2945).
    Such a value still holds its tensor, so it is registered here.
    """
    graph_model = ir.serde.deserialize_model(model)
    # inline=False keeps deployfuse nodes (and their function bodies) as the single nodes they are.
    with quieted(FOLDING_LOGGER):
        onnxscript.optimizer.optimize_ir(graph_model, inline=False)
    graph = graph_model.graph
    defined = {id(v) for v in graph.inputs} | {id(v) for v in graph.initializers.values()}
    for node in graph:
        for value in node.inputs:
            if value is not None and value.producer() is None and id(value) not in defined and value.const_value is not None:
                graph.register_initializer(value)
                defined.add(id(value))
    return ir.serde.serialize_model(graph_model)


def _static_dims(model: onnx.ModelProto) -> dict[str, list[int | None]]:
    """Inferred shapes by value name: a dim is its size where static, None where symbolic."""
    infos = [*model.graph.input, *model.graph.value_info, *model.graph.output]
    return {vi.name: [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
            for vi in infos if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape")}


def _slice_bounds(node: onnx.NodeProto, consts: dict[str, np.ndarray]) -> tuple[int, int] | None:
    """(start, end) of a 1-D Slice with constant one-element starts/ends, axis 0 and step 1."""
    names = [*node.input[1:], "", ""][:4]
    if any(name and name not in consts for name in names) or not names[0] or not names[1]:
        return None
    starts, ends, axes, steps = (consts[name].reshape(-1) if name else None for name in names)
    if starts is None or ends is None or starts.size != 1 or ends.size != 1 or (axes is not None and axes.tolist() != [0]) or (steps is not None and steps.tolist() != [1]):
        return None
    return int(starts[0]), int(ends[0])


def _fold_static_shape_reads(inferred: onnx.ModelProto, into: onnx.ModelProto) -> int:
    """Replace Shape(x) and Slice(Shape(x), ...) in `into` by constants where the dims they read
    are static in `inferred` (`into` with inferred shapes) though others are not (a dynamic batch
    with a fixed head size): onnxscript folds a Shape only when the whole shape is static.
    How many nodes were replaced."""
    dims = _static_dims(inferred)
    consts = _constants(into)
    model = into
    read: dict[str, list[int | None]] = {}  # Shape outputs -> the dims they hold
    replaced = 0
    for i, node in enumerate(model.graph.node):
        if node.domain not in ("", "ai.onnx"):
            continue
        values: list[int | None] | None = None
        if node.op_type == "Shape" and node.input[0] in dims:
            attrs = {a.name: a.i for a in node.attribute}
            values = dims[node.input[0]][slice(attrs.get("start", 0), attrs.get("end"))]
            read[node.output[0]] = values
        elif node.op_type == "Slice" and node.input[0] in read:
            bounds = _slice_bounds(node, consts)
            if bounds is not None:
                values = read[node.input[0]][slice(*bounds)]
        if values and all(v is not None for v in values):
            constant = onnx.helper.make_node("Constant", [], [node.output[0]], value=numpy_helper.from_array(np.array(values, dtype=np.int64)))
            model.graph.node[i].CopyFrom(constant)
            replaced += 1
    return replaced


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    values = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for attr in node.attribute:
                if attr.name == "value":
                    values[node.output[0]] = attr.t
    return {name: numpy_helper.to_array(t) for name, t in values.items() if int(np.prod(t.dims)) <= 16}


def _tiny_constant_adds(model: onnx.ModelProto) -> list[int]:
    """Indices of the Add/Sub nodes with a tiny non-zero constant operand."""
    constants = _constants(model)
    found = []
    for index, node in enumerate(model.graph.node):
        if node.op_type in ("Add", "Sub") and node.domain in ("", "ai.onnx"):
            for name in node.input:
                c = constants.get(name)
                if c is not None and c.dtype.kind == "f" and c.size and bool(np.all((c != 0) & (np.abs(c) <= TINY))):
                    found.append(index)
                    break
    return found


def _shielded(model: onnx.ModelProto, indices: list[int]) -> onnx.ModelProto:
    """A copy of `model` with the nodes at `indices` moved to `_SHIELD`."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for index in indices:
        copy.graph.node[index].domain = _SHIELD
    copy.opset_import.append(onnx.helper.make_opsetid(_SHIELD, 1))
    return copy


def _unshield(model: onnx.ModelProto) -> None:
    for node in model.graph.node:
        if node.domain == _SHIELD:
            node.domain = ""
    kept = [o for o in model.opset_import if o.domain != _SHIELD]
    del model.opset_import[:]
    model.opset_import.extend(kept)
