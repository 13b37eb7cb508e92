"""Check an ONNX model against PyTorch on fresh random inputs.

The rule is `deployfuse compare`'s (`compare.accuracy.output_stats`): an element passes when

    |onnx - torch| <= atol + rtol * |torch|

where export sets atol = rtol * max|torch| of that output (at least 1e-6, for outputs that are
all zeros): each output is judged at its own scale, so values near zero are not held to a bound
of their own size. fp32 uses rtol 1e-4: exported graphs only reorder float arithmetic, so
anything larger is a real difference. An fp16/bf16 export is judged against the fp32 model it
came from, with that precision's tolerance: PyTorch in the same precision can overflow or round
the same way the export does, so it is shown beside, not trusted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:  # deployfuse.compare imports this module (to_numpy): its accuracy module is imported late
    from deployfuse.compare.accuracy import OutputStats

DEFAULT_RTOL = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 5e-2}
ABS_FLOOR = 1e-6


@dataclass
class OutputCheck:
    """One output of one verification draw: compare's element-wise statistics against PyTorch,
    the output's error relative to its scale, and (fp16/bf16 exports) the errors against PyTorch
    run in that precision (shown, not judged)."""

    stats: OutputStats
    max_rel_error: float  # max |error| / max(max |reference|, ABS_FLOOR): the output's error at its own scale
    scale: float  # max |finite reference|
    same_precision_abs_error: float | None = None
    same_precision_rel_error: float | None = None

    @property
    def passed(self) -> bool:
        return self.stats.passed

    @property
    def near_zero(self) -> bool:
        """It passed with every reference value below ABS_FLOOR: on the floor alone, so its check proves little (a model
        whose activations vanish, or example inputs that zero it). A failed output never is (a shape mismatch has no scale)."""
        return self.passed and self.scale < ABS_FLOOR

    @property
    def tolerance(self) -> float:
        """atol: the absolute part of each element's bound (rtol x the output's max |value|)."""
        return self.stats.atol

    def to_dict(self) -> dict[str, Any]:
        s = self.stats
        return {"name": s.name, "shape": list(s.shape), "max_abs_error": s.max_abs_error, "max_rel_error": self.max_rel_error, "tolerance": s.atol,
                "rtol": s.rtol, "mismatched": s.mismatched, "passed": s.passed, "near_zero": self.near_zero,
                "same_precision_abs_error": self.same_precision_abs_error, "same_precision_rel_error": self.same_precision_rel_error}


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A tensor as numpy; bf16 (no numpy dtype) becomes float32."""
    t = t.detach().cpu()
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


def _max_error(reference: np.ndarray, actual: np.ndarray) -> tuple[float, float]:
    """(max abs error, scale = max |finite reference|); inf when shapes or NaN/Inf places differ
    (compare's rule, `special_mismatches`)."""
    from deployfuse.compare.accuracy import special_mismatches

    if reference.shape != actual.shape:
        return math.inf, 0.0
    finite = np.isfinite(reference)
    scale = float(np.abs(reference[finite]).max()) if finite.any() else 0.0
    if special_mismatches(reference, actual):
        return math.inf, scale
    return (float(np.abs(actual[finite] - reference[finite]).max()) if finite.any() else 0.0), scale


def compare_outputs(reference: Mapping[str, torch.Tensor], actual: Mapping[str, np.ndarray], rtol: float,
                    same_precision: Mapping[str, torch.Tensor] | None = None) -> list[OutputCheck]:
    """Judge each actual output against the same-named reference output (the module docstring's
    rule); with `same_precision` (PyTorch in the export's precision), also record the error
    against it."""
    from deployfuse.compare.accuracy import output_stats

    checks = []
    for name, ref_t in reference.items():
        ref, got = to_numpy(ref_t), np.asarray(actual[name])
        err, scale = _max_error(ref.astype(np.float64), got.astype(np.float64))
        stats = output_stats(name, ref, got, max(rtol * scale, ABS_FLOOR), rtol)
        check = OutputCheck(stats, err / max(scale, ABS_FLOOR), scale)
        if same_precision is not None:
            same_err, same_scale = _max_error(to_numpy(same_precision[name]).astype(np.float64), got.astype(np.float64))
            check.same_precision_abs_error = same_err
            check.same_precision_rel_error = same_err / same_scale if same_scale else same_err
        checks.append(check)
    return checks
