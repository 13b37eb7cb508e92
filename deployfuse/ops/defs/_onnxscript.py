"""The onnxscript opset and float type the ops' torch-op translations are written with."""

from __future__ import annotations

from typing import TypeVar, Union

from onnxscript.onnx_types import BFLOAT16, DOUBLE, FLOAT, FLOAT16
from onnxscript.values import Opset

from deployfuse.ops.schema import DOMAIN, VERSION

DF = Opset(DOMAIN, VERSION)
TFloat = TypeVar("TFloat", bound=Union[FLOAT, FLOAT16, BFLOAT16, DOUBLE])  # noqa: UP007 (onnxscript reads the annotation)
