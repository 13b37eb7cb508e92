"""deployfuse: export PyTorch models to fused, verified ONNX for ONNX Runtime and TensorRT."""

from deployfuse.build import BuildResult, build_engine
from deployfuse.compare import CompareResult, compare
from deployfuse.errors import AccuracyError, DeployfuseError, UsageError
from deployfuse.inputs import DynamicAxis, InputSpec
from deployfuse.ops import ort_custom_ops_library
from deployfuse.pipeline import TARGETS, ExportResult, export
from deployfuse.report import ExportReport

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
    "InputSpec",
    "UsageError",
    "build_engine",
    "compare",
    "export",
    "ort_custom_ops_library",
]
