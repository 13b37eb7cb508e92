"""A Polygraphy runner for the PyTorch model (Polygraphy's `PytRunner` does not work with its
`Comparator`: it returns tensors the comparator cannot store and names no outputs).

The model runs as loaded (usually fp32): it is the reference an exported artefact is judged
against, so floating inputs are cast to the model's own dtype, whatever precision the ONNX
graph computes in. Outputs are named like the ONNX outputs (`flatten_outputs`).
"""

from __future__ import annotations

import time

import numpy as np
import torch
from polygraphy.backend.base import BaseRunner
from polygraphy.common import TensorMetadata

from deployfuse.errors import UsageError
from deployfuse.export import flatten_outputs
from deployfuse.loading import LoadedModel
from deployfuse.verify import to_numpy


class TorchRunner(BaseRunner):
    """Runs a `LoadedModel` on CPU (host clock) or CUDA (CUDA events on the current stream)."""

    def __init__(self, model: LoadedModel, input_metadata: TensorMetadata, device: str = "cpu", name: str = "torch"):
        super().__init__(name=name)
        self.model, self.input_metadata, self.device = model, input_metadata, torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise UsageError("--torch-device cuda: this PyTorch has no CUDA device")
        self.timing = "CUDA events" if self.device.type == "cuda" else "host clock"

    def activate_impl(self) -> None:
        self.model.module.to(self.device)
        params = [p for p in self.model.module.parameters() if p.is_floating_point()] if isinstance(self.model.module, torch.nn.Module) else []
        self.float_dtype = params[0].dtype if params else torch.float32

    def get_input_metadata_impl(self) -> TensorMetadata:
        return self.input_metadata

    def infer_impl(self, feed_dict) -> dict[str, np.ndarray]:
        inputs = {}
        for name, value in feed_dict.items():
            tensor = torch.from_numpy(np.ascontiguousarray(value)).to(self.device)
            inputs[name] = tensor.to(self.float_dtype) if tensor.is_floating_point() else tensor
        try:
            if self.device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                result = self.model(inputs)
                end.record()
                end.synchronize()
                self.inference_time = start.elapsed_time(end) / 1000.0
            else:
                begin = time.perf_counter()
                result = self.model(inputs)
                self.inference_time = time.perf_counter() - begin
        except Exception as exc:
            shapes = ", ".join(f"{k}:{'x'.join(map(str, v.shape))}:{str(v.dtype).removeprefix('torch.')}" for k, v in inputs.items())
            raise UsageError(f"the PyTorch model rejects inputs {shapes}: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}") from exc
        return {name: to_numpy(t) for name, t in flatten_outputs(result).items()}

    def deactivate_impl(self) -> None:
        self.model.module.to("cpu")
        del self.float_dtype
