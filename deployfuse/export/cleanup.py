"""Clean an exported graph: constant folding, dead code, shapes; an IR version ORT accepts."""

from __future__ import annotations

import numpy as np
import onnx
import onnxscript.optimizer
from onnx import numpy_helper

MAX_IR_VERSION = 10  # ONNX Runtime 1.2x accepts <= 10 (1.31 accepts 13); 10 runs everywhere
TINY = 1e-8  # onnxscript's no-op rules take |c| <= 1e-8 for zero and delete x + c
_SHIELD = "deployfuse.shield"  # a private domain no rewrite rule matches, for the duration of the cleanup


def clean(model: onnx.ModelProto) -> onnx.ModelProto:
    """Constant-fold, drop dead nodes and unused initializers, infer shapes, cap the IR version.

    `x + ε` and `x - ε` with a tiny non-zero constant survive: onnxscript's optimizer would
    delete them as additions of zero, and a LayerNorm whose ε = 1e-12 (BERT) would then divide
    0 by 0 on a constant row.
    """
    shielded = _shield_tiny_constants(model)
    # inline=False keeps deployfuse nodes (and their function bodies) as the single nodes they are.
    model = onnxscript.optimizer.optimize(model, inline=False)
    if shielded:
        _unshield(model)
    model = onnx.shape_inference.infer_shapes(model, data_prop=True)
    model.ir_version = min(model.ir_version, MAX_IR_VERSION)
    return model


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    values = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for attr in node.attribute:
                if attr.name == "value":
                    values[node.output[0]] = attr.t
    return {name: numpy_helper.to_array(t) for name, t in values.items() if int(np.prod(t.dims)) <= 16}


def _shield_tiny_constants(model: onnx.ModelProto) -> int:
    """Move Add/Sub nodes with a tiny non-zero constant operand to `_SHIELD`; how many moved."""
    constants = _constants(model)
    moved = 0
    for node in model.graph.node:
        if node.op_type in ("Add", "Sub") and node.domain in ("", "ai.onnx"):
            for name in node.input:
                c = constants.get(name)
                if c is not None and c.dtype.kind == "f" and c.size and bool(np.all((c != 0) & (np.abs(c) <= TINY))):
                    node.domain = _SHIELD
                    moved += 1
                    break
    if moved:
        model.opset_import.append(onnx.helper.make_opsetid(_SHIELD, 1))
    return moved


def _unshield(model: onnx.ModelProto) -> None:
    for node in model.graph.node:
        if node.domain == _SHIELD:
            node.domain = ""
    kept = [o for o in model.opset_import if o.domain != _SHIELD]
    del model.opset_import[:]
    model.opset_import.extend(kept)
