"""QuantizeLinear/DequantizeLinear placement for the tensorrt and ort-cuda targets (int8, fp8).

Placeholder: the QDQ placement is being written; until then export refuses these combinations.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import onnx

if TYPE_CHECKING:
    from deployfuse.quantize.calibration import Calibration


def place_qdq(model: onnx.ModelProto, precision: str, calibration: Calibration, exclude: set[str]) -> onnx.ModelProto:
    """`model` with Q/DQ pairs on its GEMM-bearing nodes in `precision` ("int8" or "fp8"),
    scales calibrated on `calibration.samples`, the nodes named in `exclude` left in float."""
    raise NotImplementedError("Q/DQ placement for tensorrt and ort-cuda is not written yet")
