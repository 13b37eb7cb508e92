"""What a fusion run did, per family and rule: matches, rollbacks and why, near misses, and
(autotune runs) the family's latency before and after and whether it stayed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rich.console import RenderableType

from deployfuse import tables


@dataclass
class FamilyResult:
    """One rule family's outcome.

    Attributes:
        family: the family name (a rule module's FAMILY).
        matches: rule name -> rewrites applied (before any rollback).
        rolled_back: True when the guard rejected the family and its rewrites were undone.
        reason: why the guard rejected it (one line).
        near_misses: rule name -> why the closest candidate failed (filled with debug=True).
        autotune: the autotune decision in one line ("" when the family was not timed for a
            decision: autotune off, nothing matched, or the guard rolled it back).
        before_ms: median latency on the target of the model before the family (autotune).
        after_ms: the same after the family.
        reverted: True when autotune undid the family because it made the model slower.
    """

    family: str
    matches: dict[str, int] = field(default_factory=dict)
    rolled_back: bool = False
    reason: str = ""
    near_misses: dict[str, list[str]] = field(default_factory=dict)
    autotune: str = ""
    before_ms: float | None = None
    after_ms: float | None = None
    reverted: bool = False

    @property
    def fused(self) -> int:
        """Rewrites kept in the model."""
        return 0 if self.rolled_back or self.reverted else sum(self.matches.values())


@dataclass
class FusionReport:
    """The fusion report of one `fuse` call, in family order."""

    target: str
    families: list[FamilyResult] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """Kept rewrites per rule name, summed over the families that run it (rolled-back and
        reverted families count 0)."""
        counts: dict[str, int] = {}
        for f in self.families:
            for rule, n in f.matches.items():
                counts[rule] = counts.get(rule, 0) + (0 if f.rolled_back or f.reverted else n)
        return counts

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form, for `--report`."""
        return {
            "target": self.target,
            "families": [
                {
                    "family": f.family,
                    "matches": dict(f.matches),
                    "fused": f.fused,
                    "rolled_back": f.rolled_back,
                    "reason": f.reason,
                    **({"near_misses": f.near_misses} if f.near_misses else {}),
                    **({"autotune": {"kept": not f.reverted, "reason": f.autotune, "before_ms": _ms(f.before_ms), "after_ms": _ms(f.after_ms)}} if f.autotune else {}),
                }
                for f in self.families
            ],
        }

    def table(self, all_rules: bool = False) -> str:
        """`grid()` as plain text."""
        return tables.plain(self.grid(all_rules))

    def grid(self, all_rules: bool = False, title: str | None = None) -> RenderableType:
        """One row per rule that matched (every rule with `all_rules`), plus rolled-back families
        with their reasons, autotune decisions and near misses (debug runs)."""
        grid = tables.grid("family", "rule", "matches", "status", title=title)
        for f in self.families:
            if f.rolled_back:
                status = tables.verdict(f"rolled back: {f.reason}", False)
            else:
                status = tables.line(f"reverted: {f.autotune}") if f.reverted else tables.verdict(f"kept ({f.autotune})" if f.autotune else "kept", True)
            for rule, n in f.matches.items():
                if n or all_rules:
                    tables.add(grid, f.family, rule, str(n), status if n else "-")
            for rule, why in f.near_misses.items():
                for line in why:
                    tables.add(grid, f.family, rule, "near miss", line)
        return grid if grid.row_count else tables.line(f"no fusion applied for {self.target}")


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
