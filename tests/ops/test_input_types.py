"""Inputs of a fixed element type (`OpSpec.input_types`): the spec refuses names and types it
cannot honour, example inputs come in those types from numpy and torch callers alike, the
one-node models declare them and refuse an input of another type."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
import torch

from deployfuse.ops.defs import bias_act
from deployfuse.ops.models import example_inputs, single_op_model
from deployfuse.ops.schema import FIXED_TYPES, to_element_type
from deployfuse.ops.specs import SPECS

FIXED = [name for name, spec in SPECS.items() if spec.input_types]
T_TYPES = {np.float32: onnx.TensorProto.FLOAT, np.float16: onnx.TensorProto.FLOAT16}


def _first_case(op: str) -> tuple[tuple[int, ...], dict, dict]:
    """The op's first case whose example gives every fixed-type input (FusedMHA's YScale: a YQ case): its shape, the keys
    describing its inputs and its attributes."""
    from tests.ops.cases import CASES, YQ_CASES

    spec = SPECS[op]
    for _, shape, attrs in (c for c in CASES + YQ_CASES if c[0] == op):
        xs = spec.example_fn(shape, lambda *s, scale=1.0, shift=0.0: np.ones(s, np.float32), attrs)
        if all(x is not None for name, x in zip(spec.inputs, xs) if name in spec.input_types):
            return shape, {k: v for k, v in attrs.items() if k not in spec.attrs}, {k: v for k, v in attrs.items() if k in spec.attrs}
    raise AssertionError(f"{op}: no case gives its fixed-type inputs {sorted(spec.input_types)}")


@pytest.mark.parametrize("bad,why", [
    ({"Nope": "float"}, "input_types names 'Nope', not one of its inputs after the first"),
    ({"X": "float"}, "input_types names 'X'"),  # the first input carries T, the outputs' type
    ({"Bias": "int4"}, "input Bias has element type 'int4'; fixed types"),
])
def test_spec_refuses_input_types_it_cannot_honour(bad, why):
    with pytest.raises(ValueError, match=why):
        dataclasses.replace(bias_act.SPEC, input_types=bad)


def test_fixed_type_ops_exist():
    assert FIXED, "an op with input_types is registered (Fp8GemmAct), so the tests below test something"


@pytest.mark.parametrize("op", FIXED)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_example_inputs_and_models_carry_the_fixed_types(op, dtype):
    spec = SPECS[op]
    shape, described, attrs = _first_case(op)
    xs = example_inputs(op, shape, dtype=dtype, **described)
    model = single_op_model(op, xs, opset=max(20, spec.min_opset), **attrs)
    declared = {vi.name: vi.type.tensor_type.elem_type for vi in model.graph.input}
    for name, x in zip(spec.inputs, xs):
        if x is None:  # an absent optional input (SkipLayerNormFp8's Skip)
            continue
        fixed = spec.input_types.get(name)
        want = FIXED_TYPES[fixed][0] if fixed else T_TYPES[dtype]
        assert onnx.helper.np_dtype_to_tensor_dtype(x.dtype) == want, name
        assert declared[name] == want, name
    assert model.graph.output[0].type.tensor_type.elem_type == T_TYPES[dtype]


@pytest.mark.parametrize("op", FIXED)
def test_example_inputs_from_torch_callers_carry_the_fixed_types(op):
    """bench/ops_gpu.py builds the same example inputs from torch tensors."""
    spec = SPECS[op]
    shape, described, _ = _first_case(op)
    xs = spec.example_fn(shape, lambda *s, scale=1.0, shift=0.0: (torch.randn(*s) * scale + shift).to(torch.bfloat16), described)
    for name, x in zip(spec.inputs, xs):
        if x is None:  # an absent optional input
            continue
        fixed = spec.input_types.get(name)
        assert x.dtype == (FIXED_TYPES[fixed][1] if fixed else torch.bfloat16), name


@pytest.mark.parametrize("op", FIXED)
def test_model_refuses_an_input_of_another_type(op):
    spec = SPECS[op]
    shape, described, _ = _first_case(op)
    xs = example_inputs(op, shape, **described)
    name = next(iter(spec.input_types))
    i = spec.inputs.index(name)
    wrong = np.float16 if xs[i].dtype == np.float32 else np.float32
    xs[i] = xs[i].astype(wrong)
    with pytest.raises(ValueError, match=f"input {name} has dtype {np.dtype(wrong).name}; it takes {spec.input_types[name]}"):
        single_op_model(op, xs)


def test_float8_conversion_saturates_and_agrees_between_numpy_and_torch():
    """to_element_type: ml_dtypes (numpy) and torch give the same float8 codes, ±448 past the range."""
    rng = np.random.default_rng()
    values = np.concatenate([rng.standard_normal(4096).astype(np.float32) * 300, [464.0, 465.0, -1e6, 1e-9]]).astype(np.float32)
    from_numpy = to_element_type(values, "float8e4m3fn")
    from_torch = to_element_type(torch.from_numpy(values), "float8e4m3fn")
    assert np.array_equal(from_numpy.view(np.uint8), from_torch.view(torch.uint8).numpy())
    assert np.abs(from_numpy.astype(np.float32)).max() == 448.0 and not np.isnan(from_numpy.astype(np.float32)).any()
