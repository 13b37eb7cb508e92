"""TensorRT plugin libraries: finding deployfuse's own, loading any, and listing what they provide.

A library is loaded with `IPluginRegistry.load_library` (a library exporting `getCreators`,
which works for TensorRT and TensorRT-RTX alike), falling back to a plain `dlopen` for libraries
that register their creators from static constructors (Polygraphy's `LoadPlugins`).

TensorRT-RTX's ONNX parser imports an IPluginV3 plugin only after a `dlopen("libtensorrt_rtx.so")`
(for `getPrivateApi_INTERNAL`), a name its wheel does not ship (it has libtensorrt_rtx.so.1), and
the failure aborts the process. glibc answers a dlopen from an already loaded object whose
SONAME matches, so an empty shim with that SONAME and the real library as its dependency (a
dlsym through a handle searches its dependencies) makes plugin import work.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from deployfuse.errors import UsageError


def deployfuse_plugin_library() -> Path | None:
    """deployfuse's own TensorRT plugin library, when it is built (None otherwise)."""
    from deployfuse.ops.native import trt_plugins_library

    try:
        path = trt_plugins_library(build=False)  # never compile CUDA behind a build's back
    except Exception:  # not built: the ops run from their ONNX function bodies instead
        return None
    return Path(path) if path is not None and Path(path).is_file() else None


def load_plugins(trt: ModuleType, libraries: Sequence[str | os.PathLike[str]] = (), own: bool = True) -> list[Path]:
    """Load `libraries` into `trt`'s plugin registry, and deployfuse's own plugin library when it
    is built and `own` is set (an engine with deployfuse plugin layers needs it to build or
    deserialize).

    Returns the libraries loaded; UsageError names one that is missing or fails to load.
    """
    paths = [Path(p) for p in libraries]
    mine = deployfuse_plugin_library() if own else None
    if mine is not None and mine not in paths:
        paths.append(mine)
    load_libraries(trt, paths)
    return paths


_LOADED: set[tuple[str, Path]] = set()


def load_libraries(trt: ModuleType, paths: list[Path]) -> None:
    """Load each plugin library into `trt`'s plugin registry; UsageError names one that fails."""
    if paths and trt.__name__ == "tensorrt_rtx":
        _load_rtx_parser_shim()
    registry = trt.get_plugin_registry()
    for path in paths:
        if not path.is_file():
            raise UsageError(f"--plugins {path}: no such file")
        key = (trt.__name__, path.resolve())
        if key in _LOADED:
            continue  # a second load_library of the same creators only logs an error
        try:
            loaded = registry.load_library(os.fspath(path)) is not None
        except Exception:  # older bindings raise instead of returning None
            loaded = False
        if not loaded:
            try:
                ctypes.CDLL(os.fspath(path), mode=ctypes.RTLD_GLOBAL)
            except OSError as exc:
                raise UsageError(f"--plugins {path}: cannot load: {exc}") from exc
        _LOADED.add(key)


def registered_plugins(trt: ModuleType) -> set[tuple[str, str]]:
    """Every (plugin name, namespace) the registry can create now."""
    return {(c.name, c.plugin_namespace) for c in trt.get_plugin_registry().all_creators}


_RTX_SHIM = "libtensorrt_rtx.so"


@functools.cache
def _load_rtx_parser_shim() -> None:
    """Load a shim with SONAME libtensorrt_rtx.so over the wheel's libtensorrt_rtx.so.1 (see the
    module docstring); UsageError when it cannot be made, since parsing would abort instead."""
    spec = importlib.util.find_spec("tensorrt_rtx_libs")
    real = sorted(Path(next(iter(spec.submodule_search_locations))).glob("libtensorrt_rtx.so.*")) if spec and spec.submodule_search_locations else []
    if not real or (real[0].parent / _RTX_SHIM).exists():
        return  # not the wheel layout, or the unversioned name exists: nothing to work around
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        raise UsageError("TensorRT-RTX needs a C compiler (cc) here to import plugins: its wheel lacks libtensorrt_rtx.so")
    with tempfile.TemporaryDirectory() as tmp:
        src, shim = Path(tmp) / "shim.c", Path(tmp) / _RTX_SHIM
        src.write_text("/* deployfuse: SONAME shim for TensorRT-RTX's parser */\n")
        cmd = [compiler, "-shared", "-fPIC", os.fspath(src), "-o", os.fspath(shim), f"-Wl,-soname,{_RTX_SHIM}", "-Wl,--no-as-needed", os.fspath(real[0])]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise UsageError(f"cannot build the TensorRT-RTX plugin-import shim: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")
        ctypes.CDLL(os.fspath(shim), mode=ctypes.RTLD_GLOBAL)  # stays mapped after the file is gone
