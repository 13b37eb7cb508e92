"""Which TensorRT builds the engine: TensorRT proper (`tensorrt`) or TensorRT-RTX (`tensorrt_rtx`).

Polygraphy picks its TensorRT module once, when `polygraphy.backend.trt` is first imported,
from `polygraphy.config.USE_TENSORRT_RTX`. So the choice is made here, before that import, and
a process cannot switch builders after its first build.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from deployfuse.errors import UsageError

BUILDERS = ("auto", "tensorrt", "tensorrt-rtx")
_MODULES = {"tensorrt": "tensorrt", "tensorrt-rtx": "tensorrt_rtx"}


def installed_builders() -> list[str]:
    """The builders whose Python module is importable here, TensorRT proper first."""
    return [name for name, module in _MODULES.items() if importlib.util.find_spec(module) is not None]


def resolve_builder(name: str = "auto") -> str:
    """`auto` becomes TensorRT when installed, else TensorRT-RTX; a named builder must be installed."""
    if name not in BUILDERS:
        raise UsageError(f"unknown builder {name!r}; choose one of {', '.join(BUILDERS)}")
    installed = installed_builders()
    if name == "auto":
        if not installed:
            raise UsageError("neither TensorRT (pip install tensorrt) nor TensorRT-RTX (pip install tensorrt-rtx-cu13) is installed")
        return installed[0]
    if name not in installed:
        raise UsageError(f"--builder {name}: the Python module {_MODULES[name]!r} is not installed")
    return name


def activate(builder: str) -> ModuleType:
    """Point Polygraphy at `builder` and return its TensorRT module.

    Raises UsageError when this process already loaded Polygraphy's TensorRT backend for the
    other builder (Polygraphy cannot switch).
    """
    from polygraphy import config

    want_rtx = builder == "tensorrt-rtx"
    if "polygraphy.backend.trt" in sys.modules and config.USE_TENSORRT_RTX != want_rtx:
        active = "tensorrt-rtx" if config.USE_TENSORRT_RTX else "tensorrt"
        raise UsageError(f"this process already uses {active} through Polygraphy; build with --builder {active} or in a new process")
    config.USE_TENSORRT_RTX = want_rtx
    return importlib.import_module(_MODULES[builder])
