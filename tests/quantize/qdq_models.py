"""The float graphs the Q/DQ tests quantize: the zoo's tiny BERT and ResNet-18, exported once
per test process (fused for the tensorrt target, and BERT also unfused), with the calibration
the export's quantize step would draw for them."""

from __future__ import annotations

import functools
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
import zoo

from deployfuse.quantize.calibration import Calibration, random_calibration

_ROOT = tempfile.TemporaryDirectory(prefix="deployfuse-qdq-tests.")  # removed when the process ends


@dataclass(frozen=True)
class Exported:
    """A zoo model, its example inputs, its ONNX export and the calibration drawn for it."""

    module: torch.nn.Module
    example: dict[str, torch.Tensor]
    path: Path
    calibration: Calibration

    @property
    def onnx(self) -> onnx.ModelProto:
        return onnx.load(self.path)


@functools.cache
def exported(name: str, fuse: bool = True, precision: str = "fp32") -> Exported:
    """`zoo.ZOO[name]` exported with static shapes for `--target tensorrt` in `precision` (not
    verified: the export tests do that); `module` stays fp32."""
    import deployfuse

    torch.manual_seed(0)
    module, example = zoo.ZOO[name].build()
    path = Path(_ROOT.name) / f"{name}{'' if fuse else '_unfused'}_{precision}.onnx"
    deployfuse.export(module, path, example_inputs=example, target="tensorrt", fuse=fuse, verify=False, precision=precision)
    return Exported(module, example, path, random_calibration(example, module, seed=0))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
