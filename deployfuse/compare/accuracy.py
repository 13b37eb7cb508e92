"""Accuracy of one output against the reference backend, and the Polygraphy compare function.

With reference r and actual a (float64), per element:

    abs_i = |a_i - r_i|
    rel_i = abs_i / max(|r_i|, 1e-3 * max|r|)       (the floor keeps near-zero r_i from
                                                     turning rounding noise into huge ratios)
    cosine = <a, r> / (||a|| ||r||)                  (1 when both are all zeros)

An element passes when abs_i <= atol + rtol * |r_i|; NaN and Inf must sit at the same places
with the same values. Integer and bool outputs must be equal.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from deployfuse.compare.tolerances import Tolerances

REL_FLOOR = 1e-3


@dataclass
class OutputStats:
    """How one output of a backend compares with the reference backend's."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    max_abs_error: float
    mean_abs_error: float
    median_abs_error: float
    p99_abs_error: float
    max_rel_error: float
    mean_rel_error: float
    median_rel_error: float
    p99_rel_error: float
    cosine_similarity: float
    mismatched: int  # elements beyond tolerance (or non-finite values that differ)
    atol: float
    rtol: float
    passed: bool
    reason: str = ""  # why it failed when the numbers alone cannot say (shape, missing output)

    def __bool__(self) -> bool:  # Polygraphy reads a comparison result's truth value as the verdict
        return self.passed

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _failed(name: str, ref: np.ndarray, atol: float, rtol: float, reason: str) -> OutputStats:
    inf = float("inf")
    return OutputStats(name, tuple(ref.shape), str(ref.dtype), inf, inf, inf, inf, inf, inf, inf, inf, 0.0, int(ref.size), atol, rtol, False, reason)


def special_mismatches(reference: np.ndarray, actual: np.ndarray) -> int:
    """Elements (same shapes) where NaN/Inf differ: a non-finite reference value the actual does
    not repeat (NaN matches NaN), or a finite one the actual makes non-finite."""
    finite = np.isfinite(reference)
    kept = (reference == actual) | (np.isnan(reference) & np.isnan(actual))
    return int(np.count_nonzero(~finite & ~kept)) + int(np.count_nonzero(finite & ~np.isfinite(actual)))


def output_stats(name: str, reference: np.ndarray, actual: np.ndarray | None, atol: float, rtol: float) -> OutputStats:
    """Compare `actual` with `reference` elementwise (see the module docstring)."""
    ref = np.asarray(reference)
    if actual is None:
        return _failed(name, ref, atol, rtol, "output missing")
    got = np.asarray(actual)
    if got.shape != ref.shape:
        return _failed(name, ref, atol, rtol, f"shape {list(got.shape)} instead of {list(ref.shape)}")
    if not (np.issubdtype(ref.dtype, np.floating) or np.issubdtype(got.dtype, np.floating)):
        atol = rtol = 0.0  # token ids, masks, argmax: exact
    r, a = ref.astype(np.float64).ravel(), got.astype(np.float64).ravel()
    special_bad = special_mismatches(r, a)
    both = np.isfinite(r) & np.isfinite(a)
    r, a = r[both], a[both]
    if r.size == 0:
        return OutputStats(name, tuple(ref.shape), str(ref.dtype), 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, special_bad, atol, rtol, special_bad == 0)
    diff = np.abs(a - r)
    scale = float(np.max(np.abs(r)))
    rel = diff / np.maximum(np.abs(r), max(REL_FLOOR * scale, float(np.finfo(np.float64).tiny)))
    norms = float(np.linalg.norm(a)) * float(np.linalg.norm(r))
    cosine = float(np.dot(a, r) / norms) if norms > 0 else (1.0 if not a.any() and not r.any() else 0.0)
    mismatched = int(np.count_nonzero(diff > atol + rtol * np.abs(r))) + special_bad
    p_abs = np.percentile(diff, [50, 99])
    p_rel = np.percentile(rel, [50, 99])
    return OutputStats(
        name, tuple(ref.shape), str(ref.dtype),
        float(diff.max()), float(diff.mean()), float(p_abs[0]), float(p_abs[1]),
        float(rel.max()), float(rel.mean()), float(p_rel[0]), float(p_rel[1]),
        cosine, mismatched, atol, rtol, mismatched == 0,
    )


class StatsCompareFunc:
    """A Polygraphy `compare_func`: (reference IterationResult, other) -> {output: OutputStats}.

    Outputs are the reference's; an output the other backend lacks fails. `dtypes` names the
    precision each output is computed in (from the ONNX graph) to choose default tolerances;
    float32 outputs of the runners named in `tf32_runners` get the TF32 defaults.
    """

    def __init__(self, tolerances: Tolerances, dtypes: dict[str, str], tf32_runners: frozenset[str] = frozenset()):
        self.tolerances, self.dtypes, self.tf32_runners = tolerances, dtypes, tf32_runners

    def __call__(self, reference, actual) -> OrderedDict[str, OutputStats]:
        results: OrderedDict[str, OutputStats] = OrderedDict()
        for name, ref in reference.items():
            dtype = self.dtypes.get(name, str(np.asarray(ref).dtype))
            if dtype == "float32" and getattr(actual, "runner_name", None) in self.tf32_runners:
                dtype = "tf32"
            atol, rtol = self.tolerances.for_output(name, dtype)
            results[name] = output_stats(name, ref, actual[name] if name in actual else None, atol, rtol)
        return results
