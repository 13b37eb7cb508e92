"""bench/gpu_models.py's interleaved_medians: every variant warmed up, then timed in rounds that each begin at another
variant with one untimed call of each, each call's time its own (a fake clock here, so the medians are exact and the test
times nothing)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import gpu_models  # noqa: E402


def test_interleaved_medians_rotates_the_rounds_and_times_each_call(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(gpu_models.time, "perf_counter", lambda: clock[0])
    order: list[str] = []

    def variant(name: str, ms: list[float]):
        calls = iter(ms)

        def fn() -> None:
            order.append(name)
            clock[0] += next(calls) / 1e3

        return fn

    warmup, rounds, calls = 2, 3, 1
    # each variant: warm-up calls, then per round one untimed call (9 ms: switching costs) and one timed one
    fns = {"a": variant("a", [9.0] * warmup + [9.0, 1.0, 9.0, 5.0, 9.0, 1.0]), "b": variant("b", [9.0] * warmup + [9.0, 3.0] * rounds),
           "c": variant("c", [9.0] * warmup + [9.0, 7.0, 9.0, 2.0, 9.0, 2.0])}
    syncs = []
    medians = gpu_models.interleaved_medians(fns, rounds, calls, warmup, sync=lambda: syncs.append(1))
    assert order[: 3 * warmup] == ["a"] * warmup + ["b"] * warmup + ["c"] * warmup  # warm-up calls are not timed
    rest = order[3 * warmup :]
    assert rest == [n for n in "aabbcc" + "bbccaa" + "ccaabb"]  # round r begins at the r-th, each with one untimed call
    assert len(syncs) == 1 + rounds * 3 * (1 + calls)  # after the warm-up, and after every call of a round
    assert medians == pytest.approx({"a": 1.0, "b": 3.0, "c": 2.0})  # the untimed calls count nowhere; one slow timed call moves no median
