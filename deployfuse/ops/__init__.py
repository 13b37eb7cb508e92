"""The deployfuse custom ops: specs, ONNX function bodies, the native libraries behind them.

    from deployfuse.ops import SPECS, attach_functions, ort_custom_ops_library, trt_plugins_library

Names are imported on first use, so finding the native libraries does not load torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from deployfuse._lazy import lazy_getattr

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


__getattr__ = lazy_getattr(__name__, _LAZY)

__all__ = ["DOMAIN", "SPECS", "VERSION", "Attr", "OpSpec", "attach_functions", "ort_custom_ops_library", "trt_plugins_library"]
