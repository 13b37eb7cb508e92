"""Int8 weights run as uint8 where ONNX Runtime's u8 x s8 CPU kernels saturate (`backends.u8s8`): the same
integers, computed without the saturation, through every session deployfuse opens."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import deployfuse
from deployfuse.backends import ort as ort_backend
from deployfuse.backends.u8s8 import for_this_cpu, saturates, unsigned_weights

K, N = 64, 32


def _model(nodes, inputs, outputs, initializers) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "int8", inputs, outputs, initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)], ir_version=10)


def _weights(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An int8 [K, N] weight with values up to +-127, its per-column zero points (small, non-zero) and scales."""
    weight = rng.integers(-127, 128, (K, N)).astype(np.int8)
    return weight, rng.integers(-3, 4, N).astype(np.int8), (rng.random(N) / 100 + 1e-3).astype(np.float32)


def _integer_models(rng: np.random.Generator) -> tuple[onnx.ModelProto, dict[str, np.ndarray], np.ndarray]:
    """MatMulInteger (uint8 A, int8 B, B's zero points), DynamicQuantizeMatMul (B's zero points absent) and
    DequantizeLinear -> MatMul, side by side in one model; the feed, and each output's exact value (float64)."""
    weight, zero, scale = _weights(rng)
    a = rng.integers(0, 256, (4, K)).astype(np.uint8)
    a_zero = np.uint8(rng.integers(100, 156))
    x = rng.standard_normal((4, K)).astype(np.float32) * 3
    nodes = [helper.make_node("MatMulInteger", ["a", "w", "a_zero", "w_zero"], ["mmi"]),
             helper.make_node("DynamicQuantizeMatMul", ["x", "w2", "scale"], ["dqmm"], domain="com.microsoft"),
             helper.make_node("DequantizeLinear", ["w3", "scale", "w_zero3"], ["w_float"], axis=1),
             helper.make_node("MatMul", ["x", "w_float"], ["dq"])]
    inits = [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(zero, "w_zero"), numpy_helper.from_array(np.array(a_zero), "a_zero"),
             numpy_helper.from_array(weight, "w2"), numpy_helper.from_array(scale, "scale"),
             numpy_helper.from_array(weight, "w3"), numpy_helper.from_array(zero, "w_zero3")]
    model = _model(nodes, [helper.make_tensor_value_info("a", TensorProto.UINT8, [4, K]), helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, K])],
                   [helper.make_tensor_value_info(n, t, [4, N]) for n, t in (("mmi", TensorProto.INT32), ("dqmm", TensorProto.FLOAT), ("dq", TensorProto.FLOAT))],
                   inits)
    # DynamicQuantizeMatMul quantizes x to uint8 over its range (0 included), as DynamicQuantizeLinear defines it
    lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    x_scale = np.float32((hi - lo) / 255)
    x_zero = np.clip(np.round(-lo / x_scale), 0, 255)
    xq = np.clip(np.round(x / x_scale) + x_zero, 0, 255)
    w = weight.astype(np.float64)
    exact = {"mmi": (a.astype(np.float64) - float(a_zero)) @ (w - zero),
             "dqmm": ((xq - x_zero) @ w) * float(x_scale) * scale.astype(np.float64),
             "dq": x.astype(np.float64) @ ((w - zero) * scale.astype(np.float64))}
    return model, {"a": a, "x": x}, exact


def _run(model: onnx.ModelProto | bytes, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    payload = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    session = ort.InferenceSession(payload, options, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want))


def test_unsigned_weights_compute_the_same_integers_without_saturating():
    model, feed, exact = _integer_models(np.random.default_rng(0))
    unsigned = unsigned_weights(model)
    assert unsigned is not None
    types = {t.name: t.data_type for t in unsigned.graph.initializer}
    assert all(types[name] == TensorProto.UINT8 for name in ("w", "w_zero", "w2", "w3", "w_zero3")), types
    added = [n.input[3] for n in unsigned.graph.node if n.op_type == "DynamicQuantizeMatMul"]
    assert added[0] and numpy_helper.to_array(next(t for t in unsigned.graph.initializer if t.name == added[0])).tolist() == [128] * N
    got = _run(unsigned, feed)
    assert np.array_equal(got["mmi"], exact["mmi"].astype(np.int32))  # integers: exactly
    assert _rel(got["dqmm"], exact["dqmm"]) < 1e-5 and _rel(got["dq"], exact["dq"]) < 1e-5
    stored = _run(model, feed)  # as stored: exact too where the CPU's kernels do not saturate
    assert np.array_equal(stored["mmi"], got["mmi"]) or saturates()


