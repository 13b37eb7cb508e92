"""GEMM epilogues: MatMul / Gemm (constant weight) + bias [+ ReLU / tanh-GELU] -> deployfuse.GemmAct on ort-cuda,
with the numbers of the unfused graph; exact GELU, SiLU and sigmoid stay with bias_gelu / bias_act;
nothing on ort-cpu or tensorrt."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from _export import build, check_case, fused
from onnx import helper, numpy_helper

from deployfuse.backends.ort import run, session
from deployfuse.rewrite import fuse
from deployfuse.rewrite.gemm_tuning import gemm_problems, tune
from deployfuse.rewrite.rules import gemm_act


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_relu_tanh_gelu_and_plain_bias_fuse_on_cuda(exporter):
    """hand_norms: Linear + ReLU, Linear + tanh-GELU, and Linear + QuickGELU (no epilogue for it:
    the bias alone moves in); SiLU and sigmoid stay BiasAct."""
    check_case("hand_norms", exporter, "ort-cuda", {"gemm_act_relu": 1, "gemm_act_gelu_tanh": 1, "gemm_act": 1, "bias_act_silu": 1, "bias_act_sigmoid": 1,
                                                    "bias_act_relu": 0, "bias_gelu": 0},
               {"deployfuse::GemmAct": 3, "deployfuse::BiasAct": 2, "com.microsoft::QuickGelu": 1, "com.microsoft::FastGelu": 0, "Relu": 0})


def test_gpt2_conv1d_gemms():
    """GPT-2's addmm (Gemm) + view (+ tanh GELU): every linear layer outside the packed QKV."""
    model = check_case("gpt2", "dynamo", "ort-cuda", {"gemm_act_gelu_tanh": 2, "gemm_act": 4}, {"deployfuse::GemmAct": 6, "Gemm": 0, "com.microsoft::FastGelu": 0})
    acts = sorted(helper.get_attribute_value(a).decode() for n in model.graph.node if n.op_type == "GemmAct" for a in n.attribute if a.name == "activation")
    assert acts == ["gelu_tanh"] * 2 + ["none"] * 4
    assert {f.name for f in model.functions} >= {"GemmAct"}


# BERT: the pooler's 2-D Linear (Gemm, transB=1) before its Tanh; ViT: patch_embed's patch GEMM + bias, no activation
@pytest.mark.parametrize(("name", "biased"), [("bert", 1), ("vit", 1)])
def test_exact_gelu_stays_bias_gelu(name, biased):
    """cuBLASLt's GELU is the tanh form: MatMul + bias + exact GELU stays MatMul + BiasGelu."""
    check_case(name, "dynamo", "ort-cuda", {"gemm_act": biased, "bias_gelu": 2}, {"com.microsoft::BiasGelu": 2, "deployfuse::GemmAct": biased})


@pytest.mark.parametrize("target", ["ort-cpu", "tensorrt"])
def test_not_on_cpu_or_tensorrt(target):
    assert gemm_act.rules(target) == []
    check_case("hand_norms", "dynamo", target, {"gemm_act": 0, "gemm_act_relu": 0}, {"deployfuse::GemmAct": 0})


