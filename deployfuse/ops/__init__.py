"""The deployfuse custom ops: specs, ONNX function bodies, the native libraries behind them.

    from deployfuse.ops import SPECS, attach_functions, ort_custom_ops_library, trt_plugins_library

Names are imported on first use, so finding the native libraries does not load torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from deployfuse.ops.functions import attach_functions
    from deployfuse.ops.native import ort_custom_ops_library, trt_plugins_library
    from deployfuse.ops.schema import DOMAIN, VERSION, Attr, OpSpec
    from deployfuse.ops.specs import SPECS

_LAZY = {
    "DOMAIN": "deployfuse.ops.schema",
    "VERSION": "deployfuse.ops.schema",
    "Attr": "deployfuse.ops.schema",
    "OpSpec": "deployfuse.ops.schema",
    "SPECS": "deployfuse.ops.specs",
    "attach_functions": "deployfuse.ops.functions",
    "ort_custom_ops_library": "deployfuse.ops.native",
    "trt_plugins_library": "deployfuse.ops.native",
}


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module 'deployfuse.ops' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


__all__ = ["DOMAIN", "SPECS", "VERSION", "Attr", "OpSpec", "attach_functions", "ort_custom_ops_library", "trt_plugins_library"]
