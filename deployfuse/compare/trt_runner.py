"""A Polygraphy runner for a serialized TensorRT engine, timed with CUDA events.

Inputs are copied to the device and outputs allocated there before the clock starts; the
figure is `execute_async_v3` on PyTorch's current stream between two CUDA events, so no host
copy is in it. Needs a CUDA GPU and TensorRT (or TensorRT-RTX for the GPU it built for);
plugin libraries (deployfuse's own and `--plugins`) are loaded before the engine.

What does not need an engine is kept in plain functions, tested without a GPU:
`choose_profile` (which optimisation profile holds the feed's shapes) and `host_output`
(device tensor -> numpy, bf16 as float32).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from polygraphy.backend.base import BaseRunner
from polygraphy.common import TensorMetadata

from deployfuse.errors import UsageError


def choose_profile(profiles: Sequence[Sequence[Mapping[str, Any]]], shapes: Mapping[str, Sequence[int]]) -> int:
    """The index of the first optimisation profile whose [min, max] holds every input shape.

    Args:
        profiles: per profile, {name, min, opt, max} of each dynamic input (the build record's
            and `deployfuse inspect`'s form).
        shapes: the feed's shape per input name.

    Raises:
        UsageError: no profile holds the shapes; the message lists each profile's ranges.
    """
    if not profiles:
        return 0

    def holds(profile: Sequence[Mapping[str, Any]]) -> bool:
        return all(e["name"] not in shapes or (len(shapes[e["name"]]) == len(e["min"]) and all(lo <= d <= hi for lo, d, hi in zip(e["min"], shapes[e["name"]], e["max"])))
                   for e in profile)

    for index, profile in enumerate(profiles):
        if holds(profile):
            return index
    given = ", ".join(f"{k}:{'x'.join(map(str, v))}" for k, v in shapes.items())
    ranges = "; ".join(f"profile {i + 1}: " + ", ".join(f"{e['name']} {'x'.join(map(str, e['min']))}..{'x'.join(map(str, e['max']))}" for e in p) for i, p in enumerate(profiles))
    raise UsageError(f"trt: no optimisation profile of the engine holds the inputs {given} ({ranges})")


def host_output(tensor: Any) -> np.ndarray:
    """A device output as numpy; bfloat16 (no numpy dtype) becomes float32."""
    import torch

    return (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).cpu().numpy()


class TrtRunner(BaseRunner):
    """Runs a TensorRT engine file."""

    timing = "CUDA events"

    def __init__(self, engine: str | os.PathLike[str], plugins: Sequence[str | os.PathLike[str]] = (), name: str = "trt"):
        super().__init__(name=name)
        self.engine_path, self.plugins = Path(engine), [Path(p) for p in plugins]

    def activate_impl(self) -> None:
        import torch

        from deployfuse.engine import builders, plugins as plugin_libs

        if not torch.cuda.is_available():
            raise UsageError("trt: running a TensorRT engine needs a CUDA GPU, and this machine has none")
        if not self.engine_path.is_file():
            raise UsageError(f"--engine {self.engine_path}: no such file")
        trt = builders.activate(builders.resolve_builder("auto"))
        own = plugin_libs.deployfuse_plugin_library()
        plugin_libs.load_libraries(trt, self.plugins + ([own] if own is not None and own not in self.plugins else []))
        runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        engine = runtime.deserialize_cuda_engine(self.engine_path.read_bytes())
        if engine is None:
            raise UsageError(f"--engine {self.engine_path}: TensorRT {trt.__version__} cannot deserialize it (built by another version or for another GPU?)")
        self.trt, self.torch, self.runtime, self.engine = trt, torch, runtime, engine
        self.context = engine.create_execution_context()
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        self.inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        from deployfuse.engine.inspect import engine_profiles

        self.profiles = engine_profiles(engine, [n for n in self.inputs if any(d < 0 for d in engine.get_tensor_shape(n))])
        self.profile = 0

    def _torch_dtype(self, name: str):
        return getattr(self.torch, np.dtype(self.trt.nptype(self.engine.get_tensor_dtype(name))).name)

    def get_input_metadata_impl(self) -> TensorMetadata:
        meta = TensorMetadata()
        for name in self.inputs:
            dtype = np.dtype(self.trt.nptype(self.engine.get_tensor_dtype(name)))
            meta.add(name, dtype, tuple(d if d >= 0 else None for d in self.engine.get_tensor_shape(name)))
        return meta

    def infer_impl(self, feed_dict) -> dict[str, np.ndarray]:
        torch, context = self.torch, self.context
        stream = torch.cuda.current_stream()
        profile = choose_profile(self.profiles, {k: np.shape(v) for k, v in feed_dict.items()})
        if profile != self.profile:
            context.set_optimization_profile_async(profile, stream.cuda_stream)
            self.profile = profile
        buffers = {}
        for name in self.inputs:
            tensor = torch.from_numpy(np.ascontiguousarray(feed_dict[name])).to("cuda", self._torch_dtype(name))
            if not context.set_input_shape(name, tuple(tensor.shape)):
                raise UsageError(f"trt: input {name} of shape {list(tensor.shape)} is outside the engine's optimisation profile")
            buffers[name] = tensor
        for name in self.outputs:
            buffers[name] = torch.empty(tuple(context.get_tensor_shape(name)), dtype=self._torch_dtype(name), device="cuda")
        for name, tensor in buffers.items():
            context.set_tensor_address(name, tensor.data_ptr())
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        ok = context.execute_async_v3(stream.cuda_stream)
        end.record(stream)
        end.synchronize()
        if not ok:
            raise UsageError("trt: the engine failed to execute")
        self.inference_time = start.elapsed_time(end) / 1000.0
        return {name: host_output(buffers[name]) for name in self.outputs}

    def deactivate_impl(self) -> None:
        del self.context, self.engine, self.runtime, self.trt, self.torch, self.inputs, self.outputs, self.profiles
