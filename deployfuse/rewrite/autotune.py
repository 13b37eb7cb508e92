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

Interleaving cannot remove one more spread: two sessions of one and the same model run up to
5 % apart on a 2-core CPU (`SESSION_SPREAD`, bench/results/cpu_generalise.md), by where their
memory landed. So a close call, a first ratio within that spread of 1 + threshold, is timed
again on fresh session pairs (made in the other order each time), and the pair whose ratio is
the median of the three decides.

deployfuse nodes are timed on the native kernels of the custom-op library when one is given
(`backends.ort.native_library`: the kernels a user's session runs), else as their ONNX function
bodies; the decision's reason says which.

ort-cpu is timed on the CPU EP; ort-cuda on the CUDA EP, and not at all (the family is kept, the
reason says why) when this onnxruntime cannot run it; tensorrt is not timed here (its engine
fuses and times kernels itself at build time).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import onnx

from deployfuse.backends import ort as ort_backend
from deployfuse.errors import first_line
from deployfuse.targets import CUDA_PROVIDER, DEPLOYFUSE, ORT_CUDA, Target, get_target

THRESHOLD = 0.02
SESSION_SPREAD = 0.05  # fresh sessions of one model measured 0.945-1.037x of each other (2-core CPU)
CLOSE_CALL_PAIRS = 3


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
    target: str | Target,
    feed: Mapping[str, np.ndarray],
    threshold: float = THRESHOLD,
    warmup: int = 2,
    min_rounds: int = 5,
    max_rounds: int = 200,
    budget_s: float = 0.5,
    custom_ops_library: str | os.PathLike[str] | None = None,
    close_call_pairs: int = CLOSE_CALL_PAIRS,
    spread: float = SESSION_SPREAD,
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
        custom_ops_library: deployfuse's custom-op library, whose kernels then run the
            deployfuse nodes; None times their function bodies.
        close_call_pairs, spread: session pairs timed in all when the first pair's ratio lies
            within `spread` of 1 + threshold (1: never time again).

    Returns:
        The decision; a model ONNX Runtime cannot load with its optimisations on is reverted,
        an untimed target keeps the family. When `after` has deployfuse nodes, the reason ends
        with what ran them (native kernels or function bodies).
    """
    target = get_target(target)
    why = _not_timed(target)
    if why:
        return Decision(True, f"not timed: {why}")
    providers = list(target.providers)

    def sessions(first: int) -> list:
        """Fresh sessions of (before, after), the one of index `first` made first."""
        made = {i: ort_backend.session((before, after)[i], providers=providers, custom_ops_library=custom_ops_library) for i in (first, 1 - first)}
        return [made[0], made[1]]

    try:
        pair = sessions(first=0)
    except Exception as exc:  # ORT raises its own types; a family ORT cannot optimise must not ship
        return Decision(False, f"onnxruntime (optimised): {first_line(exc)}")
    if providers[0] not in pair[0].get_providers():
        return Decision(True, f"not timed: {providers[0]} did not start")
    pairs = [_interleaved(pair, feed, warmup, min_rounds, max_rounds, budget_s)]
    del pair
    if close_call(*pairs[0], threshold, spread):  # fresh pairs, made in the other order each time
        pairs += [_interleaved(sessions(first=k % 2), feed, warmup, min_rounds, max_rounds, budget_s) for k in range(1, close_call_pairs)]
    decision = decide(*median_pair(pairs), threshold)
    if len(pairs) > 1:
        decision = dataclasses.replace(decision, reason=f"{decision.reason}, the median of {len(pairs)} session pairs")
    if any(n.domain == DEPLOYFUSE for n in after.graph.node):
        decision = dataclasses.replace(decision, reason=f"{decision.reason}; {ort_backend.deployfuse_ops_note(custom_ops_library)}")
    return decision


def close_call(before_ms: float, after_ms: float, threshold: float = THRESHOLD, spread: float = SESSION_SPREAD) -> bool:
    """Whether after / before lies within `spread` of 1 + threshold: a fresh pair of sessions could decide otherwise."""
    return abs(after_ms / before_ms - (1 + threshold)) <= spread


def median_pair(pairs: list[tuple[float, float]]) -> tuple[float, float]:
    """The (before, after) pair whose after / before ratio is the median (the lower middle one of an even count)."""
    ranked = sorted(pairs, key=lambda pair: pair[1] / pair[0])
    return ranked[(len(ranked) - 1) // 2]


def _interleaved(sessions: list, feed: Mapping[str, np.ndarray], warmup: int = 2, min_rounds: int = 5, max_rounds: int = 200, budget_s: float = 0.5) -> tuple[float, float]:
    """Median ms of two sessions on `feed`, timed in alternating interleaved rounds."""
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
    return statistics.median(times[0]) * 1e3, statistics.median(times[1]) * 1e3


# prefer_nhwc without measurement: 2-D convolutions must dominate (see `nhwc_without_measurement`).
NHWC_MIN_WIDE_CONV2D = 8
NHWC_MIN_CHANNELS = 64
NHWC_MIN_SHARE = 0.75


def nhwc_without_measurement(model: onnx.ModelProto) -> bool:
    """True when the graph looks like the networks NHWC was measured faster on (ResNet-50).

    H200 measurements: ResNet-50 (53 Conv2d of 64-2048 channels) gained (fp16 2.78 -> 1.92
    ms); ViT-B/16 (one patch convolution) lost (2.32 -> 2.56 ms), and so did a small net of
    Conv2d / ConvTranspose / Conv1d layers (0.074 -> 0.118 ms, 1.6x slower), whose four
    convolutions a plain count let through. So: at least 8 Conv nodes over 2-D images (4-D
    weights) with at least 64 output channels, making up at least 3/4 of all Conv /
    ConvTranspose nodes. Conservative: a network that would gain but misses this rule gets NHWC
    through `--autotune` (measured), never by guess.
    """
    weights = {t.name: list(t.dims) for t in model.graph.initializer}
    convs = [n for n in model.graph.node if n.op_type in ("Conv", "ConvTranspose") and n.domain in ("", "ai.onnx")]
    wide = [n for n in convs if n.op_type == "Conv" and len(n.input) > 1 and len(weights.get(n.input[1], [])) == 4 and weights[n.input[1]][0] >= NHWC_MIN_CHANNELS]
    return len(wide) >= NHWC_MIN_WIDE_CONV2D and len(wide) >= NHWC_MIN_SHARE * len(convs)


def cuda_option_timer(model: onnx.ModelProto, feed: Mapping[str, np.ndarray]) -> Callable[[Mapping[str, str], Mapping[str, str]], tuple[float, float]] | None:
    """A function timing `model` on the CUDA EP under two sets of provider options (interleaved,
    median ms of each), or None when this onnxruntime has no CUDA EP."""
    if _not_timed(ORT_CUDA):
        return None

    def timer(first: Mapping[str, str], second: Mapping[str, str]) -> tuple[float, float]:
        sessions = [ort_backend.session(model, providers=list(ORT_CUDA.providers), cuda_options=dict(o)) for o in (first, second)]
        return _interleaved(sessions, feed)

    return timer


def measured_option(timer: Callable[[Mapping[str, str], Mapping[str, str]], tuple[float, float]], options: Mapping[str, str], extra: Mapping[str, str],
                    threshold: float = THRESHOLD) -> Decision:
    """Whether to add `extra` to `options`: only when it makes the model faster by more than
    `threshold` (an option that only changes speed must earn its place)."""
    without, with_extra = timer(options, {**options, **extra})
    change = f"{without:.3g} -> {with_extra:.3g} ms with {', '.join(f'{k}={v}' for k, v in extra.items())}"
    if with_extra < without * (1 - threshold):
        return Decision(True, f"faster: {change}", without, with_extra)
    return Decision(False, f"not faster: {change}", without, with_extra)


def _not_timed(target: Target) -> str:
    """Why `target` is not timed here ("" when it is)."""
    import onnxruntime as ort

    if target.runtime != "onnxruntime":
        return f"{target} is timed by its engine build, not here"
    if target.cuda and CUDA_PROVIDER not in ort.get_available_providers():
        return "this onnxruntime has no CUDA EP"
    return ""
