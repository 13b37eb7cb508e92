"""TensorRT-RTX builds the int8 and fp8 `tensorrt` artefacts on this CPU (compute capability 8.9,
which has fp8 tensor cores), and the engines it writes run those GEMMs in int8 / fp8.

No flag is needed: deployfuse builds strongly typed networks, where Q/DQ pairs are the explicit
precision. What the engine runs is read from TensorRT's own build log: at verbose severity
with detailed profiling it lists the engine's layers after fusion, with the data type of each
input and constant. That list is the engine's (the same one the engine inspector gives on a
GPU), not the parsed network's.
"""

from __future__ import annotations

import json
import re

import onnx
import pytest

from deployfuse.engine.inspect import record_path
from deployfuse.quantize.qdq import place_qdq, quantizable_nodes
from tests.quantize.qdq_models import exported

CC = ("--compute-capability", "8.9")
ENGINE_TYPE = {"int8": "Int8", "fp8": "FP8"}
_LAYER = re.compile(r"^Name: (?P<name>.*?), LayerType: (?P<type>\w+), Inputs: \[(?P<inputs>.*?)\], Constants: \[(?P<constants>.*?)\], Outputs:", re.M)


def _engine_layers(path) -> list[dict]:
    """The engine's layers as TensorRT-RTX builds `path` for compute capability 8.9: name (ONNX
    node names joined by '+' where fused), type, and the data types of inputs and constants."""
    from deployfuse.engine import builders

    trt = builders.activate("tensorrt-rtx")

    class Log(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.lines: list[str] = []

        def log(self, severity, message) -> None:
            self.lines.append(message)

    log = Log()
    builder = trt.Builder(log)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, log)
    assert parser.parse_from_file(str(path)), [parser.get_error(i).desc() for i in range(parser.num_errors)]
    config = builder.create_builder_config()
    config.num_compute_capabilities = 1
    config.set_compute_capability(trt.ComputeCapability.SM89, 0)
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    assert builder.build_serialized_network(network, config) is not None
    text = "\n".join(log.lines)
    return [{"name": m["name"], "type": m["type"], "inputs": re.findall(r"Datatype: (\w+)", m["inputs"]),
             "constants": re.findall(r"Datatype: (\w+)", m["constants"])} for m in _LAYER.finditer(text)]


def _quantized(name: str, precision: str, tmp_path) -> tuple[onnx.ModelProto, object]:
    model = exported(name)
    path = tmp_path / f"{name}_{precision}.onnx"
    quantized = place_qdq(model.onnx, precision, model.calibration, set())
    onnx.save(quantized, path)
    return model.onnx, path


@pytest.mark.parametrize(("name", "precision", "lowered"), [("bert", "int8", ()), ("bert", "fp8", ()), ("bert", "int8", ("--fp16",)), ("resnet18", "int8", ())])
def test_deployfuse_build_takes_the_qdq_artefact(name, precision, lowered, tmp_path, cli):
    """`deployfuse build`: every Q/DQ pair reaches the network in the quantized type (the build
    record's layers), with the rest of the graph in fp32 or, with --fp16, fp16."""
    float_model, path = _quantized(name, precision, tmp_path)
    engine = tmp_path / "e.plan"
    code, out, err = cli("build", path, "-o", engine, *CC, *lowered, "-q")
    assert code == 0, err
    layers = json.loads(record_path(engine).read_text())["network"]["layers"]
    quantize = [layer for layer in layers if layer["type"] == "QUANTIZE"]
    assert len(quantize) == len(quantizable_nodes(float_model, precision)) and {layer["precision"] for layer in quantize} == {precision}
    if lowered:
        assert {layer["precision"] for layer in layers if layer["type"] == "NORMALIZATION"} == {"half"}


@pytest.mark.parametrize(("name", "precision"), [("bert", "int8"), ("bert", "fp8"), ("resnet18", "int8")])
def test_engine_runs_the_gemms_quantized(name, precision, tmp_path):
    """Every quantizable GEMM of the float graph is, in the engine, a GEMM (or convolution) layer
    whose activation input and weights are int8 / fp8; attention's activation x activation
    MatMuls are not."""
    float_model, path = _quantized(name, precision, tmp_path)
    layers = _engine_layers(path)
    quantized = [layer for layer in layers if layer["type"] in ("gemm", "correlation") and ENGINE_TYPE[precision] in layer["inputs"]]
    assert all(layer["constants"][0] == ENGINE_TYPE[precision] for layer in quantized)
    fused_names = {part.split("_myl")[0] for layer in quantized for part in layer["name"].split("+")}
    assert fused_names == set(quantizable_nodes(float_model, precision)), sorted(fused_names ^ set(quantizable_nodes(float_model, precision)))
