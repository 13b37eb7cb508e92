"""The accuracy gate: a quantized graph is judged against the fp32 PyTorch model, per output.

Per output, on the calibration samples and on the held-out ones: max |error|, p99 |error|, the
relative error max|error| / max|reference| (one number per output, unlike `--rtol`'s element-wise
rule |a - r| <= atol + rtol * |r|) and the cosine similarity of the flattened outputs. A `Budget` bounds the worst of each over all samples;
with `batch=N` also over the samples run N at a time as one batch (dynamic int8's activation scales
span the batch: GPT-2 passed one sample at a time and measured 2.26e-2 at batch 8). Over budget,
quantized layers go back to fp32 (fp16 for fp8 on ort-cuda): the choice that keeps the least GEMM
cost in float among two searches (`cheapest_fallbacks`), on a `Switchboard` where the
quantizer offers one, else on the quantized artefacts themselves; the gate gives up when a quarter
of the layers (at least 4), the most sensitive, are not enough, nor any per-cost choice of no more cost.

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

A layer's cost (`layer_costs`) is the multiply-adds of its GEMM per row (per token): K·N for a
MatMul or Gemm, the weight's size for Attention and packed layers, and for a Conv K·K·Cin/groups·Cout
per output position times the output positions where the graph declares them. Which layers go back
is a covering knapsack: with s_i the sensitivity and c_i the cost of layer i, and S the score with
every layer quantized, find the set R that minimises sum(c_i, i in R) subject to the score with R
in float <= 1. To first order the layers' errors add (1 - cosine is ||e||^2 / 2||y||^2 for a small
error e, and independent errors' squared norms add), so the constraint reads
sum(s_i, i in R) >= S - 1. Its fractional relaxation is solved exactly by taking layers in
decreasing s_i / c_i, and that prefix costs at most one layer (the last taken) more than the best
set; the classic repair is to also consider the most valuable items alone, which here is the
prefix by sensitivity alone (what the gate searched before: the fewest layers). So the gate
searches both orders' prefixes by doubling then bisecting, the second only up to the first's cost,
and keeps the passing choice of least cost (`cheapest_fallbacks`). The errors do not add exactly, so
each prefix is measured, not predicted. GPT2LMHeadModel int8 (bench/results/cpu_int8.md): the
sensitivity order kept the LM head (768 x 50257: 16x an MLP GEMM, 5.5x a whole layer's GEMMs) and 6 layers in fp32, 40.3 %
of the GEMM cost; the per-cost order 16 layers without the head (12 attention output projections,
768 x 768), 12.4 %.

The give-up bound stays a count (a quarter of the layers, at least 4, on the sensitivity order):
a bound on cost would refuse models that pass today (the LM head alone is 31 % of GPT-2's GEMM
cost), and the bound's other task, capping how many measurements a hopeless search takes, is a
matter of counts. The per-cost search is bounded by the cost of the choice to beat (or of the
count bound's layers), and the report gives the share of GEMM cost kept in float, so an export
that passes with most of its cost in float says so.
"""

from __future__ import annotations

