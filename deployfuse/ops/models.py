"""One-node ONNX models around a deployfuse op, and example inputs for them.

The tests, the GPU checks and the benchmarks all run the ops this way: one node, its function
body attached, inputs with symbolic shapes so one model serves every size.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper

from deployfuse.ops.functions import attach_functions
from deployfuse.ops.schema import DOMAIN
from deployfuse.ops.specs import SPECS

_ONNX_TYPES = {np.dtype(np.float32): onnx.TensorProto.FLOAT, np.dtype(np.float16): onnx.TensorProto.FLOAT16, np.dtype(np.float64): onnx.TensorProto.DOUBLE}


def single_op_model(op: str, inputs: Sequence[np.ndarray | None], opset: int = 20, **attrs: Any) -> onnx.ModelProto:
    """A model computing `op` on graph inputs named like the spec's inputs (None = omitted
    optional input), every dimension symbolic, with its function body attached.

    bfloat16 inputs may be given as `ml_dtypes.bfloat16` arrays.
    """
    spec = SPECS[op]
    value_infos, names = [], []
    for name, arr in zip(spec.inputs, inputs):
        if arr is None:
            continue
        elem = _ONNX_TYPES.get(arr.dtype, onnx.TensorProto.BFLOAT16 if arr.dtype.name == "bfloat16" else None)
        if elem is None:
            raise ValueError(f"{op}: input {name} has unsupported dtype {arr.dtype}")
        value_infos.append(helper.make_tensor_value_info(name, elem, [f"{name}_{i}" for i in range(arr.ndim)]))
        names.append(name)
    first = value_infos[0].type.tensor_type
    out_shape = [f"Y_{i}" for i in range(len(first.shape.dim))]  # every op keeps its first input's rank
    node = helper.make_node(op, names, ["Y"], domain=DOMAIN, **attrs)
    graph = helper.make_graph([node], op, value_infos, [helper.make_tensor_value_info("Y", first.elem_type, out_shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    attach_functions(model)
    return model


def example_inputs(op: str, shape: Sequence[int], dtype: Any = np.float32, rng: np.random.Generator | None = None, **attrs: Any) -> list[np.ndarray | None]:
    """Random inputs for `op` given the main input's shape.

    shape: X's shape for the norms and BiasAct; for FusedMHA (batch, q_seq, k_seq, hidden),
    plus a mask when attrs has ``mask=True`` (not an op attribute). Each op's `example_fn`
    (in `deployfuse/ops/defs/<op>.py`) says what it makes.
    """
    spec = SPECS.get(op)
    if spec is None:
        raise ValueError(f"unknown deployfuse op {op!r}")
    rng = rng or np.random.default_rng()

    def rand(*dims: int, scale: float = 1.0, shift: float = 0.0) -> np.ndarray:
        return (rng.standard_normal(dims, dtype=np.float32) * scale + shift).astype(dtype)

    return spec.example_fn(shape, rand, attrs)
