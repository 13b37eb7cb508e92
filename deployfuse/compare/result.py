"""`CompareResult`: every figure a comparison produced, as a terminal table and as JSON."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rich.console import RenderableType

from deployfuse import provenance, tables
from deployfuse.compare.accuracy import OutputStats
from deployfuse.compare.latency import LatencyStats
from deployfuse.compare.localize import Localization

NOISY_P90_OVER_MEDIAN = 1.5  # a p90 this far above the median: the timing is not to be trusted


@dataclass
class BackendAccuracy:
    """One backend's outputs against the reference backend's, on one feed."""

    backend: str
    reference: str
    feed: int
    shapes: dict[str, list[int]]
    outputs: list[OutputStats]
    note: str = ""  # how the backend computed, when that changes the default tolerances

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "reference": self.reference, "feed": self.feed, "shapes": self.shapes,
                "passed": self.passed, "note": self.note, "outputs": [o.to_dict() for o in self.outputs]}


@dataclass
class CompareResult:
    """What `compare` found. `passed` is the verdict: every backend matches the first one."""

    model: str
    onnx: str
    backends: list[str]
    task: str | None = None  # the Hugging Face task MODEL (a save_pretrained folder) was loaded for
    accuracy: list[BackendAccuracy] = field(default_factory=list)
    latency: list[LatencyStats] = field(default_factory=list)
    localization: Localization | None = None
    files: dict[str, str] = field(default_factory=dict)
    run_results: Any = field(default=None, repr=False)  # Polygraphy RunResults, for plots and --save-results
    provenance: dict[str, Any] = field(default_factory=provenance.collect)  # versions, device, threads, seed, command, UTC time

    @property
    def passed(self) -> bool:
        return all(a.passed for a in self.accuracy)

    @property
    def reference(self) -> str:
        return self.backends[0]

    @property
    def first_divergence(self) -> dict[str, Any] | None:
        """The first fused node whose output departs from the unfused graph, when localised."""
        first = self.localization.first if self.localization is not None else None
        if first is None:
            return None
        s = first.stats
        return {"node": first.node, "op_type": first.op_type, "domain": first.domain, "rule": first.rule, "tensor": first.tensor,
                "max_abs_error": s.max_abs_error, "max_rel_error": s.max_rel_error, "cosine_similarity": s.cosine_similarity,
                "mismatched": s.mismatched, "reason": s.reason}

    def noisy_timings(self) -> list[str]:
        """One sentence per backend whose p90 exceeds NOISY_P90_OVER_MEDIAN x its median."""
        return [f"{lat.backend}: p90 {lat.p90_ms:.3g} ms is {lat.p90_ms / lat.median_ms:.1f}x the median {lat.median_ms:.3g} ms (min {lat.min_ms:.3g})"
                for lat in self.latency if lat.median_ms > 0 and lat.p90_ms > NOISY_P90_OVER_MEDIAN * lat.median_ms]

    def failures(self) -> list[str]:
        """`backend:output` for every output outside tolerance (once each)."""
        return list(dict.fromkeys(f"{a.backend}:{o.name}" for a in self.accuracy for o in a.outputs if not o.passed))

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "onnx": self.onnx, "task": self.task, "backends": self.backends, "reference": self.reference, "passed": self.passed,
            "accuracy": [a.to_dict() for a in self.accuracy],
            "latency": [lat.to_dict() for lat in self.latency],
            "first_divergence": self.first_divergence,
            "localization": self.localization.to_dict() if self.localization is not None else None,
            "files": self.files,
            "provenance": self.provenance,
        }

    def table(self) -> str:
        """`tables()` as plain text."""
        return tables.plain(*self.tables())

    def tables(self) -> list[RenderableType]:
        """Accuracy per backend, feed and output; latency per backend; where it first diverges;
        the verdict (rich renderables: `deployfuse.tables`)."""
        items: list[RenderableType] = []
        for a in self.accuracy:
            shapes = ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in a.shapes.items())
            grid = tables.grid("output", ">max abs", ">mean abs", ">p99 abs", ">max rel", ">p99 rel", ">cosine", ">atol", ">rtol", "result",
                               title=f"{a.backend} vs {a.reference} at {shapes}" + (f" ({a.note})" if a.note else ""))
            for o in a.outputs:
                tables.add(grid, o.name, f"{o.max_abs_error:.2e}", f"{o.mean_abs_error:.2e}", f"{o.p99_abs_error:.2e}", f"{o.max_rel_error:.2e}",
                           f"{o.p99_rel_error:.2e}", f"{o.cosine_similarity:.6f}", f"{o.atol:.0e}", f"{o.rtol:.0e}",
                           tables.verdict("ok" if o.passed else f"FAIL ({o.reason or f'{o.mismatched} elements'})", o.passed))
            items += [grid, tables.line("")]
        if self.latency:
            grid = tables.grid("backend", ">median ms", ">p90 ms", ">inf/s", ">samples/s", "timing")
            for lat in self.latency:
                tables.add(grid, lat.backend, f"{lat.median_ms:.3f}", f"{lat.p90_ms:.3f}", f"{lat.throughput_per_s:.1f}", f"{lat.samples_per_s:.1f}",
                           f"{lat.timing}, {lat.iterations} runs after {lat.warmup} warm-up")
            items.append(grid)
            items += [tables.line(f"noisy timing, {n}: rerun on a quieter machine or with more --iterations", style="yellow") for n in self.noisy_timings()]
            items.append(tables.line(""))
        if self.localization is not None:
            first = self.first_divergence
            if first is not None:
                items.append(tables.line(f"first divergence: node {first['node']} ({first['domain'] + '::' if first['domain'] else ''}{first['op_type']}, "
                                         f"rule {first['rule']}), tensor {first['tensor']}, max abs error {first['max_abs_error']:.3e}"))
            else:
                items.append(tables.line(f"localisation: {self.localization.note}"))
            items.append(tables.line(""))
        items.append(tables.verdict("PASSED: every backend matches " + self.reference if self.passed else "FAILED: " + ", ".join(self.failures()), self.passed))
        return items
