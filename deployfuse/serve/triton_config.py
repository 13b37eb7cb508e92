"""`config.pbtxt` for Triton Inference Server, checked against Triton's own ModelConfig schema.

ONNX artefacts go to the onnxruntime backend (`platform: "onnxruntime_onnx"`), TensorRT engines
to the TensorRT backend (`platform: "tensorrt_plan"`). With a batch axis and max_batch_size > 0,
Triton owns axis 0: dims list the other axes (-1 where dynamic) and requests are stacked on it.

The artefact's CUDA EP options reach ONNX Runtime through the backend's `cuda` GPU execution
accelerator, whose parameters it hands to `UpdateCUDAProviderOptions` unchanged
(triton-inference-server/onnxruntime_backend, src/onnxruntime.cc). Two exceptions:
`cudnn_conv_algo_search` goes in the model-level `parameters` (the backend overwrites the
accelerator's value with its own default when a config has any `parameters`), and the CUDA graph
cannot be carried (see UNSUPPORTED_CUDA_OPTIONS).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from deployfuse.errors import UsageError
from deployfuse.serve.signature import Signature, TensorSpec

ONNX_PLATFORM = "onnxruntime_onnx"
TENSORRT_PLATFORM = "tensorrt_plan"
DEVICES = {"gpu": "KIND_GPU", "cpu": "KIND_CPU"}
_MODEL_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")
_CONV_ALGO_SEARCH = {"EXHAUSTIVE": "0", "HEURISTIC": "1", "DEFAULT": "2"}

# CUDA EP options the onnxruntime backend cannot honour, and why (named in the repository README).
UNSUPPORTED_CUDA_OPTIONS = {
    "enable_cuda_graph": "ONNX Runtime replays a CUDA graph only with inputs and outputs bound at the same "
    "addresses every run, and the onnxruntime backend binds each request's own buffers: the option is left out "
    "(run the artefact through deployfuse.InferenceSession with IO binding to get it)",
    "device_id": "Triton sets the device of each instance from instance_group",
    "has_user_compute_stream": "Triton gives each instance its own stream",
    "user_compute_stream": "Triton gives each instance its own stream",
}


@dataclass(frozen=True)
class ServingOptions:
    """How Triton should serve the model (the `deployfuse package` flags)."""

    name: str
    max_batch_size: int = 0
    instances: int = 1
    device: str = "gpu"
    dynamic_batching: bool = False
    max_queue_delay_us: int = 100


@dataclass
class CudaMapping:
    """The artefact's CUDA EP options split by where the onnxruntime backend takes them."""

    accelerator: dict[str, str] = field(default_factory=dict)
    model_parameters: dict[str, str] = field(default_factory=dict)
    unsupported: dict[str, str] = field(default_factory=dict)  # option=value -> why not


def check_model_name(name: str) -> None:
    """Triton finds a model by its folder name: letters, digits, `_`, `.`, `-`, not hidden."""
    if not _MODEL_NAME.match(name):
        raise UsageError(f"--name {name!r}: Triton model names are 1-128 letters, digits, '_', '.' or '-', not starting with '.' or '-'")


def check_options(signature: Signature, options: ServingOptions) -> None:
    """Refuse what Triton would refuse at load time, with the flag to change."""
    check_model_name(options.name)
    if options.device not in DEVICES:
        raise UsageError(f"--device {options.device!r}: choose one of {', '.join(DEVICES)}")
    if options.instances < 1:
        raise UsageError(f"--instances must be >= 1, got {options.instances}")
    if options.max_batch_size < 0:
        raise UsageError(f"--max-batch-size must be >= 0, got {options.max_batch_size}")
    if options.max_batch_size > 0 and not signature.has_batch_axis:
        raise UsageError("--max-batch-size needs a batch axis (axis 0 of every input and output dynamic, one label on the inputs); "
                         "export with e.g. --dynamic NAME:0:batch, or leave --max-batch-size out")
    if signature.max_batch is not None and options.max_batch_size > signature.max_batch:
        raise UsageError(f"--max-batch-size {options.max_batch_size} exceeds the engine's profile (batch <= {signature.max_batch})")
    if options.dynamic_batching and options.max_batch_size == 0:
        raise UsageError("--dynamic-batching needs --max-batch-size N (N > 0): Triton batches along axis 0 up to N")
    for tensor in signature.inputs + signature.outputs:
        if not tensor.name or not tensor.name.isprintable() or '"' in tensor.name or "\\" in tensor.name:
            raise UsageError(f"tensor name {tensor.name!r} cannot be written in a Triton config; rename it in the model")
        tensor.triton_type  # noqa: B018 (raises for types Triton has no name for)


def map_cuda_options(options: Mapping[str, str]) -> CudaMapping:
    """Where each CUDA EP option of the artefact goes in the onnxruntime backend's config."""
    mapping = CudaMapping()
    for key, value in options.items():
        if key in UNSUPPORTED_CUDA_OPTIONS:
            mapping.unsupported[f"{key}={value}"] = UNSUPPORTED_CUDA_OPTIONS[key]
        elif key == "cudnn_conv_algo_search":
            mapping.model_parameters[key] = _CONV_ALGO_SEARCH.get(str(value).upper(), str(value))
        else:
            mapping.accelerator[key] = str(value)
    return mapping


