"""Keys deployfuse writes into an ONNX model's `metadata_props`, so facts travel with the file.

INPUT_SHAPES: JSON map input name -> the shape the model was exported with (TensorRT
profiles default to it). CUDA_PROVIDER_OPTIONS: JSON map of CUDA execution provider options
the artefact was tuned with (deployfuse's sessions apply them). WEIGHTS_SHA256: the
`weights_digest` of the model as loaded (before folding and casting), so `deployfuse compare`
can tell an ONNX file exported from other weights from a broken fusion. TASK: the Hugging Face
task (Optimum's name) a `save_pretrained` folder was exported for, so `deployfuse compare`
loads the folder with the same head, inputs and outputs. QUANTIZATION: an int8/fp8 export's
precision, quantization mode, calibration source and the layers its accuracy gate kept in fp32.
ACCURACY_BUDGET: the gate's budget (`deployfuse.quantize.gate.Budget.to_dict`), which `deployfuse
compare` judges the artefact by.
"""

from __future__ import annotations

import hashlib
import json

import onnx
import torch

INPUT_SHAPES = "deployfuse.input_shapes"
CUDA_PROVIDER_OPTIONS = "deployfuse.cuda_provider_options"
WEIGHTS_SHA256 = "deployfuse.weights_sha256"
TASK = "deployfuse.task"
QUANTIZATION = "deployfuse.quantization"
ACCURACY_BUDGET = "deployfuse.accuracy_budget"


def read(model: onnx.ModelProto, key: str) -> object | None:
    """The JSON value stored under `key`, or None."""
    for prop in model.metadata_props:
        if prop.key == key:
            return json.loads(prop.value)
    return None


def write(model: onnx.ModelProto, key: str, value: object) -> None:
    """Store `value` as JSON under `key`, replacing an earlier value."""
    for prop in list(model.metadata_props):
        if prop.key == key:
            model.metadata_props.remove(prop)
    model.metadata_props.add(key=key, value=json.dumps(value))


def weights_digest(module: torch.nn.Module) -> str:
    """SHA-256 of the module's state dict: every entry's name, dtype, shape and bytes, by name.

    Deterministic across processes and loads of the same weights; a different value means
    different weights (or a different architecture), whatever the file names say.
    """
    digest = hashlib.sha256()
    for name, value in sorted(module.state_dict().items()):
        digest.update(name.encode())
        if not isinstance(value, torch.Tensor):
            digest.update(repr(value).encode())  # extra state, e.g. a quantisation config
            continue
        tensor = value.detach().to("cpu")
        if tensor.is_quantized:
            tensor = tensor.dequantize()
        if tensor.layout != torch.strided:  # sparse weights: their values, densely
            tensor = tensor.to_dense()
        tensor = tensor.contiguous()
        digest.update(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
        if tensor.numel():
            digest.update(tensor.reshape(-1).view(torch.uint8).numpy())  # type: ignore[arg-type]  # ndarray is a buffer (numpy's stubs omit __buffer__ before 3.12)
    return digest.hexdigest()