import itertools
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
    """A layer kept in fp32 by the gate, with its sensitivity (the share of the budget the model
    outputs used with this layer alone quantized) and its cost share (its `layer_costs` over
    that of every quantizable layer)."""

    node: str
    op_type: str
    sensitivity: float
    cost_share: float = 0.0


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
    search: str = ""  # the order whose prefix went back: "sensitivity" or "sensitivity per cost" (`fallback_orders`)

    @property
    def cost_share(self) -> float:
        """The share of the quantizable layers' GEMM cost kept in float."""
        return round(sum(layer.cost_share for layer in self.fp32_layers), 6)

    def to_dict(self) -> dict[str, Any]:
        return {"budget": self.budget.to_dict(), "calibration": self.calibration, "random_calibration": self.random_calibration,
                "quantized_layers": self.quantized_layers, f"{self.kept_in}_layers": [asdict(layer) for layer in self.fp32_layers],
                f"{self.kept_in}_cost_share": self.cost_share, "search": self.search,
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
             switchboard: Callable[[], Switchboard | None] | None = None, kept_in: str = "fp32",
             costs: Mapping[str, float] | None = None) -> tuple[onnx.ModelProto, GateResult]:
    """Quantize with `quantize(names of layers to keep in float)` and check the result against
    `budget`; over budget, keep some of `layers` (the nodes `quantize` quantizes, by name) in float
    (`kept_in`: fp32, or fp16 for fp8 on ort-cuda; the report and messages say it) and try again:
    the passing choice of least cost (`costs`, from `layer_costs`; None: every layer costs the
    same, and the fewest go back) that `cheapest_fallbacks` finds on the quantized artefacts. When
    `switchboard()` gives a `Switchboard` of the same layers (it is built the first time the gate
    fails), the ranking and that search run on one session of it instead, and only the choices
    found within budget are quantized and measured for real, cheapest first (then the sensitivity
    order's one layer more at a time, should they fail).

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
    cost = {name: float(costs[name]) if costs is not None else 1.0 for name in layers}
    share = {name: c / (sum(cost.values()) or 1.0) for name, c in cost.items()}
    scores = dict(ranking)
    artefacts: dict[frozenset[str], tuple[onnx.ModelProto, list[OutputError]]] = {}  # those within budget, measured for real

    def within(search: str, kept: frozenset[str]) -> bool:
        if board is not None:
            result.errors = board.measure(set(layers) - kept, calibration, references, batch=batch)
            return _judge(result, kept, "switchboard", search, share)
        model = quantize(set(kept))
        result.errors = measure(model, calibration, references, batch=batch)
        if not _judge(result, kept, "artefact", search, share):
            return False
        artefacts[kept] = (model, result.errors)
        return True

    orders = fallback_orders(ranking, cost)
    fallbacks = cheapest_fallbacks(orders, cost, within, max_fallback)

    def keep(search: str, names: Sequence[str]) -> set[str]:
        result.search = search
        result.fp32_layers = [_layer(layers[name], scores[name], share[name]) for name in names]
        return set(names)

    for fallback in fallbacks:  # cheapest first
        kept = keep(fallback.search, fallback.layers)
        if frozenset(kept) in artefacts:
            quantized, result.errors = artefacts[frozenset(kept)]
            result.passed = True
            return quantized, result
        quantized = quantize(kept)
        result.errors = measure(quantized, calibration, references, batch=batch)
        if _judge(result, kept, "artefact", fallback.search, share):
            return quantized, result
    # none within budget for real: the sensitivity order's prefix, one layer more at a time up to the bound (on a switchboard)
    search, by_sensitivity = orders[0]
    bound = min(max_fallback, len(by_sensitivity))
    count = next((len(f.layers) for f in fallbacks if f.search == search), bound)
    tried = {frozenset(f.layers) for f in fallbacks}
    keep(search, by_sensitivity[:count])  # what the report names when nothing passes
    while board is not None and count <= bound:
        kept = keep(search, by_sensitivity[:count])
        if frozenset(kept) not in tried:
            quantized = quantize(kept)
            result.errors = measure(quantized, calibration, references, batch=batch)
            if _judge(result, kept, "artefact", search, share):
                return quantized, result
        count += 1
    broken = [f"{e.name} ({e.samples}) {', '.join(b)}" for e in result.errors if (b := budget.exceeded(e))]
    raise GateFailed(result, f"the quantized model is over the accuracy budget ({budget.text()}) even with {len(result.fp32_layers)} of {len(layers)} layers "
                             f"back in {kept_in} (the bound is {max_fallback}): {broken[0]}; loosen --accuracy-budget, give representative "
                             "--calibration-data, or export in fp16/fp32")


@dataclass(frozen=True)
class Fallback:
    """A choice of layers back in float that brought the model within budget: a prefix of the
    order `search` names (`fallback_orders`), and its cost."""

    search: str
    layers: tuple[str, ...]
    cost: float


def fallback_orders(ranking: Sequence[tuple[str, float]], costs: Mapping[str, float]) -> list[tuple[str, list[str]]]:
    """The orders whose prefixes the gate tries, by name: "sensitivity" (`ranking`'s, most
    sensitive first), then, where it differs, "sensitivity per cost" (decreasing s_i / c_i, ties
    in sensitivity order; a layer of no cost first)."""
    by_sensitivity = [name for name, _ in ranking]
    per_cost = [name for name, _ in sorted(ranking, key=lambda item: -(item[1] / costs[item[0]] if costs[item[0]] > 0 else math.inf))]
    return [("sensitivity", by_sensitivity)] + ([("sensitivity per cost", per_cost)] if per_cost != by_sensitivity else [])


def cheapest_fallbacks(orders: Sequence[tuple[str, Sequence[str]]], costs: Mapping[str, float],
                       within: Callable[[str, frozenset[str]], bool], bound: int) -> list[Fallback]:
    """The passing choices the searches find, cheapest first (at most one per order): for each of
    `orders` (`fallback_orders`), the shortest prefix within budget (`within(search, layers back)`,
    each choice measured once), found by doubling then bisecting its length (`_fewest`). The first
    order's prefixes go up to `bound` layers; a later order's only while cheaper than the cheapest
    choice found so far (or, with none, no dearer than the first order's `bound` layers): it costs
    nothing when it cannot win, and its doubling from 1 layer finds a cheap choice in few steps.
    Its price, on the switchboard (bench/results/cpu_int8.md): GPT2LMHeadModel int8, 8 measurements
    beside the sensitivity search's 6, +56 % of the samples the gate runs there (its ranking
    included), 15 s on 2 quiet cores (quantize step 146 s against 131 s); BERT-base, 4 beside 6,
    +22 %; the rounding and the artefacts cost what they did."""
    measured: dict[frozenset[str], bool] = {}

    def passes(search: str, kept: frozenset[str]) -> bool:
        if kept not in measured:
            measured[kept] = within(search, kept)
        return measured[kept]

    found: list[Fallback] = []
    ceiling = sum(costs[name] for name in orders[0][1][:bound]) if orders else 0.0
    for index, (search, order) in enumerate(orders):
        spent = list(itertools.accumulate(costs[name] for name in order))
        if index == 0:
            limit = min(bound, len(order))
        else:
            cheapest = min((f.cost for f in found), default=None)
            limit = sum(1 for c in spent if (c < cheapest if cheapest is not None else c <= ceiling))
        if limit == 0:
            continue
        count = _fewest(lambda n: passes(search, frozenset(order[:n])), limit)  # noqa: B023 (called before the loop moves on)
        if passes(search, frozenset(order[:count])):
            found.append(Fallback(search, tuple(order[:count]), spent[count - 1]))
    return sorted(found, key=lambda f: f.cost)


def layer_costs(model: onnx.ModelProto, layers: Mapping[str, onnx.NodeProto]) -> dict[str, float]:
    """Each layer's multiply-adds per row (per token): the size of its weights (its initializer
    inputs of 2 or more dimensions), which is K·N for a MatMul or Gemm and the packed weights of
    an Attention node; a MatMul of two activations (attention's QK^T and its product with V), the
    size of B less its batch axis where the graph declares it (heads·d·S per token); a Conv's is
    per output position (Cout·Cin/groups·kh·kw), times the output positions where the graph
    declares that shape. A layer whose weight size is not known gets the mean of the others (1
    when none is known).

    The units differ where Convs and GEMMs mix: ViT's patch embedding counts for every patch
    while its GEMMs count per token."""
    dims = {t.name: list(t.dims) for t in model.graph.initializer}
    shapes = {v.name: [d.dim_value if d.HasField("dim_value") else 0 for d in v.type.tensor_type.shape.dim]
              for v in (*model.graph.input, *model.graph.value_info, *model.graph.output) if v.type.tensor_type.HasField("shape")}
    known: dict[str, float] = {}
    for name, node in layers.items():
        weights = [dims[i] for i in node.input if len(dims.get(i, ())) >= 2]
        if not weights and node.op_type == "MatMul" and len(node.input) > 1:  # activations both: B per batch item (QK^T: heads x d x S)
            weights = [shape[1:]] if len(shape := shapes.get(node.input[1], [])) >= 3 and all(shape[1:]) else []
        if not weights:
            continue
        cost = sum(math.prod(w) for w in weights)
        positions = shapes.get(node.output[0], [])[2:] if node.op_type == "Conv" else []
        known[name] = float(cost * (math.prod(positions) if positions and all(positions) else 1))
    fallback = sum(known.values()) / len(known) if known else 1.0
    return {name: known.get(name, fallback) for name in layers}


def _fewest(within: Callable[[int], bool], bound: int) -> int:
    """The shortest prefix of an order (up to `bound` layers) whose return to float brings the
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


def _judge(result: GateResult, kept: Iterable[str], model: str, search: str = "", share: Mapping[str, float] | None = None) -> bool:
    """Whether `result.errors` (measured on `model`, "artefact" or "switchboard", with `kept` in
    `result.kept_in`, a prefix of the order `search`) are within budget; records the attempt, with
    the share of the cost `kept` holds in float where `share` gives each layer's."""
    kept = set(kept)
    broken = {f"{e.name} ({e.samples})": b for e in result.errors if (b := result.budget.exceeded(e))}
    attempt: dict[str, Any] = {"model": model, f"{result.kept_in}_layers": len(kept)}
    if search:
        attempt.update(search=search, cost_share=round(sum((share or {}).get(name, 0.0) for name in kept), 6))
    result.attempts.append({**attempt, "worst_cos": min((e.cos for e in result.errors), default=1.0),
                            "worst_rel": max((e.rel for e in result.errors), default=0.0), "passed": not broken})
    log.info("accuracy gate (%s), %d layer(s) in %s: %s", model, len(kept), result.kept_in, "; ".join(f"{k} {', '.join(v)}" for k, v in broken.items()) or "within budget")
    result.passed = not broken and model == "artefact"
    return not broken


def _layer(node: onnx.NodeProto, sensitivity: float, cost_share: float) -> Layer:
    return Layer(node.name, node.op_type, round(sensitivity, 6), round(cost_share, 6))


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
    kept = ", ".join(f"{layer.node} ({layer.op_type}, {100 * layer.cost_share:.1f} %)" for layer in result.fp32_layers) or "none"
    lines.append(f"  layers kept in {result.kept_in}: {len(result.fp32_layers)} of {result.quantized_layers} ({kept})")
    if result.fp32_layers:
        lines.append(f"  GEMM cost kept in {result.kept_in}: {100 * result.cost_share:.1f} % (the layers' multiply-adds; prefix of the {result.search} order)")
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


__all__ = ["BUDGET_HELP", "Budget", "Fallback", "GateFailed", "GateResult", "Layer", "OutputError", "budget_of", "cheapest_fallbacks", "fallback_orders",
           "layer_costs", "measure", "output_error", "recorded_budget", "run_gate", "sensitivity_ranking", "Switchboard", "table"]