def test_the_probe_says_what_a_dynamic_int8_layer_shows():
    """On ordinary data (a random layer, random activations) the stored int8 layer is far off exactly where
    `saturates()` says so; the unsigned one is close everywhere."""
    rng = np.random.default_rng(1)
    weight, _, scale = _weights(rng)
    x = rng.standard_normal((8, K)).astype(np.float32)
    model = _model([helper.make_node("DynamicQuantizeMatMul", ["x", "w", "scale"], ["y"], domain="com.microsoft")],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, K])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, N])],
                   [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(scale, "scale")])
    want = x.astype(np.float64) @ (weight.astype(np.float64) * scale)
    stored, unsigned = _rel(_run(model, {"x": x})["y"], want), _rel(_run(unsigned_weights(model), {"x": x})["y"], want)
    assert unsigned < 1e-2
    assert (stored > 5 * unsigned) == saturates(), (stored, unsigned, saturates())


def test_every_deployfuse_session_runs_the_integers_exactly(tmp_path):
    model, feed, exact = _integer_models(np.random.default_rng(2))
    got = ort_backend.run(ort_backend.session(model), feed)
    assert np.array_equal(got["mmi"], exact["mmi"].astype(np.int32)) and _rel(got["dqmm"], exact["dqmm"]) < 1e-5
    path = tmp_path / "int8.onnx"
    onnx.save(model, path)
    runtime = deployfuse.InferenceSession(path, providers=["CPUExecutionProvider"])
    assert np.array_equal(runtime.run(["mmi"], feed)[0], exact["mmi"].astype(np.int32))
    assert onnx.load(path).graph.initializer[0].data_type == TensorProto.INT8  # the artefact stays as stored


def test_a_weight_read_by_another_node_stays_with_every_reader():
    """`w` is also read by a Cast (an int8 value there): neither it nor the GEMMs reading it change; `v`, read by
    GEMMs only, does, inside an If branch too (the gate's switchboard holds its GEMMs there)."""
    rng = np.random.default_rng(3)
    weight, zero, scale = _weights(rng)
    branch = helper.make_graph([helper.make_node("DynamicQuantizeMatMul", ["x", "v", "scale"], ["y_then"], domain="com.microsoft")], "then", [],
                               [helper.make_tensor_value_info("y_then", TensorProto.FLOAT, [4, N])])
    other = helper.make_graph([helper.make_node("MatMul", ["x", "x_t"], ["y_else"])], "else", [], [helper.make_tensor_value_info("y_else", TensorProto.FLOAT, [4, 4])])
    nodes = [helper.make_node("DynamicQuantizeMatMul", ["x", "w", "scale"], ["y"], domain="com.microsoft"),
             helper.make_node("Cast", ["w"], ["w_float"], to=TensorProto.FLOAT),
             helper.make_node("Transpose", ["x"], ["x_t"]),
             helper.make_node("If", ["flag"], ["z"], then_branch=branch, else_branch=other)]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, K]), helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, N]), helper.make_tensor_value_info("w_float", TensorProto.FLOAT, [K, N]),
                    helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
                   [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(weight, "v"), numpy_helper.from_array(scale, "scale")])
    unsigned = unsigned_weights(model)
    types = {t.name: t.data_type for t in unsigned.graph.initializer}
    assert types["w"] == TensorProto.INT8 and types["v"] == TensorProto.UINT8
    assert len(unsigned.graph.node[0].input) == 3  # the GEMM on w keeps its (absent) zero point
    x = rng.standard_normal((4, K)).astype(np.float32)
    got = _run(unsigned, {"x": x, "flag": np.array(True)})
    assert np.array_equal(got["w_float"], weight.astype(np.float32))
    want = x.astype(np.float64) @ (weight.astype(np.float64) * scale)
    assert _rel(got["z"], want) < 1e-2


def test_seven_bit_weights_keep_the_faster_signed_kernels_and_stay_exact():
    """|w| <= 64 (ONNX Runtime's reduce_range) cannot saturate: 255 * (64 + 64) < 32768. Such a weight stays int8, and the
    stored model computes the exact integers on any CPU."""
    rng = np.random.default_rng(5)
    a = rng.integers(0, 256, (4, K)).astype(np.uint8)
    weight = rng.integers(-64, 65, (K, N)).astype(np.int8)
    weight[:2, :] = 64  # the largest pair of products: 255 * 64 * 2 = 32640
    a[:, :2] = 255
    model = _model([helper.make_node("MatMulInteger", ["a", "w"], ["y"])], [helper.make_tensor_value_info("a", TensorProto.UINT8, [4, K])],
                   [helper.make_tensor_value_info("y", TensorProto.INT32, [4, N])], [numpy_helper.from_array(weight, "w")])
    assert unsigned_weights(model) is None
    got = ort_backend.run(ort_backend.session(model), {"a": a})["y"]
    assert np.array_equal(got, a.astype(np.int64) @ weight.astype(np.int64))


@pytest.mark.parametrize("providers", [["CUDAExecutionProvider"], ["CPUExecutionProvider"]])
def test_models_without_int8_weights_or_without_the_cpu_pass_through(providers):
    model, _, _ = _integer_models(np.random.default_rng(4))
    if providers == ["CUDAExecutionProvider"]:
        assert for_this_cpu(model, providers) is model  # no CPU kernel runs it: nothing to do
    plain = _model([helper.make_node("Relu", ["x"], ["y"])], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], [])
    assert for_this_cpu(plain, providers) is plain
