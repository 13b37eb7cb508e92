"""deployfuse: export PyTorch models to fused, verified ONNX for ONNX Runtime and TensorRT."""

import sys
import types
from typing import TYPE_CHECKING

from deployfuse._lazy import lazy_getattr

if TYPE_CHECKING:
    from deployfuse.compare import CompareResult, compare
    from deployfuse.engine import BuildResult, build_engine
    from deployfuse.errors import AccuracyError, DeployfuseError, UsageError
    from deployfuse.inputs import DynamicAxis, InputSpec
    from deployfuse.ops import ort_custom_ops_library
    from deployfuse.pipeline import TARGETS, ExportResult, export
    from deployfuse.report import ExportReport
    from deployfuse.runtime import InferenceSession

# Public names -> the module defining them, imported on first use: `import deployfuse` (and the
# CLI, whose first import is this package) stays light, so a Ctrl-C while torch loads reaches
# the CLI's handler instead of printing a traceback.
_LAZY = {
    "BuildResult": "deployfuse.engine",
    "build_engine": "deployfuse.engine",
    "CompareResult": "deployfuse.compare",
    "compare": "deployfuse.compare",
    "AccuracyError": "deployfuse.errors",
    "DeployfuseError": "deployfuse.errors",
    "UsageError": "deployfuse.errors",
    "DynamicAxis": "deployfuse.inputs",
    "InputSpec": "deployfuse.inputs",
    "ort_custom_ops_library": "deployfuse.ops",
    "TARGETS": "deployfuse.pipeline",
    "ExportResult": "deployfuse.pipeline",
    "export": "deployfuse.pipeline",
    "ExportReport": "deployfuse.report",
    "InferenceSession": "deployfuse.runtime",
}


__getattr__ = lazy_getattr(__name__, _LAZY)


class _Package(types.ModuleType):
    """The package keeps `deployfuse.export` and `deployfuse.compare` the functions when their
    same-named subpackages are imported (the import system would bind the modules here)."""

    def __setattr__(self, name: str, value: object) -> None:
        if name in _LAZY and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


__version__ = "0.1.0"

__all__ = [
    "TARGETS",
    "AccuracyError",
    "BuildResult",
    "CompareResult",
    "DeployfuseError",
    "DynamicAxis",
    "ExportReport",
    "ExportResult",
    "InferenceSession",
    "InputSpec",
    "UsageError",
    "build_engine",
    "compare",
    "export",
    "ort_custom_ops_library",
]
