"""RMSNorm -> SimplifiedLayerNormalization (ONNX Runtime) / RMSNormalization-23 (TensorRT)."""

import pytest

from _export import check_case


@pytest.mark.parametrize(("target", "skips"), [("ort-cuda", 4), ("ort-cpu", 1)])
def test_llama_rmsnorm(target, skips):
    # 2 layers x 2 norms + the final norm = 5; 4 follow a residual add, whose sum LLaMA (pre-norm)
    # uses again: fused on CUDA; on CPU, where that form measured slower, only the final norm
    check_case("llama", "dynamo", target, {"rmsnorm": 5, "skip_rmsnorm": skips},
               {"SimplifiedLayerNormalization": 5 - skips, "com.microsoft::SkipSimplifiedLayerNormalization": skips, "ReduceMean": 0})


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_hand_written_rmsnorm(exporter):
    """rsqrt as Reciprocal(Sqrt) (dynamo) and as Div(1, Sqrt) (TorchScript)."""
    check_case("hand_norms", exporter, "ort-cpu", {"rmsnorm": 1}, {"SimplifiedLayerNormalization": 1})


def test_tensorrt_below_opset_23_keeps_rmsnorm_decomposed():
    check_case("llama", "dynamo", "tensorrt", {"rmsnorm": 0}, {"ReduceMean": 5})


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_fp16_with_float_statistics(exporter):
    check_case("upcast_norms_fp16", exporter, "ort-cuda", {"layernorm": 1, "rmsnorm": 1},
               {"SimplifiedLayerNormalization": 1, "LayerNormalization": 1, "Cast": 0}, rtol=2e-3)
