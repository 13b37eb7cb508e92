"""quantize.speed_precision: an Fp8GemmAct slower than its float GemmAct on the GPU goes back to fp16 (`--autotune`, ort-cuda).

On a hand-built fp16 graph (fresh random inputs, ONNX Runtime's CPU EP with optimisations off, the function bodies and the
custom-op library's CPU kernels): the reverted nodes compute act(X dq(W) + Bias) from X itself, so they are at least as
close to the float weights' result as the fp8 nodes (no rounding of X to float8), the other nodes are unchanged, and a GEMM
reading a SkipLayerNormFp8's YQ is never reverted. The decision is checked on given times; the measurement needs a GPU,
so here the export says why nothing was timed and changes nothing.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper

from deployfuse.backends.ort import run, session
from deployfuse.ops import attach_functions, ort_custom_ops_library
from deployfuse.ops.defs import fp8_gemm_act
from deployfuse.ops.schema import apply_activation
from deployfuse.quantize.speed_precision import PrecisionTiming, choose_precision, revertible, slower_in_fp8, to_float_gemm
from deployfuse.rewrite import gemm_tuning
from deployfuse.rewrite.rules import fp8_norm
from deployfuse.targets import MS

HIDDEN = 32
GEMMS = {  # output: (X, activation); g0/g1 read the norm (YQ after fp8_norm), g2 the graph input, g3 a GEMM's output
    "g0": ("y", "gelu_tanh"), "g1": ("y", "none"), "g2": ("x", "none"), "g3": ("g0", "relu")}


def _fp8_graph(rng: np.random.Generator) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """x [2, 5, HIDDEN] fp16 -> LayerNorm -> g0, g1; g2 on x; g3 on g0 (attention's output projection's place): Fp8GemmAct
    nodes with per-tensor scales, the norm's readers fused into a SkipLayerNormFp8 (`fp8_norm`). Also returns each GEMM's
    float32 weight [N, K] before its quantization."""
    inits = [numpy_helper.from_array(np.ones(HIDDEN, np.float16), "gamma"), numpy_helper.from_array(np.zeros(HIDDEN, np.float16), "beta")]
    nodes = [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-5)]
    weights = {}
    for name, (x, act) in GEMMS.items():
        weight = rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32) / np.sqrt(HIDDEN)
        w_scale = np.float32(np.abs(weight).max() / 448)
        x_scale = np.float32(4.0 / 448)  # |X| up to 4: the norm's output and the fresh inputs, a few saturating
        weights[name] = weight
        inits += [numpy_helper.from_array(np.array(x_scale), f"{name}_xs"), numpy_helper.from_array(np.array(w_scale), f"{name}_ws"),
                  numpy_helper.from_array(fp8_gemm_act.to_element_type(weight / w_scale, "float8e4m3fn"), f"{name}_w"),
                  numpy_helper.from_array((0.1 * rng.standard_normal(HIDDEN)).astype(np.float16), f"{name}_b")]
        nodes.append(helper.make_node("Fp8GemmAct", [x, f"{name}_xs", f"{name}_w", f"{name}_ws", f"{name}_b"], [name], name=f"gemm_{name}",
                                      domain="deployfuse", activation=act))
    f16 = onnx.TensorProto.FLOAT16
    graph = helper.make_graph(nodes, "fp8_gemms", [helper.make_tensor_value_info("x", f16, [2, 5, HIDDEN])],
                              [helper.make_tensor_value_info(o, f16, None) for o in GEMMS], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid(MS, 1)], ir_version=10)
    fused, count, refused = fp8_norm.fuse(model, "ort-cuda")
    assert (count, refused) == (1, [])
    attach_functions(fused)
    return fused, weights


def _library_only(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` without its deployfuse function bodies: only the custom-op library's CPU kernels can run its nodes."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.functions[:]
    return out


def _run(model: onnx.ModelProto, feed: dict[str, np.ndarray], kernels: str) -> dict[str, np.ndarray]:
    if kernels == "bodies":
        return run(session(model, optimize=False), feed)
    return run(session(_library_only(model), optimize=False, custom_ops_library=ort_custom_ops_library()), feed)


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want))


def test_only_gemms_with_their_own_quantize_pass_are_revertible():
    model, _ = _fp8_graph(np.random.default_rng(0))
    readers = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "Fp8GemmAct"}
    assert readers["g0"] == readers["g1"] != "y"  # both read the norm's YQ (float8): no quantize pass of their own
    assert sorted(revertible(model)) == ["g2", "g3"]
    with pytest.raises(ValueError, match="g0"):
        to_float_gemm(model, ["g0", "g2"])


@pytest.mark.parametrize("kernels", ["bodies", "library"])
def test_reverted_gemms_skip_x_rounding_and_leave_the_rest_unchanged(kernels):
    """g2 and g3 reverted: each computes act(X (float(Wq) WScale)^T + Bias) from its X in fp16, at least as close to the
    float32 weights' result as the fp8 node (whose X is rounded to float8 too); the GEMMs reading YQ compute what they did."""
    rng = np.random.default_rng()
    model, weights = _fp8_graph(rng)
    reverted = to_float_gemm(model, ["g2", "g3"])
    attach_functions(reverted)
    ops = {n.output[0]: n.op_type for n in reverted.graph.node if n.output[0] in GEMMS}
    assert ops == {"g0": "Fp8GemmAct", "g1": "Fp8GemmAct", "g2": "GemmAct", "g3": "GemmAct"}
    before = {n.output[0]: n for n in model.graph.node}
    assert all(n == before[n.output[0]] for n in reverted.graph.node if n.output[0] not in ("g2", "g3"))
    inits = {t.name for t in reverted.graph.initializer}
    assert not {"g2_xs", "g2_w", "g2_ws", "g3_xs", "g3_w", "g3_ws"} & inits and {"g0_w", "g2_b"} <= inits  # what no node reads is gone
    feed = {"x": (1.5 * rng.standard_normal((2, 5, HIDDEN))).astype(np.float16)}
    fp8, ours = _run(model, feed, kernels), _run(reverted, feed, kernels)
    for name in ("g0", "g1"):
        np.testing.assert_array_equal(ours[name], fp8[name], err_msg=name)
    bias = {t.name: numpy_helper.to_array(t).astype(np.float32) for t in model.graph.initializer if t.name.endswith("_b")}
    stored = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for name, x in (("g2", feed["x"]), ("g3", fp8["g0"])):  # g3's X is g0, the same in both models
        act = GEMMS[name][1]
        x32 = torch.from_numpy(x.astype(np.float32))
        dequantized = stored[f"{name}_w"].astype(np.float32) * stored[f"{name}_ws"]
        exact = apply_activation(x32 @ torch.from_numpy(dequantized).T + torch.from_numpy(bias[f"{name}_b"]), act).double().numpy()
        floats = apply_activation(x32 @ torch.from_numpy(weights[name]).T + torch.from_numpy(bias[f"{name}_b"]), act).double().numpy()
        assert _rel(ours[name], exact) < 2e-3, (name, _rel(ours[name], exact))  # the same math, fp16 rounding apart
        assert _rel(ours[name], floats) <= _rel(fp8[name], floats), (name, _rel(ours[name], floats), _rel(fp8[name], floats))
        assert _rel(fp8[name], exact) > 2 * _rel(ours[name], exact), name  # the fp8 node did round X: the check can tell them apart


