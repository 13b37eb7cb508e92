"""What a served artefact takes and returns: tensor names, dtypes, dims, and its batch axis.

Read from the ONNX graph (dynamic axes are labels) or from a TensorRT engine (dynamic axes are
-1, bounded by its optimisation profile). A model has a batch axis when axis 0 of every input
and output is dynamic and the inputs agree on its label: only then may a server stack requests.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from deployfuse.engine.profiles import export_shapes
from deployfuse.errors import UsageError, first_line
from deployfuse.io import load_onnx

# A dim: an int for a static axis, a label (or None when unnamed) for a dynamic one.
Dim = int | str | None

# ONNX element type -> Triton data type (without the TYPE_ prefix).
TRITON_TYPES: dict[int, str] = {
    onnx.TensorProto.FLOAT: "FP32", onnx.TensorProto.FLOAT16: "FP16", onnx.TensorProto.BFLOAT16: "BF16",
    onnx.TensorProto.DOUBLE: "FP64", onnx.TensorProto.INT64: "INT64", onnx.TensorProto.INT32: "INT32",
    onnx.TensorProto.INT16: "INT16", onnx.TensorProto.INT8: "INT8", onnx.TensorProto.UINT8: "UINT8",
    onnx.TensorProto.UINT16: "UINT16", onnx.TensorProto.UINT32: "UINT32", onnx.TensorProto.UINT64: "UINT64",
    onnx.TensorProto.BOOL: "BOOL", onnx.TensorProto.STRING: "STRING",
}


@dataclass(frozen=True)
class TensorSpec:
    """One input or output: its name, ONNX element type and dims."""

    name: str
    elem_type: int
    dims: tuple[Dim, ...]

    @property
    def triton_type(self) -> str:
        """Triton's name for the dtype, e.g. TYPE_FP32."""
        if self.elem_type not in TRITON_TYPES:
            raise UsageError(f"tensor {self.name!r} has ONNX type {onnx.TensorProto.DataType.Name(self.elem_type)}, which Triton cannot serve")
        return "TYPE_" + TRITON_TYPES[self.elem_type]

    @property
    def numpy_dtype(self):  # -> numpy.dtype
        """The numpy dtype of the tensor."""
        import numpy as np

        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(self.elem_type))


@dataclass(frozen=True)
class Signature:
    """Inputs and outputs of an artefact, with example shapes when the export recorded them."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    example_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    # TensorRT engines: the largest batch their profile allows (None: unbounded or unknown).
    max_batch: int | None = None

    @property
    def has_batch_axis(self) -> bool:
        """Axis 0 of every tensor is dynamic and the inputs share one label for it."""
        tensors = self.inputs + self.outputs
        if not tensors or any(not t.dims or isinstance(t.dims[0], int) for t in tensors):
            return False
        labels = {t.dims[0] for t in self.inputs if isinstance(t.dims[0], str)}
        return len(labels) <= 1

    def example_shape(self, tensor: TensorSpec) -> tuple[int, ...]:
        """A concrete shape for `tensor`: the recorded export shape, else 1 on dynamic axes."""
        shape = self.example_shapes.get(tensor.name)
        if shape is not None and len(shape) == len(tensor.dims):
            return tuple(int(s) for s in shape)
        return tuple(d if isinstance(d, int) else 1 for d in tensor.dims)


def onnx_signature(path: str | os.PathLike[str]) -> Signature:
    """The signature of an ONNX model (weights are not loaded)."""
    return signature_of(load_onnx(path, weights=False))


def signature_of(model: onnx.ModelProto) -> Signature:
    """The signature of a loaded ONNX model."""
    initializers = {t.name for t in model.graph.initializer}

    def spec(value: onnx.ValueInfoProto) -> TensorSpec:
        dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in value.type.tensor_type.shape.dim)
        return TensorSpec(value.name, value.type.tensor_type.elem_type, dims)

    return Signature(
        inputs=tuple(spec(v) for v in model.graph.input if v.name not in initializers),
        outputs=tuple(spec(v) for v in model.graph.output),
        example_shapes=export_shapes(model),
    )


def engine_signature(path: str | os.PathLike[str]) -> Signature:
    """The signature of a serialized TensorRT engine, read by deserializing it.

    Needs a TensorRT (or TensorRT-RTX) runtime that can open the engine here: a GPU of the
    generation it was built for, and deployfuse's plugins when the engine uses them.

    Raises:
        UsageError: no runtime, or the engine cannot be opened on this machine.
    """
    from deployfuse.backends.trt import load_engine
    from deployfuse.engine import builders

    data = Path(path).read_bytes()
    errors = []
    for name in ("tensorrt", "tensorrt-rtx"):
        try:
            loaded = load_engine(data, builders.activate(name))
        except Exception as exc:  # not installed; no GPU, wrong generation, missing plugin: each raises its own type
            errors.append(f"{name}: {first_line(exc)}")
            continue
        return _signature_from_engine(loaded.trt, loaded.engine)
    raise UsageError(f"cannot read the engine's inputs and outputs here ({'; '.join(errors)}): give --onnx MODEL.onnx, the model it was built from")


def _signature_from_engine(trt, engine) -> Signature:
    inputs, outputs, max_batch = [], [], None
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        shape = tuple(int(d) for d in engine.get_tensor_shape(name))
        elem = _trt_elem_type(trt, engine.get_tensor_dtype(name))
        dims = tuple(d if d >= 0 else f"{name}_{axis}" for axis, d in enumerate(shape))
        if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT:
            if dims and not isinstance(dims[0], int):
                high = engine.get_tensor_profile_shape(name, 0)[2][0]
                max_batch = high if max_batch is None else min(max_batch, high)
            inputs.append(TensorSpec(name, elem, tuple("batch" if a == 0 and not isinstance(d, int) else d for a, d in enumerate(dims))))
        else:
            outputs.append(TensorSpec(name, elem, dims))
    return Signature(tuple(inputs), tuple(outputs), max_batch=max_batch)


def _trt_elem_type(trt, dtype) -> int:
    table = {trt.float32: onnx.TensorProto.FLOAT, trt.float16: onnx.TensorProto.FLOAT16, trt.int32: onnx.TensorProto.INT32,
             trt.int8: onnx.TensorProto.INT8, trt.bool: onnx.TensorProto.BOOL, trt.int64: onnx.TensorProto.INT64}
    if hasattr(trt, "bfloat16"):
        table[trt.bfloat16] = onnx.TensorProto.BFLOAT16
    return table[dtype]


def engine_signature_from_onnx(model: onnx.ModelProto, profiles: Mapping[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]) -> Signature:
    """The signature of an engine built from `model` with these min/opt/max profiles.

    An axis whose min equals its max is static in the engine; the largest batch is the
    smallest max of axis 0 over the inputs.
    """
    base = signature_of(model)
    inputs, highs = [], []
    for tensor in base.inputs:
        profile = profiles.get(tensor.name)
        if profile is None:
            inputs.append(tensor)
            continue
        low, _, high = profile
        dims = tuple(lo if lo == hi else d for d, lo, hi in zip(tensor.dims, low, high))
        if dims and not isinstance(dims[0], int):
            highs.append(high[0])
        inputs.append(TensorSpec(tensor.name, tensor.elem_type, dims))
    return Signature(tuple(inputs), base.outputs, base.example_shapes, max_batch=min(highs) if highs else None)
