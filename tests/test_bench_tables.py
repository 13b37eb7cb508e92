"""bench/kernel_profile.py's per-call figures (kernel time, launches, the idle time inside a call) and bench/quant_table.py's
ratios, from kernels and rows made here: the arithmetic the H200 tables are read with."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from kernel_profile import GAP_LIMIT_US, summarise  # noqa: E402
from quant_table import kernels, table  # noqa: E402


def _calls(iters: int, plan: list[tuple[str, float, float]], host_gap: float) -> list[tuple[str, float, float]]:
    """`iters` calls of `plan` (name, duration us, idle us before it), host_gap us between calls, shuffled as CUPTI may list them."""
    events, clock = [], 0.0
    for _ in range(iters):
        clock += host_gap
        for name, duration, idle in plan:
            clock += idle
            events.append((name, clock, clock + duration))
            clock += duration
    random.shuffle(events)
    return events


def test_summarise_sums_kernels_and_the_idle_time_inside_a_call():
    rng = random.Random()
    plan = [(f"k{i % 3}", rng.uniform(1, 30), rng.uniform(0.5, GAP_LIMIT_US - 1)) for i in range(7)]
    iters = rng.randint(2, 6)
    got = summarise(_calls(iters, plan, host_gap=GAP_LIMIT_US + rng.uniform(5, 100)), iters)
    assert got["gpu_ms"] == pytest.approx(sum(d for _, d, _ in plan) / 1e3, abs=1e-4)
    assert got["kernels_per_call"] == len(plan)
    # the idle time before each kernel but the first (whose wait is the host's, between calls)
    assert got["gap_ms"] == pytest.approx(sum(idle for _, _, idle in plan[1:]) / 1e3, abs=2e-4)
    for entry in got["top"]:
        name = entry["kernel"]
        assert entry["calls"] == sum(n == name for n, _, _ in plan)
        assert entry["ms"] == pytest.approx(sum(d for n, d, _ in plan if n == name) / 1e3, abs=1e-4)
    assert [e["ms"] for e in got["top"]] == sorted((e["ms"] for e in got["top"]), reverse=True)


def test_summarise_counts_no_idle_time_under_overlapping_kernels():
    got = summarise([("a", 0.0, 10.0), ("b", 2.0, 5.0), ("c", 8.0, 12.0), ("d", 15.0, 16.0)], 1)
    assert got["gap_ms"] == pytest.approx(0.003)  # d waits 3 us after a; b and c start inside a
    assert {e["kernel"]: e["gap_before_ms"] for e in got["top"]}["d"] == pytest.approx(0.003)


def _row(model: str, batch: int, variant: str, ms: float | None, dtype: str = "fp16", **extra) -> dict:
    return {"model": model, "batch": batch, "variant": variant, "dtype": dtype, "median_ms": ms, **extra}


def test_table_holds_fp8_against_the_best_alternative_and_its_own_fp16():
    rng = random.Random()
    eager, onnxscript, ours, fp8 = (round(rng.uniform(0.5, 5), 3) for _ in range(4))
    rows = [_row("bert", 8, "eager", eager), _row("bert", 8, "onnxscript-fp16+cudagraph", onnxscript),
            _row("bert", 8, "compile-reduce-overhead", 0.001, error="Fail: no"),  # a failed row is never the best
            _row("bert", 8, "deployfuse-fp16+cudagraph", ours), _row("bert", 8, "deployfuse-fp8+cudagraph", fp8, dtype="fp8")]
    line = table(rows).splitlines()[2].split(" | ")
    alt = min(eager, onnxscript)
    assert line[2].startswith(f"{alt:.3f} (")
    assert line[3] == f"{ours:.3f} (deployfuse-fp16+cudagraph)"
    assert line[4] == f"{fp8:.3f} ({fp8 / alt:.2f}, {fp8 / ours:.2f})"
    assert line[5] == "-"  # no tuned row in this run


def test_kernels_lists_the_gap_column_only_where_the_run_recorded_it():
    top = [{"kernel": "nvjet_gemm", "class": "gemm", "ms": 0.5, "calls": 12, "gap_before_ms": 0.02}]
    with_gaps = kernels([_row("vit", 64, "v", 1.0, gpu_ms=0.5, gap_ms=0.02, kernels_per_call=12, top=top)], "vit", 64, "v")
    assert "0.02 ms idle" in with_gaps and with_gaps.splitlines()[-1].endswith("0.0200 |")
    older = [{k: v for k, v in top[0].items() if k != "gap_before_ms"}]
    assert "gap" not in kernels([_row("vit", 64, "v", 1.0, gpu_ms=0.5, kernels_per_call=12, top=older)], "vit", 64, "v")


def test_the_interleaved_table_takes_the_interleaved_times():
    rng = random.Random()
    alone = {"onnxscript-fp16+cudagraph": 0.8, "eager": 5.0, "deployfuse-fp16+cudagraph": 0.75, "deployfuse-fp8-tuned+cudagraph": 0.57}
    together = {v: ms * rng.uniform(0.9, 1.1) for v, ms in alone.items()}
    rows = [_row("bert", 8, v, ms, dtype="fp8" if "fp8" in v else "fp16", interleaved_ms=together[v]) for v, ms in alone.items()]
    rows.append(_row("bert", 8, "compile-reduce-overhead", 0.1))  # timed alone only (an older run's row): not in the interleaved table
    line = table(rows, "interleaved_ms").splitlines()[2].split(" | ")
    alt, own, fp8 = together["onnxscript-fp16+cudagraph"], together["deployfuse-fp16+cudagraph"], together["deployfuse-fp8-tuned+cudagraph"]
    assert line[2] == f"{alt:.3f} (onnxscript-fp16+cudagraph)"
    assert line[5] == f"{fp8:.3f} ({fp8 / alt:.2f}, {fp8 / own:.2f})"
    assert table(rows).splitlines()[2].split(" | ")[2] == "0.100 (compile-reduce-overhead)"
