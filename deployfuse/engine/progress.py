"""Build progress: TensorRT's phase callbacks turned into one line per top-level phase."""

from __future__ import annotations

import time
from collections.abc import Callable
from types import ModuleType
from typing import Any


def progress_monitor(trt: ModuleType, report: Callable[[str], None]) -> Any:
    """A `trt.IProgressMonitor` that reports each top-level phase's start and duration.

    Defined per call because the base class lives in whichever TensorRT module is active.
    """

    class _Monitor(trt.IProgressMonitor):  # type: ignore[name-defined]
        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)
            self._started: dict[str, float] = {}
            self._top: set[str] = set()

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            if parent_phase is None:
                self._top.add(phase_name)
                self._started[phase_name] = time.perf_counter()
                report(f"  {phase_name} ({num_steps} step{'s' if num_steps != 1 else ''})")

        def step_complete(self, phase_name: str, step: int) -> bool:
            return True  # never cancel

        def phase_finish(self, phase_name: str) -> None:
            if phase_name in self._top:
                report(f"  {phase_name}: done in {time.perf_counter() - self._started[phase_name]:.1f} s")

    return _Monitor()