def _near_misses() -> onnx.ModelProto:
    """Linear layers GemmAct must not take: a weight that is an input, two Gemms with transB=1 reading one stored Wᵀ
    (the transposed copy would store it twice), and a bias that is a matrix."""
    rng = np.random.default_rng(0)
    const = {name: numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
             for name, shape in (("w_t", (4, 8)), ("b", (4,)), ("w", (8, 4)), ("b2", (3, 4)))}
    nodes = [
        helper.make_node("MatMul", ["x", "y"], ["m0"]), helper.make_node("Add", ["m0", "b"], ["a0"]), helper.make_node("Relu", ["a0"], ["r0"]),
        helper.make_node("Gemm", ["x2", "w_t", "b"], ["g1"], transB=1), helper.make_node("Relu", ["g1"], ["r1"]),
        helper.make_node("MatMul", ["x", "w"], ["m2"]), helper.make_node("Add", ["m2", "b2"], ["r2"]),
        helper.make_node("Gemm", ["x", "w_t", "b"], ["r3"], transB=1),
    ]
    inputs = [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, 8]), helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [8, 4]),
              helper.make_tensor_value_info("x2", onnx.TensorProto.FLOAT, [3, 8])]
    outputs = [helper.make_tensor_value_info(f"r{i}", onnx.TensorProto.FLOAT, [3, 4]) for i in range(4)]
    graph = helper.make_graph(nodes, "near_misses", inputs, outputs, initializer=list(const.values()))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def test_gemm_with_transposed_weight_takes_the_weight_transposed_once():
    """2-D nn.Linear as the exporters write it, Gemm(x, Wᵀ, b, transB=1) [+ ReLU]: GemmAct reads W = (Wᵀ)ᵀ, a new initializer
    in place of Wᵀ (not a second copy), with the numbers of the unfused graph."""
    rng = np.random.default_rng()
    const = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name) for name, shape in
             (("w1_t", (16, 8)), ("b1", (16,)), ("w2_t", (4, 16)), ("b2", (4,)))]
    nodes = [helper.make_node("Gemm", ["x", "w1_t", "b1"], ["g1"], transB=1), helper.make_node("Relu", ["g1"], ["r1"]),
             helper.make_node("Gemm", ["r1", "w2_t", "b2"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "linear_2d", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [5, 8])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [5, 4])], initializer=const)
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10))
    feed = {"x": rng.standard_normal((5, 8), dtype=np.float32)}
    out, report = fuse(model, "ort-cuda", [feed])
    assert {k: v for k, v in report.counts().items() if k.startswith("gemm_act") and v} == {"gemm_act_relu": 1, "gemm_act": 1}
    assert [n.op_type for n in out.graph.node] == ["GemmAct", "GemmAct"]
    sizes = {t.name: list(t.dims) for t in out.graph.initializer}
    assert [sizes[n.input[1]] for n in out.graph.node] == [[8, 16], [16, 4]] and not {"w1_t", "w2_t"} & set(sizes), sizes
    feed = {"x": rng.standard_normal((5, 8), dtype=np.float32)}
    np.testing.assert_allclose(run(session(out, optimize=False), feed)["y"], run(session(model, optimize=False), feed)["y"], rtol=1e-5, atol=1e-5)


def test_near_misses_are_left_alone():
    model = _near_misses()
    rng = np.random.default_rng(1)
    feed = {"x": rng.standard_normal((3, 8), dtype=np.float32), "y": rng.standard_normal((8, 4), dtype=np.float32),
            "x2": rng.standard_normal((3, 8), dtype=np.float32)}
    out, report = fuse(model, "ort-cuda", [feed])
    assert not [n for n in out.graph.node if n.op_type == "GemmAct"]
    assert not {k: v for k, v in report.counts().items() if k.startswith("gemm_act") and v}
    want, got = run(session(model, optimize=False), feed), run(session(out, optimize=False), feed)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6)


def test_tuning_sees_each_node_problem_at_the_export_shapes():
    """--autotune times each GemmAct's problem (M tokens x K x N, activation) at the export shapes;
    without a CUDA device every node keeps the heuristic's choice, and says so."""
    model, _, _ = fused("gpt2", "dynamo", "ort-cuda")
    module, example = build("gpt2")
    feed = {k: v.numpy() for k, v in example.items()}
    tokens, hidden = math.prod(feed["input_ids"].shape), module.config.n_embd
    problems = gemm_problems(model, feed)
    assert sorted((p.m, p.k, p.n, p.activation, p.residual) for p in problems.values()) == sorted(
        [(tokens, hidden, 4 * hidden, "gelu_tanh", False)] * 2 + [(tokens, hidden, hidden, "none", False)] * 2 + [(tokens, 4 * hidden, hidden, "none", False)] * 2)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    line = tune(copy, feed)
    if not torch.cuda.is_available():
        assert line.startswith("GemmAct algorithms not tuned: no CUDA device"), line
        assert copy == model


def test_gpu_benchmarks_time_gpt2_gemm_act_on_its_kernels(tmp_path):
    """GPT-2 with biases: every linear layer outside the packed QKV is GemmAct, so the H200 harnesses
    (bench/gpu_models.py, bench/gpu_quant.py) must open deployfuse's artefact with the custom-op library;
    they timed the function bodies instead (tanh-GELU written out: 1.51 ms at batch 8)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from gpu_models import deployfuse_library

    paths = {}
    for target in ("ort-cuda", "ort-cpu"):
        paths[target] = tmp_path / f"gpt2_{target}.onnx"
        onnx.save(fused("gpt2", "dynamo", target)[0], paths[target])
    library = tmp_path / "libdeployfuse_ort.so"
    assert deployfuse_library(paths["ort-cuda"], library) == str(library)
    with pytest.raises(RuntimeError, match="no libdeployfuse_ort.so for the deployfuse nodes of gpt2_ort-cuda.onnx"):
        deployfuse_library(paths["ort-cuda"], None)
    assert deployfuse_library(paths["ort-cuda"], None, cuda=False) is None  # the CPU dry runs: function bodies are fine
    assert deployfuse_library(paths["ort-cpu"], None) is None  # no deployfuse nodes: nothing to register
