"""What a fold did: how many BatchNorms went into which kind of layer, and which stayed, why."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

KINDS = ("conv-bn", "convtranspose-bn", "linear-bn")


@dataclass
class FoldReport:
    """Counts of folded BatchNorms per kind and one line per BatchNorm left in place.

    Attributes:
        counts: folded pairs per kind; always has every key of `KINDS`.
        skipped: one line each, `"<batchnorm>: <why it was not folded>"`.
        method: how the pairs were found ("fx", "torch.export", "aten-graph", "torch.jit.freeze"
            or "none").
    """

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    skipped: list[str] = field(default_factory=list)
    method: str = "none"

    @property
    def folded(self) -> int:
        """Total number of BatchNorms folded."""
        return sum(self.counts.values())

    def add(self, kind: str) -> None:
        """Record one folded pair of `kind`."""
        self.counts[kind] += 1

    def skip(self, batchnorm: str, reason: str) -> None:
        """Record a BatchNorm that stays, and why."""
        self.skipped.append(f"{batchnorm}: {reason}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form for the export report."""
        return {"method": self.method, "counts": dict(self.counts), "skipped": list(self.skipped)}
