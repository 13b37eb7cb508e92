"""The export report: what each step did and how long it took, as a table and as JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from deployfuse import provenance


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
        """The summary the CLI prints: steps, then verification per output."""
        lines = [f"{'step':<8} {'status':<8} {'time':>8}  detail"]
        lines += [f"{s.name:<8} {s.status:<8} {s.seconds:>7.2f}s  {s.detail}" for s in self.steps]
        if self.verification:
            lines.append(f"\nverified against {self.verification['reference']}, {self.verification['draws_per_shape']} input draw(s) at each shape")
        same = any(o.get("same_precision_rel_error") is not None for check in self.verify for o in check["outputs"])
        shown = None
        for check in self.verify:
            shapes = ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in check["shapes"].items())
            if shapes != shown:
                shown = shapes
                lines.append(f"\nverify at {shapes}")
                lines.append(f"  {'draw':>4}  {'output':<28} {'max abs err':>12} {'max rel err':>12} {'tolerance':>10}  result"
                             + ("  rel err vs PyTorch in the same precision" if same else ""))
            for o in check["outputs"]:
                verdict = "ok" if o["passed"] else "FAIL"
                lines.append(f"  {check.get('draw', 0) + 1:>4}  {o['name']:<28} {o['max_abs_error']:>12.3e} {o['max_rel_error']:>12.3e} {o['tolerance']:>10.1e}  {verdict}"
                             + (f"  {o['same_precision_rel_error']:.3e}" if same else ""))
        return "\n".join(lines)
