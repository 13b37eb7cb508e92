"""Latency per backend: warm-up runs, then N timed runs on one input.

Each runner times itself on the device side (see the runners: host clock on CPU, CUDA events
or IO binding on GPU; never host<->device copies). From the N samples t_1..t_N (ms):
median, p90 (linear interpolation), mean, min, max; throughput = 1000 / median inferences per
second, and samples/s = batch * throughput where batch is the leading dimension of the first input.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from deployfuse.errors import UsageError

if TYPE_CHECKING:
    from polygraphy.backend.base import BaseRunner


@dataclass
class LatencyStats:
    """Timed runs of one backend."""

    backend: str
    timing: str  # how the runner measured: "host clock", "CUDA events", ...
    warmup: int
    iterations: int
    median_ms: float
    p90_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float
    throughput_per_s: float
    samples_per_s: float
    samples_ms: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(backend: str, timing: str, warmup: int, samples_ms: list[float], batch: int) -> LatencyStats:
    """Statistics of `samples_ms` (see the module docstring)."""
    t = np.asarray(samples_ms, dtype=np.float64)
    median = float(np.median(t))
    per_s = 1000.0 / median if median > 0 else float("inf")
    return LatencyStats(backend, timing, warmup, len(t), median, float(np.percentile(t, 90)), float(t.mean()), float(t.min()), float(t.max()),
                        per_s, per_s * batch, [float(x) for x in t])


def measure(runner: BaseRunner, feed: Mapping[str, np.ndarray], warmup: int, iterations: int) -> LatencyStats:
    """Activate `runner`, run `warmup` untimed and `iterations` timed inferences on `feed`."""
    if iterations < 1 or warmup < 0:
        raise UsageError(f"--iterations must be >= 1 and --warmup >= 0 (got {iterations}, {warmup})")
    with runner:
        names = list(runner.get_input_metadata(use_numpy_dtypes=False).keys())
        inputs = {n: feed[n] for n in names}
        for _ in range(warmup):
            runner.infer(inputs, check_inputs=False)
        samples = []
        for _ in range(iterations):
            runner.infer(inputs, check_inputs=False)
            samples.append(runner.last_inference_time() * 1000.0)
    first = next(iter(inputs.values()), None)
    batch = int(first.shape[0]) if first is not None and first.ndim else 1
    return summarize(runner.name, getattr(runner, "timing", "host clock"), warmup, samples, batch)
