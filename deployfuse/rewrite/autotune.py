"""Autotuning: keep a fusion family only if it does not make the model slower on the target.

A fusion is not a speed-up by itself (on 2 CPU threads onnxscript's fusions made BERT-base
1.5x slower), so after the guard accepted a family, the model before and after it are timed on
the target's runtime as a user runs it (ONNX Runtime, normal graph optimisations, the target's
execution providers) and the family is kept only when

    t_after <= t_before * (1 + threshold)          t = median ms over the timed rounds

The threshold (2 % by default) keeps a family that is as fast within noise: a fused graph is
also smaller and what the other runtimes expect. Runs are interleaved, one run of each model
per round after warm-up, so load from other processes on a shared machine falls on both alike;
which model goes first alternates, so neither always runs in the wake of the other's spinning
ORT thread pool (without it, a tiny BERT's families flipped between 10 % faster and 10 %
slower from one run to the next). Rounds go on until `budget_s` is spent (at least
`min_rounds`, at most `max_rounds`): a small model gets many rounds, BERT-base stays cheap.

ort-cpu is timed on the CPU EP; ort-cuda on the CUDA EP, and not at all (the family is kept, the
reason says why) when this onnxruntime cannot run it; tensorrt is not timed here (its engine
fuses and times kernels itself at build time).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx

from deployfuse.backends import ort as ort_backend
from deployfuse.rewrite.guard import first_line

THRESHOLD = 0.02


@dataclass(frozen=True)
class Decision:
    """Whether a family stays, and why.

    Attributes:
        keep: True when the family's rewrites stay in the model.
        reason: one line, e.g. "slower: 12.3 -> 12.9 ms (> +2%)" or "not timed: ...".
        before_ms: median ms of the model before the family (None when not timed).
        after_ms: median ms of the model after it (None when not timed).
    """

    keep: bool
    reason: str
    before_ms: float | None = None
    after_ms: float | None = None


def decide(before_ms: float, after_ms: float, threshold: float = THRESHOLD) -> Decision:
    """Keep when `after_ms <= before_ms * (1 + threshold)`: the family is not slower."""
    change = f"{before_ms:.3g} -> {after_ms:.3g} ms"
    if after_ms <= before_ms * (1 + threshold):
        return Decision(True, f"{'faster' if after_ms < before_ms else 'not slower'}: {change}", before_ms, after_ms)
    return Decision(False, f"slower: {change} (> +{threshold:.0%})", before_ms, after_ms)


def time_family(
    before: onnx.ModelProto,
    after: onnx.ModelProto,
    target: str,
    feed: Mapping[str, np.ndarray],
    threshold: float = THRESHOLD,
    warmup: int = 2,
    min_rounds: int = 5,
    max_rounds: int = 200,
    budget_s: float = 0.5,
) -> Decision:
    """Time `before` and `after` on `target`'s runtime and decide with `decide`.

    Args:
        before: the model before the family.
        after: the model after it (the guard accepted it).
        target: one of `TARGETS`.
        feed: the inputs both models are timed on.
        threshold: the relative slow-down still accepted.
        warmup: untimed runs of each model first.
        min_rounds, max_rounds, budget_s: interleaved rounds, until `budget_s` seconds of
            timed rounds are spent.

    Returns:
        The decision; a model ONNX Runtime cannot load with its optimisations on is reverted,
        an untimed target keeps the family.
    """
    why = _not_timed(target)
    if why:
        return Decision(True, f"not timed: {why}")
    providers = ort_backend.PROVIDERS[target]
    try:
        sessions = [ort_backend.session(m, providers=providers) for m in (before, after)]
    except Exception as exc:  # ORT raises its own types; a family ORT cannot optimise must not ship
        return Decision(False, f"onnxruntime (optimised): {first_line(exc)}")
    if providers[0] not in sessions[0].get_providers():
        return Decision(True, f"not timed: {providers[0]} did not start")
    for sess in sessions:
        for _ in range(warmup):
            ort_backend.run(sess, feed)
    times: list[list[float]] = [[], []]
    deadline = time.perf_counter() + budget_s
    while len(times[0]) < max_rounds and (len(times[0]) < min_rounds or time.perf_counter() < deadline):
        order = (0, 1) if len(times[0]) % 2 == 0 else (1, 0)
        for sess, spent in ((sessions[i], times[i]) for i in order):
            start = time.perf_counter()
            ort_backend.run(sess, feed)
            spent.append(time.perf_counter() - start)
    return decide(statistics.median(times[0]) * 1e3, statistics.median(times[1]) * 1e3, threshold)


def _not_timed(target: str) -> str:
    """Why `target` is not timed here ("" when it is)."""
    import onnxruntime as ort

    if target == "tensorrt":
        return "tensorrt is timed by its engine build, not here"
    if target == "ort-cuda" and "CUDAExecutionProvider" not in ort.get_available_providers():
        return "this onnxruntime has no CUDA EP"
    return ""
