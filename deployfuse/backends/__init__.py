"""Runtimes deployfuse drives: ONNX Runtime sessions (`ort`) and TensorRT engines (`trt`)."""
