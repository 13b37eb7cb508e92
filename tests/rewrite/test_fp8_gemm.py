"""fp8_gemm.lower: every float8 Q/DQ'd GEMM of an fp16 graph becomes a deployfuse.Fp8GemmAct
(ort-cuda only) that computes what the Q/DQ graph computes, each FC1 -> FC2 pair one Fp8Mlp; on a
graph fused as an fp8 export fuses it, attention and skip-norm stay fused around them.

Numbers are checked on fresh random inputs, ONNX Runtime's CPU EP running the Fp8GemmAct function
bodies: one GEMM against the Q/DQ math done in numpy (float64 around the same float8 values), and
whole models against their Q/DQ graph (ORT optimisations off), where the only differences are
fp16 roundings that occasionally move an activation to the next float8 value.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
import torch
import zoo
from _export import _trained_like
from onnx import TensorProto, helper, numpy_helper

import deployfuse
from deployfuse.backends.ort import run, session
from deployfuse.inputs import make_inputs, specs_of
from deployfuse.quantize.calibration import Calibration, random_calibration
from deployfuse.quantize.lowering import FP8_SKIPPED_FAMILIES
from deployfuse.quantize.qdq import place_qdq, quantizable_nodes
from deployfuse.rewrite import family_names, fuse
from deployfuse.rewrite.rules import fp8_gemm, fp8_mlp

_ROOT = tempfile.TemporaryDirectory(prefix="deployfuse-fp8-gemm-tests.")
E4M3 = ml_dtypes.float8_e4m3fn
OPSET = 20


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


# --- one GEMM, hand-built -------------------------------------------------------------------


def _gemm_graph(form: str, dtype: int = TensorProto.FLOAT16, activation: str | None = None, bias: bool = True, zero_type: int = TensorProto.FLOAT8E4M3FN,
                w_scales: int = 1, seed: int = 0) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """y = act(DQ(Q(x)) · DQ(Wq) [+ b]) as `form` "matmul" (x [2, 5, K], W [K, N]) or "gemm"
    (x [10, K], Gemm transB=1, W [N, K]), with the scales, bias and zero points in the graph's
    float type / `zero_type`; and the float values it was made from."""
    rng = np.random.default_rng(seed)
    k, n = 32, 24
    np_type = helper.tensor_dtype_to_np_dtype(dtype)
    weight = rng.standard_normal((k, n)) / np.sqrt(k)
    per = np.abs(weight).max(axis=0) if w_scales > 1 else np.abs(weight).max()
    w_scale = (per / 448).astype(np.float32)
    w_q = (weight / w_scale).astype(E4M3)
    stored = w_q if form == "matmul" else np.ascontiguousarray(w_q.T)
    zero_np = E4M3 if zero_type == TensorProto.FLOAT8E4M3FN else np.int8
    inits = [
        numpy_helper.from_array(np.array(3.0 / 448, dtype=np_type), "x_scale"),
        numpy_helper.from_array(np.array(0, dtype=zero_np), "zero"),
        numpy_helper.from_array(np.zeros(w_scale.shape, dtype=zero_np), "w_zero"),
        numpy_helper.from_array(w_scale.astype(np_type), "w_scale"),
        numpy_helper.from_array(stored.astype(zero_np) if zero_np is np.int8 else stored, "w_q"),
    ]
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_scale", "zero"], ["x_q"]), helper.make_node("DequantizeLinear", ["x_q", "x_scale", "zero"], ["x_dq"]),
             helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zero"], ["w_dq"], axis=1 if form == "matmul" else 0)]
    if bias:
        inits.append(numpy_helper.from_array((rng.standard_normal(n) * 0.1).astype(np_type), "bias"))
    if form == "matmul":
        nodes.append(helper.make_node("MatMul", ["x_dq", "w_dq"], ["mm" if bias else "lin"]))
        nodes += [helper.make_node("Add", ["mm", "bias"], ["lin"])] if bias else []
        shape = [2, 5, k]
    else:
        nodes.append(helper.make_node("Gemm", ["x_dq", "w_dq"] + (["bias"] if bias else []), ["lin"], transB=1))
        shape = [10, k]
    if activation == "relu":
        nodes.append(helper.make_node("Relu", ["lin"], ["y"]))
    elif activation is not None:
        nodes.append(helper.make_node("Gelu", ["lin"], ["y"], approximate=activation))
    else:
        nodes[-1].output[0] = "y"
    graph = helper.make_graph(nodes, "gemm", [helper.make_tensor_value_info("x", dtype, shape)], [helper.make_tensor_value_info("y", dtype, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=10)
    # The scales as the graph holds them (rounded to its float type), which the rule hands on in float32.
    return onnx.shape_inference.infer_shapes(model), {"x_scale": float(np.array(3.0 / 448, dtype=np_type)), "w_q": w_q, "w_scale": w_scale.astype(np_type).astype(np.float64)}


def _feeds(shape: list[int], count: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal(shape).astype(np.float16)} for _ in range(count)]


def _fp8_gemms(model: onnx.ModelProto) -> int:
    """The float8 GEMMs of a lowered graph: one an Fp8GemmAct, two an Fp8Mlp."""
    return _ops(model).count("Fp8GemmAct") + 2 * _ops(model).count("Fp8Mlp")


def _lower(model: onnx.ModelProto) -> onnx.ModelProto:
    lowered, count = fp8_gemm.lower(model, "ort-cuda")
    assert count == _fp8_gemms(lowered)
    return lowered


GELU_ERF_TANH_GAP = 4.8e-4
"""max |gelu_erf(y) - gelu_tanh(y)| over y (4.73e-4 at y = 2.70): the most the epilogue's tanh form
may move an exact-erf GELU."""


@pytest.mark.parametrize(("form", "activation", "bias"), [("matmul", None, True), ("matmul", "relu", True), ("matmul", "tanh", False), ("matmul", "none", True),
                                                           ("gemm", None, True), ("gemm", "tanh", True), ("gemm", "none", False), ("gemm", None, False)])
def test_one_gemm_becomes_fp8_gemm_act_computing_the_qdq_math(form, activation, bias):
    """The fused node against the Q/DQ math in float64 on the same float8 values: x/s rounded to
    e4m3 (saturating), the weight's e4m3 values times its scale, bias, activation; only the
    final fp16 rounding (and a rare x/s that fp16 and fp32 round to neighbouring e4m3 values) apart.
    An exact-erf Gelu ("none") is computed in tanh form: apart by at most GELU_ERF_TANH_GAP more."""
    model, made = _gemm_graph(form, activation=activation, bias=bias)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    fused = _lower(model)
    assert _ops(fused) == ["Fp8GemmAct"]
    node = fused.graph.node[0]
    emitted = {None: "none", "relu": "relu", "tanh": "gelu_tanh", "none": "gelu_tanh"}[activation]  # "none": exact GELU, in tanh form
    assert helper.get_attribute_value(next(a for a in node.attribute if a.name == "activation")).decode() == emitted
    weights = {t.name: numpy_helper.to_array(t) for t in fused.graph.initializer}
    assert weights[node.input[2]].dtype == E4M3 and weights[node.input[2]].shape == (24, 32)  # [N, K]
    assert {weights[node.input[i]].dtype for i in (1, 3)} == {np.dtype(np.float32)}
    plain, fast = session(model, optimize=False), session(fused)
    for feed in _feeds(shape, 2, 7):
        x = feed["x"].astype(np.float64)
        x_dq = (x / made["x_scale"]).clip(-448, 448).astype(E4M3).astype(np.float64) * made["x_scale"]
        y = x_dq @ (made["w_q"].astype(np.float64) * made["w_scale"])
        if bias:
            y = y + numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "bias")).astype(np.float64)
        if activation == "relu":
            y = np.maximum(y, 0)
        elif activation == "tanh":
            y = 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y**3)))
        elif activation == "none":
            y = torch.nn.functional.gelu(torch.from_numpy(y)).numpy()  # erf, in float64
        got, qdq = run(fast, feed)["y"].astype(np.float64), run(plain, feed)["y"].astype(np.float64)
        scale = np.abs(y).max()
        gap = GELU_ERF_TANH_GAP if activation == "none" else 0.0
        assert np.abs(got - y).max() <= 2 * np.spacing(np.float16(scale)) + gap, "Fp8GemmAct is not the Q/DQ math"
        assert np.abs(got - qdq).max() <= 0.02 * scale  # the Q/DQ graph itself: fp16 throughout


@pytest.mark.parametrize("form", ["matmul", "gemm"])
def test_a_bias_of_zeros_becomes_none(form):
    """A config-fresh model's zero bias: an empty one ([0]), so cuBLASLt runs no bias epilogue; the same outputs as the Q/DQ graph
    with its zeros added, and a non-zero bias stays."""
    model, _ = _gemm_graph(form, activation="relu", bias=True)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    bias = next(t for t in model.graph.initializer if t.name == "bias")
    kept = _lower(model)
    assert {t.name: list(t.dims) for t in kept.graph.initializer}[kept.graph.node[0].input[4]] == [24], "a non-zero bias stays"
    bias.CopyFrom(numpy_helper.from_array(np.zeros(24, helper.tensor_dtype_to_np_dtype(bias.data_type)), "bias"))
    fused = _lower(model)
    dims = {t.name: list(t.dims) for t in fused.graph.initializer}
    assert _ops(fused) == ["Fp8GemmAct"] and dims[fused.graph.node[0].input[4]] == [0]
    plain, fast = session(model, optimize=False), session(fused, optimize=False)
    for feed in _feeds(shape, 2, 11):
        want = run(plain, feed)["y"].astype(np.float64)
        np.testing.assert_allclose(run(fast, feed)["y"].astype(np.float64), want, atol=0.02 * np.abs(want).max())


@pytest.mark.parametrize(("why", "kwargs"), [("fp32 graph", {"dtype": TensorProto.FLOAT}), ("int8 Q/DQ", {"zero_type": TensorProto.INT8}),
                                              ("per-channel weight scales", {"w_scales": 24})])
def test_what_the_rule_leaves(why, kwargs):
    """fp32 graphs, int8 Q/DQ and per-channel weight scales keep their Q/DQ (no Fp8GemmAct form)."""
    model, _ = _gemm_graph("matmul", **kwargs)
    fused = _lower(model)
    assert "Fp8GemmAct" not in _ops(fused) and "QuantizeLinear" in _ops(fused), why


@pytest.mark.parametrize("form", ["matmul", "gemm"])
def test_a_symbolic_k_still_becomes_fp8_gemm_act(form):
    """x's last axis unknown to shape inference (Swin's attention output, viewed back by a computed
    Reshape: [b, 16, unk]) is the weight's K, since the GEMM reads it: fused, and the Q/DQ graph's numbers."""
    model, _ = _gemm_graph(form)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    model.graph.input[0].type.tensor_type.shape.dim[-1].dim_param = "k"
    del model.graph.value_info[:]
    model = onnx.shape_inference.infer_shapes(model)
    fused = _lower(model)
    assert _ops(fused) == ["Fp8GemmAct"]
    plain, fast = session(model, optimize=False), session(fused)
    for feed in _feeds(shape, 2, 11):
        want = run(plain, feed)["y"].astype(np.float64)
        assert np.abs(run(fast, feed)["y"].astype(np.float64) - want).max() <= 0.02 * np.abs(want).max()


def test_gemms_sharing_a_weight_share_its_transposed_copy():
    """Two Q/DQ'd MatMuls on one float8 weight (ALBERT's shared layers, as place_qdq writes them: a
    DequantizeLinear each) read one stored Wqᵀ, and compute what their Q/DQ graph computes."""
    one, _ = _gemm_graph("matmul", bias=False)
    nodes = [helper.make_node(n.op_type, [f"{i}_{v}" if v in ("x", "x_q", "x_dq", "w_dq") else v for v in n.input], [f"{i}_{o}" for o in n.output],
                              name=f"{i}_{n.op_type}{j}") for i in (1, 2) for j, n in enumerate(one.graph.node)]
    for node in nodes:
        if node.op_type == "MatMul":
            node.output[0] = node.output[0].replace("_y", "_out")
    shape = [d.dim_value for d in one.graph.input[0].type.tensor_type.shape.dim]
    graph = helper.make_graph(nodes, "shared", [helper.make_tensor_value_info(f"{i}_x", TensorProto.FLOAT16, shape) for i in (1, 2)],
                              [helper.make_tensor_value_info(f"{i}_out", TensorProto.FLOAT16, None) for i in (1, 2)], list(one.graph.initializer))
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=10))
    fused = _lower(model)
    assert _ops(fused) == ["Fp8GemmAct", "Fp8GemmAct"]
    weights = {t.name: t for t in fused.graph.initializer}
    assert len({n.input[2] for n in fused.graph.node}) == 1 and sum(t.data_type == TensorProto.FLOAT8E4M3FN for t in weights.values()) == 1
    plain, fast = session(model, optimize=False), session(fused)
    rng = np.random.default_rng(12)
    for _ in range(2):
        feed = {f"{i}_x": rng.standard_normal(shape).astype(np.float16) for i in (1, 2)}
        for name, want in run(plain, feed).items():
            assert np.abs(run(fast, feed)[name].astype(np.float64) - want).max() <= 0.02 * np.abs(want.astype(np.float64)).max()


def test_only_ort_cuda_gets_it_and_not_from_fuse():
    assert fp8_gemm.rules("ort-cuda") and not fp8_gemm.rules("tensorrt") and not fp8_gemm.rules("ort-cpu")  # TensorRT fuses its own Q/DQ
    assert fp8_gemm.FAMILY not in family_names()  # the guard cannot judge a quantized graph: the gate judges `lower`


# --- whole models ---------------------------------------------------------------------------


@functools.cache
def _qdq_model(name: str, dynamic: bool) -> tuple[onnx.ModelProto, onnx.ModelProto, torch.nn.Module, dict[str, torch.Tensor]]:
    """Zoo model `name` (trained-like biases) exported in fp16 for ort-cuda and fused as an fp8
    --cuda-graph export fuses it (less FP8_SKIPPED_FAMILIES; embed_layer_norm kept, which an export
    without --cuda-graph leaves out), and the same graph with float8 Q/DQ on its GEMMs, calibrated
    on random fp16 inputs."""
    torch.manual_seed(0)
    module, example = zoo.ZOO[name].build()
    _trained_like(module)
    path = Path(_ROOT.name) / f"{name}_{dynamic}.onnx"
    deployfuse.export(module, path, example_inputs=example, target="ort-cuda", precision="fp16", fuse=False, verify=False,
                      dynamic=list(zoo.ZOO[name].dynamic) if dynamic else ())
    model, _ = fuse(onnx.load(path), "ort-cuda", _model_feeds(module, example, (1, 2)), families=[f for f in family_names() if f not in FP8_SKIPPED_FAMILIES],
                    custom_ops_library=False)
    drawn = random_calibration(example, module, seed=0)
    half = Calibration([{k: v.half() if v.is_floating_point() else v for k, v in s.items()} for s in drawn.samples], [], drawn.source)
    return model, place_qdq(model, "fp8", half, set()), module, example


def _model_feeds(module: torch.nn.Module, example: dict[str, torch.Tensor], seeds: tuple[int, ...]) -> list[dict[str, np.ndarray]]:
    return [{k: (v.half() if v.is_floating_point() else v).numpy() for k, v in make_inputs(specs_of(example), module, s, pad_masks=s % 2 == 1).items()}
            for s in seeds]


@pytest.mark.parametrize(("name", "dynamic"), [("bert", False), ("gpt2", False), ("vit", False), ("bert", True), ("gpt2", True)])
def test_every_qdq_gemm_becomes_fp8_gemm_act_and_attention_still_fuses(name, dynamic):
    """BERT (MatMul + Add, erf GELU), GPT-2 (Conv1D's Gemm + Reshape, tanh GELU) and ViT: no Q/DQ
    left, one Fp8GemmAct per quantized GEMM but each layer's FC1 -> FC2, one Fp8Mlp (its GELU in FC1's epilogue), FusedMHA (packed QKV) and SkipLayerNormalization in
    every layer; the lowered model is the Q/DQ model up to fp16 roundings, with ONNX Runtime's
    graph optimisations off and on (its Q/DQ propagation must not see through the bodies)."""
    float_model, qdq, module, example = _qdq_model(name, dynamic)
    fused = _lower(qdq)
    ops = _ops(fused)
    layers = zoo.ZOO[name].layers
    assert _fp8_gemms(fused) == len(quantizable_nodes(float_model, "fp8")) and not {"QuantizeLinear", "DequantizeLinear"} & set(ops)
    assert ops.count("Fp8Mlp") == layers, "every layer's FC1 -> FC2 is one Fp8Mlp"
    assert ops.count("FusedMHA") == layers, "packed_mha: FusedMHA on the packed QKV"
    # fp8_norm: every layer's QKV and MLP inputs come out of a norm that quantizes them itself, but BERT's first QKV: its input
    # is the embeddings' EmbedLayerNormalization (embed_layer_norm), and the GEMM quantizes it
    assert ops.count("SkipLayerNormFp8") == 2 * layers - ops.count("EmbedLayerNormalization") and ops.count("EmbedLayerNormalization") == (name == "bert")
    activations = [helper.get_attribute_value(a).decode() for n in fused.graph.node if n.op_type in ("Fp8GemmAct", "Fp8Mlp") for a in n.attribute
                   if a.name == "activation"]
    assert activations.count("gelu_tanh") == layers and "Gelu" not in ops  # BERT's and ViT's exact GELU too, in the epilogue's tanh form
    plain, qdq_session, optimised = session(float_model, optimize=False), session(qdq, optimize=False), session(fused)
    rewritten = session(fused, optimize=False)
    for feed in _model_feeds(module, example, (11, 12)):
        reference, quantized, got, got_optimised = run(plain, feed), run(qdq_session, feed), run(rewritten, feed), run(optimised, feed)
        for output, want in reference.items():
            want, qdq_out = want.astype(np.float64), quantized[output].astype(np.float64)
            quantization = np.abs(qdq_out - want).mean()  # what fp8 costs
            for out in (got[output], got_optimised[output]):
                diff = np.abs(out.astype(np.float64) - qdq_out)
                assert diff.mean() < 0.5 * quantization, f"{output}: the rewrite moves it {diff.mean():.2e} on average, fp8 itself {quantization:.2e}"
                assert diff.max() < 0.02 * np.abs(want).max()


# --- Fp8Mlp: FC1 -> FC2 merged ------------------------------------------------------------------


def _unmerged(model: onnx.ModelProto, monkeypatch: pytest.MonkeyPatch) -> onnx.ModelProto:
    """`model` lowered with the Fp8Mlp merge left out: its Fp8GemmAct pairs as they were."""
    with monkeypatch.context() as patch:
        patch.setattr(fp8_mlp, "merge", lambda lowered: (lowered, 0))
        return _lower(model)


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_merged_mlp_equals_the_fp8_gemm_act_pair(name, monkeypatch):
    """BERT (FC1 -> FC2 directly) and GPT-2 (through Conv1D's Reshapes, Y reshaped back): the merged graph against the unmerged
    one on fresh random inputs (ORT CPU EP on the function bodies, optimisations off). They differ where the pair rounds FC1's
    output to fp16 before FC2 quantizes it and Fp8Mlp quantizes the float32 value: a hidden value near a float8 rounding
    midpoint moves one float8 step, far less on average than fp8 itself costs."""
    float_model, qdq, module, example = _qdq_model(name, False)
    merged, unmerged = _lower(qdq), _unmerged(qdq, monkeypatch)
    assert _ops(merged).count("Fp8Mlp") == zoo.ZOO[name].layers and "Fp8Mlp" not in _ops(unmerged)
    assert _fp8_gemms(merged) == _fp8_gemms(unmerged), "each Fp8Mlp replaced two Fp8GemmAct"
    if name == "gpt2":  # per layer: FC1's two Reshapes ([B·S, N1] -> [B, S, N1] -> [B·S, N1]) out, Y's one in
        assert _ops(merged).count("Reshape") == _ops(unmerged).count("Reshape") - zoo.ZOO[name].layers
    plain, pair, mlp = (session(m, optimize=False) for m in (float_model, unmerged, merged))
    for feed in _model_feeds(module, example, (21,)):
        reference, want, got = run(plain, feed), run(pair, feed), run(mlp, feed)
        for output, ref in reference.items():
            ref, want_out, got_out = ref.astype(np.float64), want[output].astype(np.float64), got[output].astype(np.float64)
            assert got_out.shape == want_out.shape
            quantization = np.abs(want_out - ref).mean()
            diff = np.abs(got_out - want_out)
            assert diff.mean() < 0.25 * quantization, f"{output}: merging moves it {diff.mean():.2e} on average, fp8 itself {quantization:.2e}"
            assert diff.max() < 0.02 * np.abs(ref).max()


def _fc_pair_graph(reshape: bool, activation: str, n1: int, fast_accum: tuple[int, int] = (1, 1), seed: int = 0, n2: int = 20) -> onnx.ModelProto:
    """fp32 X [2, 5, K] -> Fp8GemmAct (FC1, `activation`) [-> Reshape [-1, N1]] -> Fp8GemmAct (FC2) -> Y, the inputs as
    Fp8Mlp's example_inputs makes them."""
    from deployfuse.ops import DOMAIN, attach_functions
    from deployfuse.ops.defs import fp8_mlp as op

    k = 24
    rng = np.random.default_rng(seed)
    arrays = op.example_inputs((2, 5, k, n1, n2), lambda *shape, scale=1.0, shift=0.0: (rng.standard_normal(shape) * scale + shift).astype(np.float32), {})
    names = ["x_scale", "w1", "w1_scale", "b1", "h_scale", "w2", "w2_scale", "b2"]
    inits = [numpy_helper.from_array(np.asarray(a), n) for a, n in zip(arrays[1:], names)] + [numpy_helper.from_array(np.array([-1, n1]), "shape")]
    fc = functools.partial(helper.make_node, "Fp8GemmAct", domain=DOMAIN)
    nodes = [fc(["x", "x_scale", "w1", "w1_scale", "b1"], ["h"], name="fc1", activation=activation, fast_accum=fast_accum[0])]
    nodes += [helper.make_node("Reshape", ["h", "shape"], ["h2"], name="view")] if reshape else []
    nodes.append(fc(["h2" if reshape else "h", "h_scale", "w2", "w2_scale", "b2"], ["y"], name="fc2", fast_accum=fast_accum[1]))
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(DOMAIN, 1)], ir_version=10)
    attach_functions(model)
    return model


