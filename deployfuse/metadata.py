"""Keys deployfuse writes into an ONNX model's `metadata_props`, so facts travel with the file.

INPUT_SHAPES: JSON map input name -> the shape the model was exported with (TensorRT
profiles default to it). CUDA_PROVIDER_OPTIONS: JSON map of CUDA execution provider options
the artefact was tuned with (deployfuse's sessions apply them).
"""

from __future__ import annotations

import json

import onnx

INPUT_SHAPES = "deployfuse.input_shapes"
CUDA_PROVIDER_OPTIONS = "deployfuse.cuda_provider_options"


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
