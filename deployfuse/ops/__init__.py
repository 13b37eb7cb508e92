"""The deployfuse custom ops: specs, ONNX function bodies, the native libraries behind them.

    from deployfuse.ops import SPECS, attach_functions, ort_custom_ops_library, trt_plugins_library
"""

from deployfuse.ops.functions import attach_functions
from deployfuse.ops.native import ort_custom_ops_library, trt_plugins_library
from deployfuse.ops.specs import DOMAIN, SPECS, VERSION, Attr, OpSpec

__all__ = ["DOMAIN", "SPECS", "VERSION", "Attr", "OpSpec", "attach_functions", "ort_custom_ops_library", "trt_plugins_library"]
