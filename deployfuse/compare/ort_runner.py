"""A Polygraphy runner for ONNX Runtime whose session can register the deployfuse custom-op
library (Polygraphy's `SessionFromOnnx` cannot), built by `deployfuse.backends.ort.session`.

Timing excludes host<->device copies: on the CPU EP the figure is `session.run` itself; on the
CUDA EP inputs are copied to the device and outputs bound there (IO binding) before the clock
starts, and ORT synchronises its stream before `run_with_iobinding` returns, so the wall time
of that call is device time plus launch overhead.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
from polygraphy.backend.base import BaseRunner
from polygraphy.common import TensorMetadata

from deployfuse.backends import ort as ort_backend
from deployfuse.errors import UsageError

ORT_BACKENDS = {"ort-cpu": "CPUExecutionProvider", "ort-cuda": "CUDAExecutionProvider"}
_NUMPY_TYPES = {
    "tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int16)": np.int16, "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_,
}


def numpy_type(ort_type: str) -> type:
    """The numpy dtype of an ORT type string like `tensor(float)`."""
    try:
        return _NUMPY_TYPES[ort_type]
    except KeyError:
        raise UsageError(f"input type {ort_type} is not supported by deployfuse compare") from None


class OrtRunner(BaseRunner):
    """Runs an ONNX file on the ORT CPU or CUDA execution provider."""

    def __init__(self, model: str | os.PathLike[str], backend: str = "ort-cpu", custom_ops: str | os.PathLike[str] | None = None, name: str | None = None):
        super().__init__(name=name or backend)
        if backend not in ORT_BACKENDS:
            raise UsageError(f"unknown ONNX Runtime backend {backend!r}; choose one of {', '.join(ORT_BACKENDS)}")
        self.model, self.backend, self.custom_ops = Path(model), backend, custom_ops
        self.timing = "IO binding, host clock after stream sync" if backend == "ort-cuda" else "host clock"
        self.tf32 = False  # set on activation: the CUDA EP rounds fp32 MatMul/Conv inputs to TF32

    def activate_impl(self) -> None:
        import onnxruntime as ort

        provider = ORT_BACKENDS[self.backend]
        if provider not in ort.get_available_providers():
            raise UsageError(f"{self.backend}: this onnxruntime has no {provider} (install onnxruntime-gpu on a CUDA machine)")
        providers = ort_backend.PROVIDERS[self.backend]
        try:
            self.session = ort_backend.session(self.model, providers=providers, custom_ops_library=self.custom_ops)
        except Exception as exc:
            raise UsageError(f"{self.backend}: onnxruntime cannot load {self.model}: {(str(exc).strip().splitlines() or [''])[0]}") from exc
        if provider not in self.session.get_providers():
            raise UsageError(f"{self.backend}: onnxruntime fell back from {provider} to {', '.join(self.session.get_providers())}")
        self.output_names = [o.name for o in self.session.get_outputs()]
        if provider == "CUDAExecutionProvider":
            self.tf32 = self.session.get_provider_options().get(provider, {}).get("use_tf32", "1") != "0"

    def get_input_metadata_impl(self) -> TensorMetadata:
        meta = TensorMetadata()
        for i in self.session.get_inputs():
            meta.add(i.name, numpy_type(i.type), tuple(d if isinstance(d, int) else None for d in i.shape))
        return meta

    def infer_impl(self, feed_dict) -> dict[str, np.ndarray]:
        try:
            if self.backend == "ort-cuda":
                outputs = self._infer_cuda(feed_dict)
            else:
                begin = time.perf_counter()
                outputs = self.session.run(self.output_names, dict(feed_dict))
                self.inference_time = time.perf_counter() - begin
        except UsageError:
            raise
        except Exception as exc:  # ORT raises several types for inputs it rejects
            shapes = ", ".join(f"{k}:{'x'.join(map(str, v.shape))}:{v.dtype}" for k, v in feed_dict.items())
            raise UsageError(f"{self.backend} rejects inputs {shapes}: {(str(exc).strip().splitlines() or [''])[0]}") from exc
        return dict(zip(self.output_names, outputs))

    def _infer_cuda(self, feed_dict) -> list[np.ndarray]:
        import onnxruntime as ort

        binding = self.session.io_binding()
        for name, value in feed_dict.items():
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(value), "cuda", 0))
        for name in self.output_names:
            binding.bind_output(name, "cuda", 0)
        binding.synchronize_inputs()
        begin = time.perf_counter()
        self.session.run_with_iobinding(binding)
        binding.synchronize_outputs()
        self.inference_time = time.perf_counter() - begin
        return binding.copy_outputs_to_cpu()

    def deactivate_impl(self) -> None:
        del self.session, self.output_names
