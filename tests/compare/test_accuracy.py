"""Accuracy statistics and tolerances on arrays whose differences are known by construction."""

from __future__ import annotations

import numpy as np
import pytest

from deployfuse.compare.accuracy import StatsCompareFunc, output_stats
from deployfuse.compare.latency import summarize
from deployfuse.compare.tolerances import Tolerances, parse_tolerance
from deployfuse.errors import UsageError


@pytest.fixture
def reference() -> np.ndarray:
    return np.random.default_rng().standard_normal((4, 32)).astype(np.float32)


def test_equal_arrays_pass_with_zero_error(reference):
    s = output_stats("y", reference, reference.copy(), 1e-4, 1e-3)
    assert s.passed and s.max_abs_error == 0 and s.mismatched == 0 and s.cosine_similarity == pytest.approx(1.0)


def test_one_element_off_is_counted_and_measured(reference):
    actual = reference.copy()
    delta = 10 * (1e-4 + 1e-3 * abs(float(reference[2, 5])))
    actual[2, 5] += delta
    s = output_stats("y", reference, actual, 1e-4, 1e-3)
    assert not s.passed and s.mismatched == 1
    assert s.max_abs_error == pytest.approx(delta, rel=1e-5)
    assert s.mean_abs_error == pytest.approx(delta / reference.size, rel=1e-4)
    assert s.median_abs_error == 0 and s.p99_abs_error < s.max_abs_error
    assert output_stats("y", reference, actual, 2 * delta, 0.0).passed  # a wider atol accepts it


def test_cosine_of_negated_output_is_minus_one(reference):
    assert output_stats("y", reference, -reference, 1e-4, 1e-3).cosine_similarity == pytest.approx(-1.0)


def test_nan_where_reference_is_finite_fails(reference):
    actual = reference.copy()
    actual[0, 0] = np.nan
    s = output_stats("y", reference, actual, 1.0, 1.0)
    assert not s.passed and s.mismatched == 1
    same = reference.copy()
    same[1, 1] = np.inf
    assert output_stats("y", same, same.copy(), 1e-4, 1e-3).passed  # matching Inf is fine


def test_shape_and_missing_output_fail_with_a_reason(reference):
    assert "shape" in output_stats("y", reference, reference[:2], 1, 1).reason
    assert output_stats("y", reference, None, 1, 1).reason == "output missing"


def test_integer_outputs_must_be_equal():
    ids = np.arange(12).reshape(3, 4)
    changed = ids.copy()
    changed[1, 1] += 1
    assert output_stats("ids", ids, ids.copy(), 5.0, 5.0).passed
    assert not output_stats("ids", ids, changed, 5.0, 5.0).passed  # tolerances do not apply to integers


def test_tolerances_per_output_and_defaults_by_dtype():
    tol = Tolerances.parse(["1e-2", "logits:0.5"], ["logits:0"])
    assert tol.for_output("logits", "float32") == (0.5, 0.0)
    assert tol.for_output("hidden", "float32") == (1e-2, 1e-3)
    assert Tolerances().for_output("x", "float16")[0] > Tolerances().for_output("x", "float32")[0]
    with pytest.raises(UsageError, match="names output 'nope'"):
        Tolerances.parse(["nope:1"]).check_names(["hidden"])
    for bad in ("abc", "x:-1", "x:nan"):
        with pytest.raises(UsageError):
            parse_tolerance(bad, "--atol")


def test_tf32_runners_get_tf32_tolerances_on_fp32_outputs(reference):
    """An error of TF32's size fails the fp32 defaults, passes for a runner that computed in TF32,
    and an error ten times larger still fails there; fp16 outputs keep their own defaults."""
    from polygraphy.comparator import IterationResult

    tf32_atol, tf32_rtol = Tolerances().for_output("y", "tf32")
    actual = reference.copy()
    actual[0, 0] += 0.5 * (tf32_atol + tf32_rtol * abs(float(reference[0, 0])))
    compare = StatsCompareFunc(Tolerances(), {"y": "float32"}, tf32_runners=frozenset({"ort-cuda"}))
    ref = IterationResult({"y": reference}, runner_name="torch")
    assert not compare(ref, IterationResult({"y": actual}, runner_name="ort-cpu"))["y"].passed
    assert compare(ref, IterationResult({"y": actual}, runner_name="ort-cuda"))["y"].passed
    actual[0, 0] += 10 * (tf32_atol + tf32_rtol * abs(float(reference[0, 0])))
    assert not compare(ref, IterationResult({"y": actual}, runner_name="ort-cuda"))["y"].passed
    half = StatsCompareFunc(Tolerances(), {"y": "float16"}, tf32_runners=frozenset({"ort-cuda"}))
    assert half(ref, IterationResult({"y": reference}, runner_name="ort-cuda"))["y"].atol == Tolerances().for_output("y", "float16")[0]


def test_latency_summary():
    samples = list(np.random.default_rng().uniform(1.0, 3.0, size=50))
    s = summarize("ort-cpu", "host clock", 2, samples, batch=8)
    assert s.min_ms <= s.median_ms <= s.p90_ms <= s.max_ms
    assert s.median_ms == pytest.approx(float(np.median(samples)))
    assert s.samples_per_s == pytest.approx(8 * 1000.0 / s.median_ms)