def test_bf16_weights_are_the_dequantized_weight_transposed_and_rounded():
    """The reverted GemmAct's W is in Bias's type: bfloat16 for a bf16 graph (its values checked; ORT's CPU EP has no bf16 MatMul)."""
    model, _ = _fp8_graph(np.random.default_rng(1))
    for t in model.graph.initializer:
        if t.name.endswith("_b"):
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32).astype(helper.tensor_dtype_to_np_dtype(onnx.TensorProto.BFLOAT16)), t.name))
    reverted = to_float_gemm(model, ["g2"])
    node = next(n for n in reverted.graph.node if n.output[0] == "g2")
    stored = {t.name: t for t in [*model.graph.initializer, *reverted.graph.initializer]}
    w = stored[node.input[1]]
    want = (numpy_helper.to_array(stored["g2_w"]).astype(np.float32) * numpy_helper.to_array(stored["g2_ws"])).T
    assert w.data_type == onnx.TensorProto.BFLOAT16 and list(w.dims) == [HIDDEN, HIDDEN]
    np.testing.assert_array_equal(numpy_helper.to_array(w), want.astype(numpy_helper.to_array(w).dtype))
    assert helper.get_attribute_value(next(a for a in node.attribute if a.name == "activation")) == b"none" and len(node.input) == 3


def test_a_gemm_goes_back_to_fp16_only_when_faster_by_more_than_the_margin():
    m = gemm_tuning.MARGIN
    timings = {
        "slower": PrecisionTiming(0.0193 + 0.0094, 0.0176),  # attention's output projection at 8192 rows (H200): fp8 + quantize vs fp16
        "faster": PrecisionTiming(0.050, 0.080),
        "within_margin": PrecisionTiming(0.100, 0.100 * (1 - m / 2)),
        "just_past": PrecisionTiming(0.100, 0.100 * (1 - 2 * m)),
        "untimed": PrecisionTiming(math.nan, math.nan, "cuBLASLt has no algorithm"),
    }
    assert slower_in_fp8(timings) == ["slower", "just_past"]
    assert slower_in_fp8(timings, margin=0.0) == ["slower", "within_margin", "just_past"]


def test_choose_precision_without_a_gpu_changes_nothing_and_says_why(tmp_path):
    model, _ = _fp8_graph(np.random.default_rng(2))
    feed = {"x": np.random.default_rng().standard_normal((2, 5, HIDDEN)).astype(np.float16)}
    library = tmp_path / "libdeployfuse_ops_cuda.so"  # never built here: also what a GPU machine without the build says
    shipped, done = choose_precision(model, feed, library)
    why = gemm_tuning.not_tunable(library)
    assert why is not None and shipped is model and not done.reverted
    assert done.line == f"Fp8GemmAct precision not timed against fp16: {why.split(' (')[0]} (all 2 kept in fp8)", done.line
