"""`deployfuse package --triton`: repositories whose config.pbtxt Triton's own schema accepts,
the artefact's CUDA options carried (or named), libraries copied, and bad input refused whole."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from google.protobuf import text_format
from onnx import TensorProto, helper, numpy_helper
from tritonclient.grpc import model_config_pb2

from deployfuse import metadata
from deployfuse.errors import UsageError
from deployfuse.ops import ort_custom_ops_library, trt_plugins_library
from deployfuse.serve import triton_config


def parse(repo: Path, name: str) -> model_config_pb2.ModelConfig:
    """The config as Triton reads it: unknown fields are errors."""
    return text_format.Parse((repo / name / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())


def leftovers(folder: Path) -> list[str]:
    """Hidden staging folders a failed run would leave beside the repository."""
    return [p.name for p in folder.iterdir() if p.name.startswith(".")]


def matmul_model(path: Path, options: dict[str, str], batch: str | int = "batch") -> Path:
    """y = relu(x @ W) with W in an external data file and CUDA options in the metadata."""
    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 3)).astype(np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Relu", ["h"], ["y"])], "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 8])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    metadata.write(model, metadata.CUDA_PROVIDER_OPTIONS, options)
    onnx.save(model, str(path), save_as_external_data=True, location=path.name + ".data", size_threshold=0)
    return path


def test_onnx_with_deployfuse_ops(cli, mlp_onnx, tmp_path):
    repo = tmp_path / "models"
    code, out, err = cli("package", mlp_onnx, "--triton", repo, "--name", "mlp", "--max-batch-size", "8", "--dynamic-batching", "--instances", "2")
    assert code == 0, err
    config = parse(repo, "mlp")
    assert config.platform == "onnxruntime_onnx" and config.max_batch_size == 8
    assert [(i.name, model_config_pb2.DataType.Name(i.data_type), list(i.dims)) for i in config.input] == [("input", "TYPE_FP32", [16])]
    assert [(o.name, list(o.dims)) for o in config.output] == [(onnx.load(str(mlp_onnx)).graph.output[0].name, [4])]
    assert config.HasField("dynamic_batching")
    assert [(g.count, model_config_pb2.ModelInstanceGroup.Kind.Name(g.kind)) for g in config.instance_group] == [(2, "KIND_GPU")]
    warmup = config.model_warmup[0]
    assert warmup.batch_size == 1 and list(warmup.inputs["input"].dims) == [16] and warmup.inputs["input"].random_data
    library = Path(config.model_operations.op_library_filename[0])
    assert library == (repo / "mlp" / "libdeployfuse_ort.so").resolve() and library.is_file()
    assert library.read_bytes() == ort_custom_ops_library().read_bytes()
    assert (repo / "mlp" / "1" / "model.onnx").read_bytes() == mlp_onnx.read_bytes()
    assert f"--model-repository={repo.resolve()}" in (repo / "README.md").read_text()
    assert not leftovers(tmp_path)


def test_cuda_options_mapped_and_the_cuda_graph_named(cli, tmp_path):
    options = {"prefer_nhwc": "1", "use_tf32": "0", "cudnn_conv_algo_search": "HEURISTIC", "enable_cuda_graph": "1"}
    model = matmul_model(tmp_path / "mm.onnx", options)
    repo = tmp_path / "models"
    code, _, err = cli("package", model, "--triton", repo, "--served-from", "/models")
    assert code == 0, err
    config = parse(repo, "mm")
    assert config.max_batch_size == 0 and [list(i.dims) for i in config.input] == [[-1, 8]]
    (accelerator,) = config.optimization.execution_accelerators.gpu_execution_accelerator
    assert accelerator.name == "cuda" and dict(accelerator.parameters) == {"prefer_nhwc": "1", "use_tf32": "0"}
    assert config.parameters["cudnn_conv_algo_search"].string_value == "1"  # the backend's HEURISTIC
    assert "enable_cuda_graph" not in (repo / "mm" / "config.pbtxt").read_text()
    readme = (repo / "README.md").read_text()
    assert "`enable_cuda_graph=1`" in readme and "tritonserver --model-repository=/models" in readme
    assert not config.HasField("model_operations"), "no deployfuse.* nodes, no library"
    assert (repo / "mm" / "1" / "mm.onnx.data").is_file(), "external weights travel with the model"
    assert sorted(p.name for p in (repo / "mm").iterdir()) == ["1", "config.pbtxt"]


def test_cpu_instances_carry_no_cuda_options(cli, tmp_path):
    model = matmul_model(tmp_path / "mm.onnx", {"prefer_nhwc": "1"})
    code, _, err = cli("package", model, "--triton", tmp_path / "models", "--device", "cpu", "--max-batch-size", "4")
    assert code == 0, err
    config = parse(tmp_path / "models", "mm")
    assert config.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
    assert not config.HasField("optimization") and [list(i.dims) for i in config.input] == [[8]]


def test_tensorrt_engine(cli, mlp_engine, tmp_path):
    engine, source = mlp_engine
    repo = tmp_path / "models"
    code, _, err = cli("package", engine, "--triton", repo, "--onnx", source, "--max-batch-size", "4", "--dynamic-batching")
    assert code == 0, err
    config = parse(repo, "mlp")
    assert config.platform == "tensorrt_plan" and config.default_model_filename == "model.plan" and config.max_batch_size == 4
    assert [list(i.dims) for i in config.input] == [[16]] and [list(o.dims) for o in config.output] == [[4]]
    assert (repo / "mlp" / "1" / "model.plan").read_bytes() == engine.read_bytes()
    plugins = repo / "mlp" / "libdeployfuse_trt.so"
    assert plugins.read_bytes() == trt_plugins_library().read_bytes()
    assert f"--backend-config=tensorrt,plugins={plugins.resolve()}" in (repo / "README.md").read_text()
    # the profile the engine was built with (batch 1..4, twice the export's 2) bounds the batch
    code, _, err = cli("package", engine, "--triton", tmp_path / "big", "--onnx", source, "--max-batch-size", "16")
    assert code == 2 and "exceeds the engine's profile (batch <= 4)" in err and not (tmp_path / "big").exists()


def test_engine_unreadable_here_needs_its_onnx(cli, mlp_engine, tmp_path):
    code, _, err = cli("package", mlp_engine[0], "--triton", tmp_path / "models")
    assert code == 2 and "--onnx MODEL.onnx" in err and err.count("\n") == 1
    assert not (tmp_path / "models").exists() and not leftovers(tmp_path)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--max-batch-size", "4"], "--max-batch-size needs a batch axis"),
        (["--dynamic-batching"], "--dynamic-batching needs --max-batch-size"),
        (["--name", "a/b"], "Triton model names are"),
        (["--name", ".hidden"], "Triton model names are"),
        (["--instances", "0"], "--instances must be >= 1"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(cli, tmp_path, extra, message):
    static = matmul_model(tmp_path / "static.onnx", {}, batch=2)
    code, out, err = cli("package", static, "--triton", tmp_path / "models", *extra)
    assert code == 2 and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "models").exists() and not leftovers(tmp_path)


def test_unknown_artefact_type(cli, tmp_path):
    weird = tmp_path / "model.pt"
    weird.write_bytes(b"not a model")
    code, _, err = cli("package", weird, "--triton", tmp_path / "models")
    assert code == 2 and "unknown artefact type 'model.pt'" in err and not (tmp_path / "models").exists()


def test_existing_repository_needs_force(cli, tmp_path):
    model = matmul_model(tmp_path / "mm.onnx", {})
    repo = tmp_path / "models"
    repo.mkdir()
    (repo / "keep.txt").write_text("someone's model")
    code, _, err = cli("package", model, "--triton", repo)
    assert code == 2 and "--force" in err and (repo / "keep.txt").read_text() == "someone's model"
    code, _, err = cli("package", model, "--triton", repo, "--force")
    assert code == 0, err
    assert not (repo / "keep.txt").exists() and (repo / "mm" / "config.pbtxt").is_file() and not leftovers(tmp_path)


def test_schema_check_rejects_unknown_fields():
    with pytest.raises(UsageError, match="no field named \"max_batch\""):
        triton_config.validate('name: "m"\nmax_batch: 4\n')


def test_token_inputs_warm_up_with_valid_ids(cli, tmp_path):
    """int64 ids and mask on shared batch/seq axes: dims -1, warm-up at the recorded shape with
    zeros (a valid token id), not random integers that could index past the vocabulary."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["input_ids", "attention_mask"], ["y"])], "tok",
        [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"]) for n in ("input_ids", "attention_mask")],
        [helper.make_tensor_value_info("y", TensorProto.INT64, ["batch", "seq"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    metadata.write(model, metadata.INPUT_SHAPES, {"input_ids": [2, 32], "attention_mask": [2, 32]})
    onnx.save(model, str(tmp_path / "tok.onnx"))
    code, _, err = cli("package", tmp_path / "tok.onnx", "--triton", tmp_path / "models", "--max-batch-size", "16")
    assert code == 0, err
    config = parse(tmp_path / "models", "tok")
    assert [(model_config_pb2.DataType.Name(i.data_type), list(i.dims)) for i in config.input] == [("TYPE_INT64", [-1])] * 2
    for name in ("input_ids", "attention_mask"):
        warm = config.model_warmup[0].inputs[name]
        assert list(warm.dims) == [32] and warm.zero_data and not warm.random_data
