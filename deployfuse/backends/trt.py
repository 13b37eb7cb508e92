"""TensorRT engines at run time: a runtime with the plugin libraries an engine needs, the
deserialized engine, and the Polygraphy runner `deployfuse compare` times it with.

Building engines is `deployfuse.engine`'s; this is the one place that loads them (compare's trt
backend, `deployfuse inspect`, the signature `deployfuse package`/`serve` read from an engine).
A deserialization failure is a UsageError carrying TensorRT's own last error, never a crash.

What does not need an engine is kept in plain functions, tested without a GPU:
`choose_profile` (which optimisation profile holds the feed's shapes) and `host_output`
(device tensor -> numpy, bf16 as float32).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from polygraphy.backend.base import BaseRunner
from polygraphy.common import TensorMetadata

from deployfuse.errors import UsageError

__all__ = ["LoadedEngine", "TrtRunner", "choose_profile", "engine_profiles", "host_output", "load_engine"]


@dataclass
class LoadedEngine:
    """A deserialized engine with the runtime and logger it lives on (both must outlive it)."""

    trt: ModuleType
    runtime: Any  # trt.Runtime
    engine: Any  # trt.ICudaEngine
    logger: Any  # collects TensorRT's errors instead of printing them


def load_engine(engine: str | os.PathLike[str] | bytes, trt: ModuleType | None = None, plugins: Sequence[str | os.PathLike[str]] = (), own_plugins: bool = True) -> LoadedEngine:
    """Deserialize a TensorRT engine (a file or its bytes) after loading its plugin libraries.

    Args:
        engine: the serialized engine.
        trt: the TensorRT module to use (`deployfuse.engine.builders.activate`); default: TensorRT
            when installed, else TensorRT-RTX.
        plugins: plugin libraries the engine needs.
        own_plugins: also load deployfuse's own plugin library when it is built.

    Raises:
        UsageError: no TensorRT, a missing file or plugin library, or TensorRT cannot deserialize
            the engine here (another version, another GPU generation, no GPU); the message ends
            with TensorRT's own last error.
    """
    from deployfuse.engine import builders
    from deployfuse.engine.plugins import load_plugins

    if not isinstance(engine, bytes):
        if not Path(engine).is_file():
            raise UsageError(f"no such engine file: {engine}")
        engine = Path(engine).read_bytes()
    trt = trt or builders.activate(builders.resolve_builder("auto"))
    load_plugins(trt, plugins, own=own_plugins)
    logger = _error_collector(trt)
    runtime = trt.Runtime(logger)
    loaded = runtime.deserialize_cuda_engine(engine)
    if loaded is None:
        last = logger.errors[-1].strip() if logger.errors else "no reason given"
        raise UsageError(f"{trt.__name__} {trt.__version__} could not deserialize it: {last}")
    return LoadedEngine(trt, runtime, loaded, logger)


def _error_collector(trt: ModuleType) -> Any:
    """A `trt.ILogger` that keeps errors for the message and prints nothing (a machine without
    the GPU an engine is for would otherwise get TensorRT's CUDA errors on the terminal)."""

    class _Collect(trt.ILogger):  # type: ignore[name-defined]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            if severity in (trt.ILogger.Severity.ERROR, trt.ILogger.Severity.INTERNAL_ERROR):
                self.errors.append(msg)

    return _Collect()


def engine_profiles(engine: Any, dynamic_inputs: Sequence[str]) -> list[list[dict[str, Any]]]:
    """A deserialized engine's optimisation profiles in the build record's form: per profile,
    {name, min, opt, max} of each dynamic input."""
    profiles = []
    for p in range(engine.num_optimization_profiles):
        entries = []
        for name in dynamic_inputs:
            low, opt, high = engine.get_tensor_profile_shape(name, p)
            entries.append({"name": name, "min": list(low), "opt": list(opt), "max": list(high)})
        profiles.append(entries)
    return profiles


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
    """Runs a TensorRT engine file, timed with CUDA events.

    Inputs are copied to the device and outputs allocated there before the clock starts; the
    figure is `execute_async_v3` on PyTorch's current stream between two CUDA events, so no host
    copy is in it. Needs a CUDA GPU and TensorRT (or TensorRT-RTX for the GPU it built for);
    plugin libraries (deployfuse's own and `plugins`) are loaded before the engine.
    """

    timing = "CUDA events"

    def __init__(self, engine: str | os.PathLike[str], plugins: Sequence[str | os.PathLike[str]] = (), name: str = "trt"):
        super().__init__(name=name)
        self.engine_path, self.plugins = Path(engine), [Path(p) for p in plugins]

    def activate_impl(self) -> None:
        import torch

        if not torch.cuda.is_available():
            raise UsageError("trt: running a TensorRT engine needs a CUDA GPU, and this machine has none")
        if not self.engine_path.is_file():
            raise UsageError(f"--engine {self.engine_path}: no such file")
        try:
            self.loaded = load_engine(self.engine_path, plugins=self.plugins)
        except UsageError as exc:
            raise UsageError(f"--engine {self.engine_path}: {exc}") from exc
        self.trt, self.torch, engine = self.loaded.trt, torch, self.loaded.engine
        self.engine = engine
        self.context = engine.create_execution_context()
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        self.inputs = [n for n in names if engine.get_tensor_mode(n) == self.trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if engine.get_tensor_mode(n) == self.trt.TensorIOMode.OUTPUT]
        self.profiles = engine_profiles(engine, [n for n in self.inputs if any(d < 0 for d in engine.get_tensor_shape(n))])
        self.profile = 0

    def _torch_dtype(self, name: str) -> Any:
        return getattr(self.torch, np.dtype(self.trt.nptype(self.engine.get_tensor_dtype(name))).name)

    def get_input_metadata_impl(self) -> TensorMetadata:
        meta = TensorMetadata()
        for name in self.inputs:
            dtype = np.dtype(self.trt.nptype(self.engine.get_tensor_dtype(name)))
            meta.add(name, dtype, tuple(d if d >= 0 else None for d in self.engine.get_tensor_shape(name)))
        return meta

    def infer_impl(self, feed_dict: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
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
        del self.context, self.engine, self.loaded, self.trt, self.torch, self.inputs, self.outputs, self.profiles
