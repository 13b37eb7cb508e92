"""The accuracy gate: a quantized graph is judged against the fp32 PyTorch model, per output.

Per output, on the calibration samples and on the held-out ones: max |error|, p99 |error|, the
relative error max|error| / max|reference| (one number per output, unlike `--rtol`'s element-wise
rule |a - r| <= atol + rtol * |r|) and the cosine similarity of the flattened outputs. A `Budget` bounds the worst of each over all samples;
with `batch=N` also over the samples run N at a time as one batch (dynamic int8's activation scales
span the batch: GPT-2 passed one sample at a time and measured 2.26e-2 at batch 8). Over budget, the
most sensitive quantized layers go back to fp32 (fp16 for fp8 on ort-cuda): how many is searched
for by doubling the count, then bisecting, on a `Switchboard` where the quantizer offers one, else
on the quantized artefacts themselves, up to a quarter of the layers (at least 4).

A layer's sensitivity is the gate's own measure with that layer alone quantized, on the first
calibration samples: how far over (or how close to) the budget the model outputs get, as the
largest of (1 - cosine) / (1 - budget cos) and error / bound. It is measured once, the first time
the gate fails. Where the quantizer offers a `Switchboard` (dynamic int8 on ort-cpu,
`ort_int8.switchboard`; fp8 Q/DQ, `fp8_switchboard`), the ranking and the search for how many of
the most sensitive layers go back run on one session of it, and only the choice found is quantized
for real; BERT-base (72 layers, 2 cores) ranked in ~70 s instead of ~685 s in int8, and its fp8
ort-cuda export (48 GEMMs, default budget) gave up after ~90 s instead of ~214 s (ranking ~27 s
instead of ~143 s; its 12 most sensitive GEMMs 9 of the artefacts' 12). A cheaper proxy, the
error each layer adds to its own output tensor (one fp32 pass), ranks badly: on a tiny BERT it put the query and key projections first, whose error softmax
all but removes; on BERT-base every layer's own error is 1.0-1.4 %, and falling back by that order
was still over budget at the bound of 18 layers where this ranking needs 10 (nearest rounding, bench/results/cpu_int8.md).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper

from deployfuse.backends import ort as ort_backend
from deployfuse.errors import AccuracyError, UsageError
from deployfuse.quantize.calibration import Calibration

log = logging.getLogger(__name__)
PROBE_SAMPLES = 2  # calibration samples the per-layer sensitivity is measured on
GATE_SAMPLES = 16  # at most this many calibration samples (and held-out samples) are judged
BUDGET_HELP = ("accuracy budget of a quantized export, checked per output against PyTorch fp32 on calibration and held-out inputs: "
               "comma-separated KEY=VALUE with cos (minimum cosine similarity), rel (maximum max|error| / max|reference|), "
               "abs (maximum |error|), p99 (maximum 99th-percentile |error|), batch (also judge the samples run together in batches of N, "
               "as a dynamic-batch model will run: dynamic int8's activation scales span the batch); default cos=0.999,rel=2e-2")
_KEYS = ("cos", "rel", "abs", "p99", "batch")


@dataclass(frozen=True)
class Budget:
    """The worst each output may be: cosine at least `cos`, relative error at most `rel`, and,
    when set, max |error| at most `abs` and p99 |error| at most `p99`; with `batch` >= 2, on each
    sample run alone and also run among `batch` samples as one batch (`_one_batch`)."""

    cos: float = 0.999
    rel: float = 2e-2
    abs: float | None = None
    p99: float | None = None
    batch: int = 0

    @classmethod
    def parse(cls, text: str) -> Budget:
        """`cos=0.999,rel=2e-2` (any of cos, rel, abs, p99, and batch beside at least one of them; unnamed keys keep their defaults)."""
        values: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, _, number = part.partition("=")
            key = key.strip().lower()
            try:
                value = float(number)
            except ValueError:
                value = math.nan
            if key not in _KEYS or not math.isfinite(value) or value < 0 or (key == "cos" and value > 1) or (key == "batch" and value != int(value)):
                raise UsageError(f"--accuracy-budget {text!r}: expected KEY=VALUE pairs with KEY in {', '.join(_KEYS)} "
                                 "(cos between 0 and 1, batch a whole number, the others >= 0), e.g. cos=0.999,rel=2e-2")
            values[key] = value
        if not set(values) - {"batch"}:
            raise UsageError(f"--accuracy-budget {text!r}: name at least one bound, e.g. cos=0.999,rel=2e-2")
        return cls.from_dict(values)

    def text(self) -> str:
        return ",".join(f"{k}={v:.10g}" for k, v in self.to_dict().items())

    def to_dict(self) -> dict[str, float]:
        return {k: v for k, v in asdict(self).items() if v is not None and not (k == "batch" and v < 2)}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Budget:
        bounds = {k: float(v) for k, v in values.items() if k in _KEYS and k != "batch"}
        return cls(**bounds, batch=int(values.get("batch", 0)))

    def score(self, errors: Sequence[OutputError]) -> float:
        """How much of the budget the worst output uses: 1 is at the bound, above 1 over it."""
        used = [0.0]
        for e in errors:
            pairs = [(1 - e.cos, 1 - self.cos), (e.rel, self.rel), (e.max_abs, self.abs), (e.p99_abs, self.p99)]
            used += [_share(error, bound) for error, bound in pairs if bound is not None]
        return max(used)

    def exceeded(self, error: OutputError) -> list[str]:
        """What `error` breaks, e.g. ["cos 0.9981 < 0.999"]; empty within budget."""
        broken = [f"cos {error.cos:.7f} < {self.cos:.10g}"] if not error.cos >= self.cos else []
        broken += [f"rel {error.rel:.2e} > {self.rel:g}"] if not error.rel <= self.rel else []
        broken += [f"abs {error.max_abs:.2e} > {self.abs:g}"] if self.abs is not None and not error.max_abs <= self.abs else []
        broken += [f"p99 {error.p99_abs:.2e} > {self.p99:g}"] if self.p99 is not None and not error.p99_abs <= self.p99 else []
        return broken

    def broken_by(self, name: str, reference: np.ndarray, actual: np.ndarray) -> list[str]:
        """What output `name`'s `actual` breaks against `reference` on one sample (`exceeded`)."""
        return self.exceeded(output_error(name, "feed", [reference], [actual]))


