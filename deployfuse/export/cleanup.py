"""Clean an exported graph: constant folding, dead code, shapes; an IR version ORT accepts."""

from __future__ import annotations

import onnx
import onnxscript.optimizer

MAX_IR_VERSION = 10  # ONNX Runtime 1.2x accepts <= 10 (1.31 accepts 13); 10 runs everywhere


def clean(model: onnx.ModelProto) -> onnx.ModelProto:
    """Constant-fold, drop dead nodes and unused initializers, infer shapes, cap the IR version."""
    # inline=False keeps deployfuse nodes (and their function bodies) as the single nodes they are.
    model = onnxscript.optimizer.optimize(model, inline=False)
    model = onnx.shape_inference.infer_shapes(model, data_prop=True)
    model.ir_version = min(model.ir_version, MAX_IR_VERSION)
    return model
