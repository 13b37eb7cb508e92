"""Check an ONNX model against PyTorch on fresh random inputs.

The check per output: max |onnx - torch| <= rtol * max|torch| (+ a tiny absolute floor for
outputs that are all zeros). fp32 uses rtol 1e-4: exported graphs only reorder float
arithmetic, so anything larger is a real difference. An fp16/bf16 export is judged against the
fp32 model it came from, with that precision's tolerance: PyTorch in the same precision can
overflow or round the same way the export does, so it is shown beside, not trusted.
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
    # fp16/bf16 exports: the errors against PyTorch run in that precision (the verdict is against fp32)
    same_precision_abs_error: float | None = None
    same_precision_rel_error: float | None = None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A tensor as numpy; bf16 (no numpy dtype) becomes float32."""
    t = t.detach().cpu()
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


def _errors(ref: np.ndarray, got: np.ndarray) -> tuple[float, float]:
    """(max abs error, scale = max |finite reference|); inf when shapes or NaN/Inf places differ."""
    if got.shape != ref.shape:
        return float("inf"), 0.0
    finite = np.isfinite(ref)
    same_specials = np.array_equal(finite, np.isfinite(got)) and np.array_equal(ref[~finite], got[~finite], equal_nan=True)
    scale = float(np.max(np.abs(ref[finite]))) if finite.any() else 0.0
    err = float(np.max(np.abs(got[finite] - ref[finite]))) if finite.any() else 0.0
    return (err if same_specials else float("inf")), scale


def compare_outputs(reference: Mapping[str, torch.Tensor], actual: Mapping[str, np.ndarray], rtol: float,
                    same_precision: Mapping[str, torch.Tensor] | None = None) -> list[OutputCheck]:
    """Compare each reference output with the same-named actual output; with `same_precision`
    (PyTorch in the export's precision), also record the error against it."""
    checks = []
    for name, ref_t in reference.items():
        got = np.asarray(actual[name]).astype(np.float64)
        err, scale = _errors(to_numpy(ref_t).astype(np.float64), got)
        tol = max(rtol * scale, ABS_FLOOR)
        check = OutputCheck(name, tuple(ref_t.shape), err, err / scale if scale else err, tol, err <= tol)
        if same_precision is not None:
            same_err, same_scale = _errors(to_numpy(same_precision[name]).astype(np.float64), got)
            check.same_precision_abs_error = same_err
            check.same_precision_rel_error = same_err / same_scale if same_scale else same_err
        checks.append(check)
    return checks
