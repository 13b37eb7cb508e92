"""Runtimes deployfuse drives: ONNX Runtime sessions (and TensorRT engines)."""