@pytest.mark.parametrize(("reshape", "activation"), [(False, "gelu_tanh"), (True, "relu"), (True, "none")])
def test_merged_pair_runs_on_the_cpu_kernel_as_the_reference(reshape, activation):
    """A hand-built fp32 pair merged: Fp8Mlp's output (the custom-op library's CPU kernel, and its function body) equals the pair's
    and the spec's torch reference on fresh inputs: in fp32 the pair's FC1 output is float32, so the math is the same."""
    from deployfuse.ops import SPECS, attach_functions, ort_custom_ops_library

    model = _fc_pair_graph(reshape, activation, n1=32)
    merged, count = fp8_mlp.merge(onnx.ModelProto.FromString(model.SerializeToString()))
    attach_functions(merged)
    assert count == 1 and [n.op_type for n in merged.graph.node] == ["Fp8Mlp"] + (["Reshape"] if reshape else [])
    library = ort_custom_ops_library()
    sessions = {"pair": session(model, optimize=False, custom_ops_library=library), "kernel": session(merged, optimize=False, custom_ops_library=library),
                "body": session(merged, optimize=False)}
    weights = {t.name: torch.from_numpy(numpy_helper.to_array(t).astype(np.float32)) for t in model.graph.initializer}
    for seed in (3, 4):
        x = np.random.default_rng(seed).standard_normal((2, 5, 24)).astype(np.float32)
        ref = SPECS["Fp8Mlp"].reference(torch.from_numpy(x), *(weights[n] for n in ("x_scale", "w1", "w1_scale", "b1", "h_scale", "w2", "w2_scale", "b2")),
                                        activation=activation).numpy().reshape(-1, 20)
        scale = np.abs(ref).max()
        for what, sess in sessions.items():
            got = run(sess, {"x": x})["y"]
            assert got.shape == ((10, 20) if reshape else (2, 5, 20)), what
            assert np.abs(got.reshape(-1, 20) - ref).max() <= 1e-4 * scale, f"{what} is not Fp8Mlp's reference"


