"""TensorRT plugin libraries: finding deployfuse's own, loading any, and listing what they provide.

A library is loaded with `IPluginRegistry.load_library` (a library exporting `getCreators`,
which works for TensorRT and TensorRT-RTX alike), falling back to a plain `dlopen` for libraries
that register their creators from static constructors (Polygraphy's `LoadPlugins`).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from types import ModuleType

from deployfuse.errors import UsageError


def deployfuse_plugin_library() -> Path | None:
    """deployfuse's own TensorRT plugin library, when it is built (None otherwise)."""
    try:
        from deployfuse.ops import trt_plugins_library  # type: ignore[attr-defined]
    except ImportError:
        return None
    try:
        path = trt_plugins_library()
    except Exception:  # not built: the ops run from their ONNX function bodies instead
        return None
    return Path(path) if path is not None and Path(path).is_file() else None


def load_libraries(trt: ModuleType, paths: list[Path]) -> None:
    """Load each plugin library into `trt`'s plugin registry; UsageError names one that fails."""
    registry = trt.get_plugin_registry()
    for path in paths:
        if not path.is_file():
            raise UsageError(f"--plugins {path}: no such file")
        try:
            if registry.load_library(os.fspath(path)) is not None:
                continue
        except Exception:  # older bindings raise instead of returning None
            pass
        try:
            ctypes.CDLL(os.fspath(path), mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            raise UsageError(f"--plugins {path}: cannot load: {exc}") from exc


def registered_plugins(trt: ModuleType) -> set[tuple[str, str]]:
    """Every (plugin name, namespace) the registry can create now."""
    return {(c.name, c.plugin_namespace) for c in trt.get_plugin_registry().all_creators}
