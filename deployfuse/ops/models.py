"""One-node ONNX models around a deployfuse op, and example inputs for them.

The tests, the GPU checks and the benchmarks all run the ops this way: one node, its function
body attached, inputs with symbolic shapes so one model serves every size. Inputs of a fixed
element type (`OpSpec.input_types`: float8e4m3fn as `ml_dtypes.float8_e4m3fn` arrays) and
bfloat16 ones travel through `ort_feed` and `torch_inputs`, since neither ONNX Runtime's nor
torch's numpy bridge takes ml_dtypes' types.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import torch
from onnx import helper

from deployfuse.ops.functions import attach_functions
from deployfuse.ops.schema import DOMAIN, FIXED_TYPES
from deployfuse.ops.specs import SPECS

_FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE)
_TYPE_NAMES = {onnx_type: name for name, (onnx_type, _) in FIXED_TYPES.items()}


def _element_type(arr: np.ndarray) -> int | None:
    try:
        return helper.np_dtype_to_tensor_dtype(arr.dtype)
    except (KeyError, ValueError, TypeError):
        return None


_ML_TO_TORCH = {"bfloat16": torch.bfloat16, "float8_e4m3fn": torch.float8_e4m3fn}
"""The `ml_dtypes` numpy types the ops take, by numpy name, as torch dtypes."""


def single_op_model(
    op: str, inputs: Sequence[np.ndarray | None], opset: int = 20, outputs: dict[str, int] | None = None, **attrs: Any
) -> onnx.ModelProto:
    """A model computing `op` on graph inputs named like the spec's inputs (None = omitted
    optional input, named "" before a present one), every dimension symbolic, with its function
    body attached.

    bfloat16 and float8 inputs may be given as `ml_dtypes` arrays. An input of a fixed element
    type (`OpSpec.input_types`) must have it; the others take a float type. outputs: the outputs
    the node writes, by spec name, with their element types (the others named "", as a rewrite
    leaves them); by default Y in the first input's type.
    """
    spec = SPECS[op]
    value_infos = []
    for name, arr in zip(spec.inputs, inputs):
        if arr is None:
            continue
        elem = _element_type(arr)
        fixed = spec.input_types.get(name)
        if elem is None or (_TYPE_NAMES.get(elem) != fixed if fixed else elem not in _FLOAT_TYPES):
            raise ValueError(f"{op}: input {name} has dtype {arr.dtype}; it takes {fixed or 'a float type'}")
        value_infos.append(helper.make_tensor_value_info(name, elem, [f"{name}_{i}" for i in range(arr.ndim)]))
    names = [name if arr is not None else "" for name, arr in zip(spec.inputs, inputs)]
    first = value_infos[0].type.tensor_type
    outputs = outputs or {spec.outputs[0]: first.elem_type}
    rank = len(first.shape.dim)  # every op keeps its first input's rank
    node = helper.make_node(op, names, [name if name in outputs else "" for name in spec.outputs], domain=DOMAIN, **attrs)
    graph = helper.make_graph([node], op, value_infos, [helper.make_tensor_value_info(name, elem, [f"{name}_{i}" for i in range(rank)])
                                                        for name, elem in outputs.items()])
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


def ort_feed(op: str, inputs: Sequence[np.ndarray | None]) -> dict[str, Any]:
    """The feed of `single_op_model(op, inputs)` for ONNX Runtime: arrays by input name, the
    `ml_dtypes` ones (float8, bfloat16) as OrtValues over their bytes (ORT's numpy bridge has
    neither type)."""
    import onnxruntime as ort

    feed: dict[str, Any] = {}
    for name, arr in zip(SPECS[op].inputs, inputs):
        if arr is None:
            continue
        if arr.dtype.kind == "V":  # ml_dtypes' types are numpy "void" kinds to numpy itself
            feed[name] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(_bits(arr), _element_type(arr))
        else:
            feed[name] = arr
    return feed


def torch_inputs(inputs: Sequence[np.ndarray | None]) -> list[torch.Tensor | None]:
    """The arrays as torch tensors of the same dtype (the `ml_dtypes` ones through their bytes)."""
    tensors: list[torch.Tensor | None] = []
    for arr in inputs:
        if arr is not None and arr.dtype.kind == "V":
            tensors.append(torch.from_numpy(_bits(arr)).view(_ML_TO_TORCH[arr.dtype.name]))
        else:
            tensors.append(None if arr is None else torch.from_numpy(arr))
    return tensors


def _bits(arr: np.ndarray) -> np.ndarray:
    """An `ml_dtypes` array's bytes as unsigned integers of its width, which both bridges take."""
    return np.ascontiguousarray(arr).view(f"uint{8 * arr.dtype.itemsize}")


def reference_output(op: str, inputs: Sequence[np.ndarray | None], **attrs: Any) -> np.ndarray:
    """The op's PyTorch reference on numpy inputs (float8 and bfloat16 ones included), as a numpy
    array of the first input's dtype."""
    y = SPECS[op].reference(*torch_inputs(inputs), **attrs)
    first = next(x for x in inputs if x is not None)
    return y.numpy() if first.dtype.kind != "V" else y.float().numpy().astype(first.dtype)