def test_a_chain_of_three_merges_its_first_pair_once():
    """FC1 -> FC2 -> FC3, each pair mergeable alone: FC1 and FC2 become one Fp8Mlp and FC3 stays an Fp8GemmAct reading its
    output (FC2 is not taken twice), with the unmerged chain's numbers on fresh inputs (fp32: the same math)."""
    from deployfuse.ops import DOMAIN, attach_functions

    model = _fc_pair_graph(False, "relu", n1=32, n2=16)
    rng = np.random.default_rng(5)
    model.graph.node[1].output[0] = "y2"
    third = {"y2_scale": np.float32(0.02), "w3": rng.standard_normal((8, 16)).astype(E4M3), "w3_scale": np.float32(0.05),
             "b3": rng.standard_normal(8).astype(np.float32)}
    model.graph.initializer.extend(numpy_helper.from_array(np.asarray(a), n) for n, a in third.items())
    model.graph.node.append(helper.make_node("Fp8GemmAct", ["y2", *third], ["y"], name="fc3", domain=DOMAIN, fast_accum=1))
    attach_functions(model)
    merged, count = fp8_mlp.merge(onnx.ModelProto.FromString(model.SerializeToString()))
    attach_functions(merged)
    assert count == 1 and [(n.op_type, n.input[0]) for n in merged.graph.node] == [("Fp8Mlp", "x"), ("Fp8GemmAct", "y2")]
    chain, mlp = session(model, optimize=False), session(merged, optimize=False)
    for seed in (6, 7):
        x = np.random.default_rng(seed).standard_normal((2, 5, 24)).astype(np.float32)
        want = run(chain, {"x": x})["y"]
        assert np.abs(run(mlp, {"x": x})["y"] - want).max() <= 1e-4 * np.abs(want).max()


@pytest.mark.parametrize(("why", "kwargs"), [("N1 not a multiple of 16", {"n1": 40}), ("FC2 has an activation", {"activation": "relu", "fc2_act": True}),
                                              ("fast_accum differs", {"fast_accum": (1, 0)}), ("FC1's output read twice", {"second_reader": True})])
def test_what_the_merge_leaves(why, kwargs):
    """The pairs Fp8Mlp cannot take stay two Fp8GemmAct."""
    fc2_act, second_reader = kwargs.pop("fc2_act", False), kwargs.pop("second_reader", False)
    model = _fc_pair_graph(False, kwargs.pop("activation", "relu"), **{"n1": 32, **kwargs})
    if fc2_act:
        model.graph.node[1].attribute.append(helper.make_attribute("activation", "relu"))
    if second_reader:
        model.graph.node.append(helper.make_node("Identity", ["h"], ["h_out"]))
        model.graph.output.append(helper.make_tensor_value_info("h_out", TensorProto.FLOAT, None))
    merged, count = fp8_mlp.merge(model)
    assert count == 0 and "Fp8Mlp" not in _ops(merged), why