def _share(error: float, bound: float) -> float:
    """error / bound; inf for any error (NaN included) against a zero bound."""
    if math.isnan(error):
        return math.inf
    return error / bound if bound > 0 else (math.inf if error > 0 else 0.0)


@dataclass
class OutputError:
    """One output's worst error over a set of samples, against fp32."""

    name: str
    samples: str  # "calibration", "held-out", or "batched" (the two sets run `Budget.batch` samples at a time)
    max_abs: float
    p99_abs: float
    rel: float
    cos: float


def output_error(name: str, samples: str, references: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> OutputError:
    """The worst max / p99 |error|, relative error and cosine of one output over sample pairs
    (inf errors and cosine 0 where a shape differs or the output is not finite)."""
    worst = OutputError(name, samples, 0.0, 0.0, 0.0, 1.0)
    for ref_array, got_array in zip(references, outputs):
        ref, got = ref_array.astype(np.float64).ravel(), np.asarray(got_array).astype(np.float64).ravel()
        if ref.shape != got.shape or not np.isfinite(got).all():
            return OutputError(name, samples, math.inf, math.inf, math.inf, 0.0)
        diff = np.abs(got - ref)
        scale = float(np.max(np.abs(ref))) if ref.size else 0.0
        norms = float(np.linalg.norm(ref) * np.linalg.norm(got))
        cos = float(ref @ got / norms) if norms else (1.0 if not diff.any() else 0.0)
        worst.max_abs = max(worst.max_abs, float(diff.max()) if diff.size else 0.0)
        worst.p99_abs = max(worst.p99_abs, float(np.percentile(diff, 99)) if diff.size else 0.0)
        worst.rel = max(worst.rel, float(diff.max()) / scale if scale else float(diff.max()) if diff.size else 0.0)
        worst.cos = min(worst.cos, cos)
    return worst


@dataclass
class Layer:
    """A layer kept in fp32 by the gate, with its sensitivity: the share of the budget the model
    outputs used with this layer alone quantized."""

    node: str
    op_type: str
    sensitivity: float


@dataclass
class GateResult:
    """What the gate measured on the artefact it let through (or the last one it tried)."""

    budget: Budget
    calibration: str
    random_calibration: bool
    quantized_layers: int
    fp32_layers: list[Layer] = field(default_factory=list)
    errors: list[OutputError] = field(default_factory=list)
    attempts: list[dict[str, Any]] = field(default_factory=list)  # per attempt: layers in fp32, worst cos and rel
    passed: bool = False
    kept_in: str = "fp32"  # the float precision of the layers left unquantized (fp8 on ort-cuda: fp16)

    def to_dict(self) -> dict[str, Any]:
        return {"budget": self.budget.to_dict(), "calibration": self.calibration, "random_calibration": self.random_calibration,
                "quantized_layers": self.quantized_layers, f"{self.kept_in}_layers": [asdict(layer) for layer in self.fp32_layers],
                "errors": [asdict(e) for e in self.errors], "attempts": self.attempts, "passed": self.passed}


class GateFailed(AccuracyError):
    """The quantized model stays over budget; `result` holds what the gate measured (for the report)."""

    def __init__(self, result: GateResult, message: str):
        super().__init__(message)
        self.result = result


def measure(model: onnx.ModelProto, calibration: Calibration, references: Mapping[str, Sequence[dict[str, torch.Tensor]]],
            limit: int = GATE_SAMPLES, held_out: bool = True, batch: int = 0) -> list[OutputError]:
    """The worst error of each output of `model` on (at most `limit` of) the calibration and
    held-out samples, against `references` (PyTorch fp32 outputs, keyed "calibration" and
    "held-out", in sample order); with `batch` >= 2 (and `held_out`) also on those samples run
    together, `batch` at a time ("batched")."""
    return _errors(ort_backend.session(model), calibration, references, limit, held_out, batch=batch)


def _errors(session: Any, calibration: Calibration, references: Mapping[str, Sequence[dict[str, torch.Tensor]]], limit: int = GATE_SAMPLES,
            held_out: bool = True, switches: Mapping[str, np.ndarray] | None = None, batch: int = 0) -> list[OutputError]:
    """`measure` on an ONNX Runtime session, whose inputs beyond the model's take `switches`. With
    `held_out` and `batch` >= 2, the judged samples also run `batch` at a time as one batch
    ("batched", `_one_batch`), each sample's rows of a batch's outputs judged against its own reference."""
    feeds = {"calibration": calibration.feeds()[:limit]}
    if held_out:
        feeds["held-out"] = calibration.feeds(held_out=True)[:limit]

    def run(feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return ort_backend.run(session, {**feed, **(switches or {})})

    sets = [(samples, references[samples][: len(group)], [run(feed) for feed in group]) for samples, group in feeds.items()]
    if held_out and batch >= 2:
        all_feeds, all_refs = [feed for group in feeds.values() for feed in group], [ref for _, refs, _ in sets for ref in refs]
        outs: list[dict[str, np.ndarray]] = []
        for start in range(0, len(all_feeds) - 1, batch):  # a last sample alone: its own run above is its batch
            joined = _one_batch(session, all_feeds[start:start + batch], all_refs[start:start + batch])
            if joined is None:
                log.warning("the accuracy budget's batch=%d: samples %d.. cannot run as one batch (shapes that differ, a fixed batch axis, "
                            "or outputs not batched like the inputs); they are judged one at a time only", batch, start)
                break
            joined_feed, rows = joined
            outputs = run(joined_feed)
            outs += [{k: v[i * rows:(i + 1) * rows] for k, v in outputs.items()} for i in range(len(all_feeds[start:start + batch]))]
        if outs:
            sets.append(("batched", all_refs[: len(outs)], outs))
    errors = []
    for samples, wanted, outs in sets:
        for name, first in wanted[0].items() if wanted else ():
            if not first.is_floating_point():
                continue
            if any(name not in out for out in outs):
                raise AccuracyError(f"the quantized model lacks output {name}")
            errors.append(output_error(name, samples, [r[name].detach().float().numpy() for r in wanted], [out[name] for out in outs]))
    return errors


def _one_batch(session: Any, feeds: Sequence[dict[str, np.ndarray]], references: Sequence[dict[str, torch.Tensor]]) -> tuple[dict[str, np.ndarray], int] | None:
    """The samples' feeds concatenated on axis 0 into one batch, and the rows each sample has; None
    where the batch would not be the same computation: fewer than two samples, samples of
    different shapes, an unbatched input that differs between them, an input whose batch axis the
    model fixes, or a float output not batched like the inputs.

    A quantized model's error can depend on the batch it runs in: dynamic int8 takes one activation
    scale per tensor over the whole batch, so a sequence is quantized more coarsely among seven
    others than alone (GPT-2 int8 passed the gate sample by sample at rel 1.9e-2 and measured
    2.26e-2 on fresh inputs at batch 8, bench/results/cpu_int8.md)."""
    if len(feeds) < 2 or len(references) != len(feeds):
        return None
    first = feeds[0]
    batched = {name: array.shape[0] for name, array in first.items() if array.ndim}
    if not batched or len(set(batched.values())) != 1:
        return None
    declared = {i.name: i.shape for i in session.get_inputs()}
    if any(isinstance(declared.get(name, [None])[0], int) for name in batched):
        return None  # a static batch axis: the model cannot take the samples together
    if any(feed.keys() != first.keys() or any(feed[k].shape != first[k].shape for k in first) for feed in feeds):
        return None
    if any(not np.array_equal(feed[k], first[k]) for feed in feeds for k in first if k not in batched):
        return None
    rows = next(iter(batched.values()))
    if any(t.ndim == 0 or t.shape[0] != rows for ref in references for t in ref.values() if t.is_floating_point()):
        return None
    return {k: np.concatenate([f[k] for f in feeds]) if k in batched else first[k] for k in first}, rows


@dataclass(frozen=True)
class Switchboard:
    """One model in which any choice of the quantized layers runs quantized: `switches` maps each
    layer to a bool input, true for quantized (layers without a switch stay in float on it). The
    gate searches on one session of it instead of quantizing and loading the model once per
    choice; the artefact it finally picks is still quantized for real and measured."""

    model: onnx.ModelProto
    switches: Mapping[str, str]

    @classmethod
    def of(cls, model: onnx.ModelProto, chosen: Iterable[str], suffix: str,
           branches: Callable[[onnx.NodeProto, onnx.ModelProto, str], tuple[onnx.GraphProto, onnx.GraphProto]]) -> Switchboard:
        """A copy of `model` with each node named in `chosen` replaced by an If on a bool input
        `<node>.<suffix>` (its switch): `branches(node, board, switch)` gives the If's (quantized,
        float) subgraphs, adding to `board` the initializers they need."""
        board = onnx.ModelProto()
        board.CopyFrom(model)
        names = set(chosen)
        switches: dict[str, str] = {}
        nodes = []
        for node in board.graph.node:
            if node.name not in names:
                nodes.append(node)
                continue
            switch = switches[node.name] = f"{node.name}.{suffix}"
            board.graph.input.append(helper.make_tensor_value_info(switch, TensorProto.BOOL, []))
            quantized, float_branch = branches(node, board, switch)
            nodes.append(helper.make_node("If", [switch], list(node.output), name=node.name, then_branch=quantized, else_branch=float_branch))
        del board.graph.node[:]
        board.graph.node.extend(nodes)
        return cls(board, switches)

    @cached_property
    def session(self) -> Any:
        """The one ONNX Runtime session of `model`, built on first use."""
        return ort_backend.session(self.model)

    def feed(self, quantized: Iterable[str]) -> dict[str, np.ndarray]:
        on = set(quantized)
        return {switch: np.array(layer in on) for layer, switch in self.switches.items()}

    def measure(self, quantized: Iterable[str], calibration: Calibration, references: Mapping[str, Sequence[dict[str, torch.Tensor]]],
                limit: int = GATE_SAMPLES, held_out: bool = True, batch: int = 0) -> list[OutputError]:
        """`measure` of the model with the `quantized` layers quantized (the others in float), on its session."""
        return _errors(self.session, calibration, references, limit, held_out, self.feed(quantized), batch)


def run_gate(quantize: Callable[[set[str]], onnx.ModelProto], layers: Mapping[str, onnx.NodeProto], calibration: Calibration,
             references: Mapping[str, Sequence[dict[str, torch.Tensor]]], budget: Budget,
             switchboard: Callable[[], Switchboard | None] | None = None, kept_in: str = "fp32") -> tuple[onnx.ModelProto, GateResult]:
    """Quantize with `quantize(names of layers to keep in float)` and check the result against
    `budget`; over budget, keep the most sensitive of `layers` (the nodes `quantize` quantizes, by
    name) in float (`kept_in`: fp32, or fp16 for fp8 on ort-cuda; the report and messages say it)
    and try again: how many is searched for (`_fewest`) on the quantized artefacts. When
    `switchboard()` gives a `Switchboard` of the same layers (it is built the first time the gate
    fails), the ranking and that search run on one session of it instead, and only the choice found
    within budget is quantized and measured for real (then one layer more at a time, should that one fail).

    Returns:
        The quantized model that passed, and what the gate measured.

    Raises:
        GateFailed: still over budget with the bound on fp32 layers reached (the message names
            the output and its numbers; the exception's `result` has the rest).
    """
    result = GateResult(budget, calibration.source, calibration.random, len(layers), kept_in=kept_in)
    quantized = quantize(set())
    result.errors = measure(quantized, calibration, references, batch=budget.batch)
    # samples that cannot form a batch (warned about just now) are not tried, nor warned about, again
    batch = budget.batch if any(e.samples == "batched" for e in result.errors) else 0
    if _judge(result, set(), "artefact"):
        return quantized, result
    max_fallback = max(4, len(layers) // 4)
    board = switchboard() if switchboard is not None else None
    ranking = sensitivity_ranking(quantize, layers, calibration, references, budget, board)
    # the artefact within budget with the fewest layers kept so far (the search only lowers that count)
    best: tuple[int, onnx.ModelProto, list[OutputError]] | None = None

    def within(count: int) -> bool:
        nonlocal best
        kept = {name for name, _ in ranking[:count]}
        if board is not None:
            result.errors = board.measure(set(layers) - kept, calibration, references, batch=batch)
            return _judge(result, kept, "switchboard")
        model = quantize(kept)
        result.errors = measure(model, calibration, references, batch=batch)
        if not _judge(result, kept, "artefact"):
            return False
        best = (count, model, result.errors)
        return True

    fewest = _fewest(within, min(max_fallback, len(ranking)))
    result.fp32_layers = [_layer(layers[name], score) for name, score in ranking[:fewest]]
    if best is not None and best[0] == fewest:
        _, quantized, result.errors = best
        result.passed = True
        return quantized, result
    while board is not None:  # the switchboard's count on the artefact, then one layer more at a time
        kept = {layer.node for layer in result.fp32_layers}
        quantized = quantize(kept)
        result.errors = measure(quantized, calibration, references, batch=batch)
        if _judge(result, kept, "artefact"):
            return quantized, result
        if not _fall_back(result, layers, ranking, max_fallback):
            break
    broken = [f"{e.name} ({e.samples}) {', '.join(b)}" for e in result.errors if (b := budget.exceeded(e))]
    raise GateFailed(result, f"the quantized model is over the accuracy budget ({budget.text()}) even with {len(result.fp32_layers)} of {len(layers)} layers "
                             f"back in {kept_in} (the bound is {max_fallback}): {broken[0]}; loosen --accuracy-budget, give representative "
                             "--calibration-data, or export in fp16/fp32")


def _fewest(within: Callable[[int], bool], bound: int) -> int:
    """The fewest of the most sensitive layers (up to `bound`) whose return to float brings the
    model within budget (`within(count)`, on the switchboard or the artefact), found by doubling
    the count from 1, then bisecting (1 measurement when one layer does, 8 for 10 of BERT-base's
    bound of 18, where one layer at a time took 11; 6 to learn that 18 are not enough);
    `bound` when even that is over budget. Adding layers back lowers the error all but
    monotonically; an artefact found on the switchboard is measured after anyway."""
    low, high = 0, 1  # over budget with `low` back, within with `high` once found
    while not within(high):
        if high >= bound:
            return bound
        low, high = high, min(2 * high, bound)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if within(middle) else (middle, high)
    return high


def _judge(result: GateResult, kept: set[str], model: str) -> bool:
    """Whether `result.errors` (measured on `model`, "artefact" or "switchboard", with `kept` in
    `result.kept_in`) are within budget; records the attempt."""
    broken = {f"{e.name} ({e.samples})": b for e in result.errors if (b := result.budget.exceeded(e))}
    result.attempts.append({"model": model, f"{result.kept_in}_layers": len(kept), "worst_cos": min((e.cos for e in result.errors), default=1.0),
                            "worst_rel": max((e.rel for e in result.errors), default=0.0), "passed": not broken})
    log.info("accuracy gate (%s), %d layer(s) in %s: %s", model, len(kept), result.kept_in, "; ".join(f"{k} {', '.join(v)}" for k, v in broken.items()) or "within budget")
    result.passed = not broken and model == "artefact"
    return not broken


def _fall_back(result: GateResult, layers: Mapping[str, onnx.NodeProto], ranking: Sequence[tuple[str, float]], bound: int) -> bool:
    """Put the most sensitive layer still quantized back in fp32; False at the bound or with none left."""
    kept = {layer.node for layer in result.fp32_layers}
    candidates = [item for item in ranking if item[0] not in kept]
    if len(kept) >= bound or not candidates:
        return False
    result.fp32_layers.append(_layer(layers[candidates[0][0]], candidates[0][1]))
    return True


def _layer(node: onnx.NodeProto, sensitivity: float) -> Layer:
    return Layer(node.name, node.op_type, round(sensitivity, 6))


def sensitivity_ranking(quantize: Callable[[set[str]], onnx.ModelProto], layers: Mapping[str, onnx.NodeProto], calibration: Calibration,
                        references: Mapping[str, Sequence[dict[str, torch.Tensor]]], budget: Budget, switchboard: Switchboard | None = None) -> list[tuple[str, float]]:
    """Every layer with its `Budget.score` when it alone is quantized (on the first calibration
    samples), most sensitive first: on `switchboard` for the layers it switches."""
    scores = []
    for name in layers:
        if switchboard is not None and name in switchboard.switches:
            errors = switchboard.measure({name}, calibration, references, PROBE_SAMPLES, held_out=False)
        else:
            errors = measure(quantize(set(layers) - {name}), calibration, references, limit=PROBE_SAMPLES, held_out=False)
        scores.append((name, budget.score(errors)))
        log.debug("accuracy gate: %s alone uses %.3g of the budget", name, scores[-1][1])
    return sorted(scores, key=lambda item: -item[1])


def table(result: GateResult) -> str:
    """The gate's summary as the CLI prints it: budget, calibration, layers in fp32, errors per output."""
    lines = [f"accuracy gate ({'passed' if result.passed else 'FAILED'}): budget {result.budget.text()} per output vs PyTorch fp32",
             f"  calibration: {result.calibration}"]
    kept = ", ".join(f"{layer.node} ({layer.op_type})" for layer in result.fp32_layers) or "none"
    lines.append(f"  layers kept in {result.kept_in}: {len(result.fp32_layers)} of {result.quantized_layers} ({kept})")
    lines.append(f"  {'output':<28} {'samples':<12} {'max abs':>10} {'p99 abs':>10} {'rel':>10} {'cosine':>10}")
    lines += [f"  {e.name:<28} {e.samples:<12} {e.max_abs:>10.3e} {e.p99_abs:>10.3e} {e.rel:>10.3e} {e.cos:>10.6f}" for e in result.errors]
    return "\n".join(lines)


def recorded_budget(model: onnx.ModelProto) -> Budget | None:
    """The budget a quantized artefact was gated with (metadata ACCURACY_BUDGET); None for others."""
    from deployfuse import metadata

    recorded = metadata.read(model, metadata.ACCURACY_BUDGET)
    return Budget.from_dict(recorded) if isinstance(recorded, dict) else None


def budget_of(text: str | None) -> Budget:
    """`--accuracy-budget` parsed, the default budget when None."""
    return Budget() if text is None else Budget.parse(text)


__all__ = ["BUDGET_HELP", "Budget", "GateFailed", "GateResult", "Layer", "OutputError", "budget_of", "measure", "output_error", "recorded_budget", "run_gate",
           "sensitivity_ranking", "Switchboard", "table"]
