"""The export report: what each step did and how long it took, as a table and as JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import RenderableType
from rich.table import Table

from deployfuse import provenance, tables


@dataclass
class Step:
    """One pipeline step: its status ("ok", "skipped", "failed"), time and a short detail."""

    name: str
    status: str
    seconds: float
    detail: str = ""


@dataclass
class ExportReport:
    """Everything `deployfuse export` learnt, in the shape `--report` writes."""

    model: str
    output: str
    target: str
    precision: str
    opset: int
    form: str = ""
    task: str | None = None  # the Hugging Face task, for a save_pretrained folder
    dynamic: list[str] = field(default_factory=list)  # NAME:AXIS:LABEL of each dynamic axis
    steps: list[Step] = field(default_factory=list)
    fold: dict[str, Any] | None = None
    exporter: str | None = None
    export_attempts: list[dict[str, Any]] = field(default_factory=list)
    op_histogram: dict[str, int] = field(default_factory=dict)
    fusion: dict[str, Any] | None = None
    verify: list[dict[str, Any]] = field(default_factory=list)
    verification: dict[str, Any] | None = None  # draws per shape, the shapes, seeds, reference, rtol
    quantization: dict[str, Any] | None = None  # int8/fp8: mode, budget, calibration source, the accuracy gate's result
    error: str | None = None
    provenance: dict[str, Any] = field(default_factory=provenance.collect)  # versions, device, threads, seed, command, UTC time

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def table(self) -> str:
        """`tables()` as plain text."""
        return tables.plain(*self.tables())

    def tables(self) -> list[RenderableType]:
        """The summary the CLI prints: steps, then verification per shape and output (rich
        renderables: `deployfuse.tables`)."""
        steps = tables.grid("step", "status", ">time", "detail")
        for s in self.steps:
            tables.add(steps, s.name, tables.verdict(s.status, s.status != "failed") if s.status != "skipped" else s.status, f"{s.seconds:.2f}s", s.detail)
        items: list[RenderableType] = [steps]
        if self.verification:
            items += [tables.line(""), tables.line(f"verified against {self.verification['reference']}, "
                                                   f"{self.verification['draws_per_shape']} input draw(s) at each shape")]
        same = any(o.get("same_precision_rel_error") is not None for check in self.verify for o in check["outputs"])
        by_shapes: dict[str, Table] = {}
        for check in self.verify:
            shapes = ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in check["shapes"].items())
            if shapes not in by_shapes:
                by_shapes[shapes] = tables.grid(">draw", "output", ">max abs err", ">max rel err", ">tolerance", "result",
                                                *([">rel err vs PyTorch in the same precision"] if same else []), title=f"verify at {shapes}")
                items += [tables.line(""), by_shapes[shapes]]
            for o in check["outputs"]:
                tables.add(by_shapes[shapes], str(check.get("draw", 0) + 1), o["name"], f"{o['max_abs_error']:.3e}", f"{o['max_rel_error']:.3e}",
                           f"{o['tolerance']:.1e}", tables.verdict(("ok (all ~0)" if o.get("near_zero") else "ok") if o["passed"] else "FAIL", o["passed"]),
                           *([f"{o['same_precision_rel_error']:.3e}"] if same else []))
        return items
