"""The inputs a comparison runs on, checked against the ONNX graph before anything runs.

Shapes come from `--input` specs, else `--example-inputs` / the model's own example inputs
(whose values are used as given), else the ONNX graph's inputs when all their dimensions are
fixed. With `--dynamic`, a second feed at other sizes of those axes checks the dynamic graph.
Values sent to ONNX backends take the graph's input dtype.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import torch
from onnx import helper

from deployfuse.errors import UsageError
from deployfuse.inputs import DynamicAxis, InputSpec, Inputs, make_inputs, mask_like, resized, specs_of
from deployfuse.loading import LoadedModel, given_inputs
from deployfuse.verify import to_numpy

Feed = dict[str, np.ndarray]


def graph_inputs(model: onnx.ModelProto) -> dict[str, tuple[np.dtype, tuple[int | str, ...]]]:
    """The ONNX graph's runtime inputs (initializers excluded): name -> (dtype, dims; str = symbolic)."""
    weights = {t.name for t in model.graph.initializer}
    found = {}
    for value in model.graph.input:
        if value.name in weights:
            continue
        tensor = value.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor.shape.dim)
        found[value.name] = (np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type)), dims)
    return found


def first_inputs(loaded: LoadedModel, onnx_inputs: Mapping[str, tuple[np.dtype, tuple]], specs: Sequence[InputSpec], example_inputs: Any, seed: int | None) -> Inputs:
    """The first feed's tensors (see the module docstring for where they come from)."""
    given = given_inputs(loaded, specs, example_inputs, seed)
    if given is not None:
        return given
    symbolic = {n: d for n, (_, d) in onnx_inputs.items() if any(isinstance(x, str) for x in d)}
    if symbolic:
        needed = ", ".join(f"{n}[{','.join(map(str, d))}]" for n, d in symbolic.items())
        raise UsageError(f"the ONNX inputs have dynamic sizes: give --input NAME:SHAPE[:DTYPE] for {needed}")
    fixed = [InputSpec(n, tuple(int(x) for x in d), torch.from_numpy(np.zeros((), dtype)).dtype) for n, (dtype, d) in onnx_inputs.items()]
    return make_inputs(fixed, loaded.module, seed)


def check_fits(inputs: Inputs, onnx_inputs: Mapping[str, tuple[np.dtype, tuple]]) -> None:
    """UsageError when an ONNX input is not given or a given shape does not fit its dims."""
    missing = [n for n in onnx_inputs if n not in inputs]
    if missing:
        have = ", ".join(inputs) or "none"
        raise UsageError(f"the ONNX model needs input(s) {', '.join(missing)} (given: {have}); add --input NAME:SHAPE[:DTYPE]")
    for name, (_, dims) in onnx_inputs.items():
        shape = tuple(inputs[name].shape)
        if len(shape) != len(dims) or any(isinstance(d, int) and d > 0 and d != s for d, s in zip(dims, shape)):
            want = "x".join(str(d) for d in dims)
            raise UsageError(f"input {name} has shape {'x'.join(map(str, shape))}, but the ONNX model takes {want}")


def make_feeds(
    loaded: LoadedModel,
    onnx_model: onnx.ModelProto,
    specs: Sequence[InputSpec] = (),
    example_inputs: Any = None,
    dynamic: Sequence[DynamicAxis] = (),
    seed: int | None = None,
) -> list[Feed]:
    """One feed, plus one at resized dynamic axes when `dynamic` is given; numpy, in ONNX dtypes."""
    onnx_inputs = graph_inputs(onnx_model)
    first = first_inputs(loaded, onnx_inputs, specs, example_inputs, seed)
    unknown = [n for n in first if loaded.input_names and n not in loaded.input_names]
    if unknown:
        raise UsageError(f"--input {', '.join(unknown)}: the model's inputs are {', '.join(loaded.input_names)}")
    for d in dynamic:
        dims = onnx_inputs.get(d.name, (None, ()))[1]
        if -len(dims) <= d.axis < len(dims) and isinstance(dims[d.axis], int):
            raise UsageError(f"--dynamic {d.name}:{d.axis}:{d.label}: that axis is fixed to {dims[d.axis]} in the ONNX model")
    second = resized(specs_of(first), dynamic)
    tensors = [first] + ([make_inputs(second, loaded.module, None if seed is None else seed + 1, masks=mask_like(first))] if dynamic else [])
    feeds = []
    for inputs in tensors:
        check_fits(inputs, onnx_inputs)
        feeds.append({n: to_numpy(t).astype(onnx_inputs[n][0]) if n in onnx_inputs else to_numpy(t) for n, t in inputs.items()})
    return feeds
