"""GELU (erf, tanh) and QuickGELU -> Gelu / FastGelu / QuickGelu as each target allows."""

import pytest
from _export import check_case


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("target", ["ort-cpu", "ort-cuda"])
def test_erf_gelu_in_bert(exporter, target):
    # bias + GELU then folds into BiasGelu (the bias_gelu family): 2 layers -> 2
    check_case("bert", exporter, target, {"gelu_erf": 2, "bias_gelu": 2}, {"com.microsoft::BiasGelu": 2, "Erf": 0})


def test_tanh_gelu_in_gpt2():
    check_case("gpt2", "dynamo", "ort-cpu", {"gelu_tanh": 2}, {"com.microsoft::FastGelu": 2, "Tanh": 0})


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_erf_gelu_after_conv_in_whisper(exporter):
    """Whisper's conv stem GELUs have no bias add to fold: they stay com.microsoft.Gelu."""
    check_case("whisper_encoder", exporter, "ort-cpu", {"gelu_erf": 4}, {"com.microsoft::Gelu": 2, "com.microsoft::BiasGelu": 2})


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_quick_gelu(exporter):
    check_case("hand_norms", exporter, "ort-cpu", {"quick_gelu": 1, "gelu_tanh": 1}, {"com.microsoft::QuickGelu": 1})


def test_tensorrt_below_opset_20_keeps_decomposed_gelu():
    """No Gelu-20 before opset 20 and no com.microsoft op for TensorRT: the erf form stays
    (bias_act takes the ones behind a bias)."""
    check_case("whisper_encoder", "torchscript", "tensorrt", {"gelu_erf": 0, "bias_act_gelu": 2}, {"Erf": 2, "deployfuse::BiasAct": 2})


def test_tensorrt_gelu20_at_opset_20():
    """GPT-2 writes its tanh GELU by hand; at opset 20 TensorRT gets Gelu-20(tanh), which the
    bias_act family then folds with the Gemm's bias into BiasAct."""
    check_case("gpt2", "dynamo", "tensorrt", {"gelu_tanh": 2, "bias_act_gelu_tanh": 2}, {"Tanh": 0, "deployfuse::BiasAct": 2}, opset=20)
