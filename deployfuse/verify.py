"""Check an ONNX model against PyTorch on fresh random inputs.

The check per output: max |onnx - torch| <= rtol * max|torch| (+ a tiny absolute floor for
outputs that are all zeros). fp32 uses rtol 1e-4: exported graphs only reorder float
arithmetic, so anything larger is a real difference.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

import numpy as np
import torch

DEFAULT_RTOL = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 5e-2}
ABS_FLOOR = 1e-6


@dataclass
class OutputCheck:
    """How one output compared: errors, the tolerance used and the verdict."""

    name: str
    shape: tuple[int, ...]
    max_abs_error: float
    max_rel_error: float  # max abs error / max |reference|
    tolerance: float  # the max abs error allowed
    passed: bool

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A tensor as numpy; bf16 (no numpy dtype) becomes float32."""
    t = t.detach().cpu()
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


def compare_outputs(reference: Mapping[str, torch.Tensor], actual: Mapping[str, np.ndarray], rtol: float) -> list[OutputCheck]:
    """Compare each reference output with the same-named actual output."""
    checks = []
    for name, ref_t in reference.items():
        ref = to_numpy(ref_t).astype(np.float64)
        got = np.asarray(actual[name]).astype(np.float64)
        if got.shape != ref.shape:
            checks.append(OutputCheck(name, tuple(ref.shape), float("inf"), float("inf"), 0.0, False))
            continue
        finite = np.isfinite(ref)
        same_specials = np.array_equal(finite, np.isfinite(got)) and np.array_equal(ref[~finite], got[~finite], equal_nan=True)
        scale = float(np.max(np.abs(ref[finite]))) if finite.any() else 0.0
        err = float(np.max(np.abs(got[finite] - ref[finite]))) if finite.any() else 0.0
        if not same_specials:
            err = float("inf")
        tol = max(rtol * scale, ABS_FLOOR)
        checks.append(OutputCheck(name, tuple(ref.shape), err, err / scale if scale else err, tol, err <= tol))
    return checks
