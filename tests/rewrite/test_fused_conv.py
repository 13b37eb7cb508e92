"""Conv + activation -> com.microsoft.FusedConv on ort-cpu (measured slower on CUDA; TensorRT
fuses it itself)."""

import pytest
from _export import check_case


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_resnet18(exporter):
    # the stem + one conv per basic block (8) feed a ReLU directly; the other 8 ReLUs follow a residual add
    check_case("resnet18", exporter, "ort-cpu", {"conv_act": 9}, {"com.microsoft::FusedConv": 9, "Relu": 8})


@pytest.mark.parametrize("target", ["ort-cuda", "tensorrt"])
def test_gpu_targets_keep_conv_relu(target):
    check_case("resnet18", "dynamo", target, {"conv_act": 0}, {"Relu": 17, "com.microsoft::FusedConv": 0})
