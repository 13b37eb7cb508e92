"""Bias + activation: BiasGelu on ONNX Runtime, deployfuse.BiasAct for GPU epilogues."""

import pytest
from _export import check_case


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_epilogues_on_cuda(exporter):
    """ReLU and tanh-GELU epilogues go into the GEMM on ort-cuda (gemm_act, before this family): BiasAct keeps SiLU and sigmoid."""
    check_case("hand_norms", exporter, "ort-cuda", {"bias_act_relu": 0, "bias_act_silu": 1, "bias_act_sigmoid": 1, "bias_gelu": 0},
               {"deployfuse::BiasAct": 2, "com.microsoft::FastGelu": 0, "Relu": 0})


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_epilogues_on_tensorrt(exporter):
    model = check_case("hand_norms", exporter, "tensorrt", {"bias_act_relu": 1, "bias_act_silu": 1, "bias_act_sigmoid": 1, "bias_act_gelu_tanh": 1},
                       {"deployfuse::BiasAct": 4})
    assert {f.name for f in model.functions} >= {"BiasAct"}  # function bodies attached


def test_no_biasact_on_cpu():
    """ORT's CPU GEMM already takes the bias; BiasAct would only run as its function body."""
    check_case("hand_norms", "dynamo", "ort-cpu", {"bias_act_relu": 0}, {"deployfuse::BiasAct": 0})


@pytest.mark.parametrize("target", ["ort-cpu", "ort-cuda"])
def test_bias_gelu_in_vit(target):
    check_case("vit", "dynamo", target, {"bias_gelu": 2}, {"com.microsoft::BiasGelu": 2})


def test_gemm_reshape_epilogue_in_gpt2():
    """GPT-2's addmm + view + hand-written tanh GELU -> Gemm (no C) + Reshape + BiasAct."""
    check_case("gpt2", "dynamo", "tensorrt", {"bias_act_gelu_tanh": 2}, {"deployfuse::BiasAct": 2, "Tanh": 0})
