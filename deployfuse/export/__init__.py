"""From a PyTorch module to a clean ONNX model: output naming, the exporters, cleanup."""

from deployfuse.export.cleanup import clean
from deployfuse.export.exporter import EXPORTERS, ExportAttempt, to_onnx
from deployfuse.export.outputs import flatten_outputs

__all__ = ["EXPORTERS", "ExportAttempt", "clean", "flatten_outputs", "to_onnx"]
