"""The ONNX function bodies: valid ONNX at every supported opset, and ONNX Runtime running a
deployfuse node with no library loaded matches the PyTorch reference."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from deployfuse.backends.ort import run, session
from deployfuse.ops import SPECS, attach_functions
from deployfuse.ops.models import example_inputs, ort_feed, reference_output, single_op_model
from tests.ops.cases import CASES, case_id, draw


def _run_case(case, opset: int, dtype=np.float32):
    op, shape, attrs = case
    attrs = dict(attrs)
    xs = draw(op, shape, dtype=dtype, **attrs)
    attrs.pop("mask", None)
    model = single_op_model(op, xs, opset=opset, **attrs)
    onnx.checker.check_model(model, full_check=True)
    got = run(session(model, optimize=False), ort_feed(op, xs))["Y"]
    return got, reference_output(op, xs, **attrs)


@pytest.mark.parametrize("opset", [17, 20, 23])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_function_body_matches_reference(case, opset):
    min_opset = SPECS[case[0]].min_opset
    if opset < min_opset:  # an op newer than the opset (Fp8GemmAct: 19) is refused in one line instead
        with pytest.raises(ValueError, match=f"{case[0]} needs ONNX opset >= {min_opset}; the model uses {opset}"):
            _run_case(case, opset)
        return
    got, ref = _run_case(case, opset)
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_function_body_float16():
    for case in CASES[::3] + [c for c in CASES if SPECS[c[0]].input_types][:1]:  # every third case, one with fixed-type inputs
        got, ref = _run_case(case, 20, np.float16)
        assert got.dtype == np.float16
        np.testing.assert_allclose(got.astype(np.float32), ref.astype(np.float32), rtol=2e-2, atol=2e-2)


def _two_bias_acts(opset: int = 20) -> onnx.ModelProto:
    h = onnx.helper
    nodes = [
        h.make_node("BiasAct", ["x", "b"], ["r"], domain="deployfuse", activation="relu"),
        h.make_node("BiasAct", ["r", "b"], ["y"], domain="deployfuse", activation="sigmoid"),
    ]
    vi = [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 6]), h.make_tensor_value_info("b", onnx.TensorProto.FLOAT, [6])]
    graph = h.make_graph(nodes, "g", vi, [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 6])])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", opset)], ir_version=8)


def test_attach_functions_mixed_variants_and_idempotent():
    model = _two_bias_acts()
    attach_functions(model)
    attach_functions(model)
    assert sorted(f.overload for f in model.functions) == ["activation=relu", "activation=sigmoid"]
    assert model.ir_version >= 10 and any(i.domain == "deployfuse" for i in model.opset_import)
    x, b = np.random.randn(5, 6).astype(np.float32), np.random.randn(6).astype(np.float32)
    got = run(session(model, optimize=False), {"x": x, "b": b})["y"]
    ref = torch.sigmoid(torch.relu(torch.from_numpy(x + b)) + torch.from_numpy(b)).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_attach_functions_rejects_bad_nodes():
    model = _two_bias_acts()
    model.graph.node[0].attribute[0].s = b"tanh"
    with pytest.raises(ValueError, match="activation='tanh' is not one of"):
        attach_functions(model)
    model = _two_bias_acts(opset=16)
    with pytest.raises(ValueError, match="opset >= 17"):
        attach_functions(model)
    model = _two_bias_acts()
    model.graph.node[0].op_type = "Nope"
    with pytest.raises(ValueError, match="unknown deployfuse op 'Nope'"):
        attach_functions(model)


def test_draws_keep_fp8_mlp_hidden_values_off_float8_ties():
    """`fp8_mlp.hidden_ties` counts a hidden value put on a tie between two float8 values (through B1) and not one put half a
    float8 step away, on the float8 value: so `draw` can keep the body-vs-reference checks above off ties."""
    from deployfuse.ops.defs import fp8_mlp
    from deployfuse.ops.schema import to_element_type

    xs = example_inputs("Fp8Mlp", (1, 16, 16, 8), activation="none")
    x, x_scale, w1, w1_scale, b1, h_scale = xs[:6]
    x_dq = to_element_type(x / x_scale, "float8e4m3fn").astype(np.float64) * float(x_scale)
    first = float(x_dq[0] @ (w1[0].astype(np.float64) * float(w1_scale)))  # the first hidden value without its bias
    step = 2.0 ** (np.floor(np.log2(10.0)) - 3)  # e4m3's spacing in [8, 16)
    counts = {}
    for where, v in (("tie", 10.0 + step / 2), ("value", 10.0 + step)):
        b1[0] = np.float32(v * float(h_scale) - first)
        counts[where] = fp8_mlp.hidden_ties(xs, "none")
    assert counts["tie"] == counts["value"] + 1, counts