def onnx_config(signature: Signature, options: ServingOptions, cuda: CudaMapping, op_library: str | None = None) -> str:
    """config.pbtxt for an ONNX artefact on the onnxruntime backend."""
    lines = _common_head(options.name, ONNX_PLATFORM, "model.onnx", options.max_batch_size)
    lines += _tensors(signature, options.max_batch_size)
    lines += _scheduling(options)
    if options.device == "gpu" and cuda.accelerator:
        lines += ["optimization {", "  execution_accelerators {", "    gpu_execution_accelerator [", "      {", '        name: "cuda"']
        lines += [f"        parameters {{ key: {_q(k)} value: {_q(v)} }}" for k, v in sorted(cuda.accelerator.items())]
        lines += ["      }", "    ]", "  }", "}"]
    if options.device == "gpu":
        lines += [f"parameters {{ key: {_q(k)} value: {{ string_value: {_q(v)} }} }}" for k, v in sorted(cuda.model_parameters.items())]
    if op_library is not None:
        lines += ["model_operations {", f"  op_library_filename: [ {_q(op_library)} ]", "}"]
    lines += _warmup(signature, options.max_batch_size)
    return "\n".join(lines) + "\n"


def tensorrt_config(signature: Signature, options: ServingOptions) -> str:
    """config.pbtxt for a serialized TensorRT engine on the TensorRT backend."""
    lines = _common_head(options.name, TENSORRT_PLATFORM, "model.plan", options.max_batch_size)
    lines += _tensors(signature, options.max_batch_size)
    lines += _scheduling(options)
    lines += _warmup(signature, options.max_batch_size)
    return "\n".join(lines) + "\n"


def validate(text: str) -> object:
    """Parse `text` with Triton's ModelConfig protobuf (tritonclient); unknown fields are errors.

    Returns the parsed `inference.ModelConfig` message.
    """
    try:
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2
    except ImportError as exc:
        raise UsageError("checking config.pbtxt needs tritonclient: pip install 'deployfuse[serve]'") from exc
    try:
        return text_format.Parse(text, model_config_pb2.ModelConfig())
    except text_format.ParseError as exc:
        raise UsageError(f"config.pbtxt does not follow Triton's ModelConfig schema: {exc}") from exc


def _q(text: object) -> str:
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _common_head(name: str, platform: str, filename: str, max_batch_size: int) -> list[str]:
    return [f"name: {_q(name)}", f"platform: {_q(platform)}", f"default_model_filename: {_q(filename)}", f"max_batch_size: {max_batch_size}"]


def served_dims(tensor: TensorSpec, batched: bool) -> list[int]:
    """The dims Triton is told: without the batch axis when batching, -1 on dynamic axes."""
    dims = tensor.dims[1:] if batched else tensor.dims
    return [d if isinstance(d, int) else -1 for d in dims]


def _tensors(signature: Signature, max_batch_size: int) -> list[str]:
    lines = []
    for field_name, tensors in (("input", signature.inputs), ("output", signature.outputs)):
        lines.append(f"{field_name} [")
        for i, tensor in enumerate(tensors):
            dims = served_dims(tensor, max_batch_size > 0)
            lines += ["  {", f"    name: {_q(tensor.name)}", f"    data_type: {tensor.triton_type}"]
            if dims:
                lines.append(f"    dims: [ {', '.join(map(str, dims))} ]")
            else:  # a [batch] tensor: Triton wants one dim per request, reshaped away
                lines += ["    dims: [ 1 ]", "    reshape: { shape: [ ] }"]
            lines.append("  }" + ("," if i < len(tensors) - 1 else ""))
        lines.append("]")
    return lines


def _scheduling(options: ServingOptions) -> list[str]:
    lines = ["instance_group [", "  {", f"    count: {options.instances}", f"    kind: {DEVICES[options.device]}", "  }", "]"]
    if options.dynamic_batching:
        lines += ["dynamic_batching {", f"  max_queue_delay_microseconds: {options.max_queue_delay_us}", "}"]
    return lines


def _warmup(signature: Signature, max_batch_size: int) -> list[str]:
    """One warm-up request at the export shape: random floats, zero integers (valid token ids)."""
    lines = ["model_warmup [", "  {", '    name: "deployfuse_warmup"', "    batch_size: 1"]
    for tensor in signature.inputs:
        shape = list(signature.example_shape(tensor))
        if max_batch_size > 0:
            shape = shape[1:] or [1]
        data = "random_data: true" if tensor.triton_type in ("TYPE_FP32", "TYPE_FP16", "TYPE_BF16", "TYPE_FP64") else "zero_data: true"
        lines.append(f"    inputs {{ key: {_q(tensor.name)} value: {{ data_type: {tensor.triton_type} dims: [ {', '.join(map(str, shape))} ] {data} }} }}")
    lines += ["  }", "]"]
    return lines
