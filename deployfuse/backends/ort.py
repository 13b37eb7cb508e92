"""ONNX Runtime sessions as deployfuse makes them everywhere (verify, guard, compare).

One place decides the providers, the graph-optimisation level and whether the deployfuse
custom-op library is registered, so every stage runs the model the same way.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from deployfuse.backends import u8s8
from deployfuse.runtime import artefact_provider_options, resolve_providers
from deployfuse.targets import ORT_CPU, ORT_CUDA

__all__ = ["PROVIDERS", "artefact_provider_options", "deployfuse_ops_note", "native_library", "run", "session"]

PROVIDERS = {t.name: list(t.providers) for t in (ORT_CPU, ORT_CUDA)}  # by ONNX Runtime target (and compare backend) name


def session(
    model: onnx.ModelProto | str | Path | bytes,
    providers: Sequence[str | tuple[str, Mapping[str, Any]]] = ("CPUExecutionProvider",),
    optimize: bool = True,
    custom_ops_library: str | os.PathLike[str] | None = None,
    threads: int = 0,
    cuda_options: Mapping[str, str] | None = None,
):  # -> onnxruntime.InferenceSession (imported late: heavy)
    """An `onnxruntime.InferenceSession` for `model`.

    Args:
        model: a ModelProto, a path, or serialized bytes.
        providers: execution providers in priority order.
        optimize: False disables every ORT graph optimisation, so ORT's own fusions cannot
            hide (or cause) a difference when graphs are compared.
        custom_ops_library: a deployfuse custom-op library to register; None runs deployfuse
            nodes through the ONNX function bodies stored in the model.
        threads: intra-op threads; 0 lets ORT choose.
        cuda_options: CUDA EP options on top of those the artefact carries.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads = threads
    if custom_ops_library is not None:
        options.register_custom_ops_library(str(custom_ops_library))
    if "CUDAExecutionProvider" in providers:
        providers = resolve_providers(model if isinstance(model, (onnx.ModelProto, str, Path)) else onnx.load_from_string(model), providers, cuda_options)
    model = u8s8.for_this_cpu(model, providers)
    if isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()
    elif isinstance(model, Path):
        model = str(model)
    return ort.InferenceSession(model, sess_options=options, providers=list(providers))


def native_library() -> Path | None:
    """deployfuse's built custom-op library when it loads in this ONNX Runtime, else None.

    Never builds (a session must not start a compiler). Sessions given None run deployfuse
    nodes as the ONNX function bodies stored in the model: same results, not the native kernels.
    """
    import onnxruntime as ort

    from deployfuse.errors import UsageError
    from deployfuse.ops.native import ort_custom_ops_library

    try:
        library = ort_custom_ops_library(build=False)
        ort.SessionOptions().register_custom_ops_library(str(library))  # dlopen: a CUDA build needs its runtime here
    except (UsageError, RuntimeError, OSError):  # not built; onnxruntime raises its own RuntimeError subclasses
        return None
    return library


def deployfuse_ops_note(library: str | os.PathLike[str] | None) -> str:
    """How a session given `library` runs deployfuse nodes, for reports: what was timed or checked."""
    if library is None:
        return "deployfuse ops as ONNX function bodies (no custom-op library built: `deployfuse plugins build`)"
    return f"deployfuse ops on native kernels ({Path(library).name})"


def run(sess, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run a session on the inputs it declares; return outputs by name."""
    wanted = {i.name for i in sess.get_inputs()}
    feed = {k: v for k, v in inputs.items() if k in wanted}
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feed)))
