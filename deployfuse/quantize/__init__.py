"""Quantization to int8 / fp8 with an accuracy gate against the fp32 PyTorch model.

`calibration` reads or draws the inputs scales are calibrated on and the held-out inputs the
gate checks; `ort_int8` quantizes an ort-cpu artefact with ONNX Runtime's own quantizer;
`qdq` places QuantizeLinear/DequantizeLinear pairs for TensorRT and ort-cuda; `gate` judges a
quantized graph against fp32 and hands its most sensitive layers back to fp32 until it passes.
"""
