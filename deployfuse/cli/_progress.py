"""What `deployfuse export` shows while it works: the running step with its elapsed time (and,
while fusing, which rule family of how many), then one line per finished step.

On a terminal this is a live `rich` display in colour; elsewhere (a pipe, a CI log) the same
finished-step lines in plain text, no colour and no redraws. Every line also goes to the
`deployfuse` logger, which `--log-file` writes to a file (with -q too). Commands that report
stages as lines (compare) use `stage_printer`, logged the same way.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

from deployfuse import provenance
from deployfuse.errors import UsageError
from deployfuse.io import check_outputs
from deployfuse.report import Step

log = logging.getLogger("deployfuse")
_STYLE = {"ok": "green", "skipped": "yellow", "failed": "bold red"}


class ExportProgress:
    """The export's progress callback (`Progress` in deployfuse.pipeline), with `family` for
    the fuse step; a context manager that starts and stops the live display."""

    def __init__(self, show: bool = True, console: Console | None = None):
        self.console = console or Console(stderr=True, highlight=False)
        self.show = show  # False (-q): the log only
        self.live = show and self.console.is_terminal
        self._bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                             console=self.console, transient=True, disable=not self.live)
        self._task: TaskID | None = None

    def __enter__(self) -> ExportProgress:
        self._bar.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._bar.stop()

    def __call__(self, name: str, step: Step | None) -> None:
        """A step starts (step None) or ends."""
        if step is None:
            log.info("%s ...", name)
            self._task = self._bar.add_task(name, total=None)
            return
        if self._task is not None:
            self._bar.remove_task(self._task)
            self._task = None
        detail = f" - {step.detail}" if step.detail else ""
        log.info("%s: %s (%.2f s)%s", name, step.status, step.seconds, detail)
        if not self.show:
            return
        style = _STYLE.get(step.status, "")
        self.console.print(f"{name:<8} [{style}]{step.status:<8}[/] {step.seconds:7.2f} s{detail}", markup=True, highlight=False,
                           soft_wrap=not self.live)

    def family(self, name: str, index: int, total: int) -> None:
        """The fuse step starts rule family `name`, number `index` (from 0) of `total`."""
        log.debug("fuse: family %s (%d/%d)", name, index + 1, total)
        if self._task is not None:
            self._bar.update(self._task, description=f"fuse: {name}", completed=index, total=total)


def stage_printer(show: bool = True) -> Callable[[str], None]:
    """A progress callback for commands that report stages as lines (compare): each line goes
    to the `deployfuse` logger (so to --log-file), and to stderr unless `show` is False (-q)."""

    def say(line: str) -> None:
        log.info("%s", line.strip())
        if show:
            print(line, file=sys.stderr, flush=True)

    return say


@contextlib.contextmanager
def log_to_file(path: str | None, reads: Mapping[str, Any] | None = None, writes: Mapping[str, Any] | None = None) -> Iterator[None]:
    """Within the block, deployfuse's log and every Python warning (torch, transformers, the
    exporters) go to the file at `path` instead of the terminal; all is restored afterwards.
    No `path` (no --log-file): nothing changes.

    `reads` and `writes` (flag -> path) are the run's inputs and other outputs: the log file is
    checked against them (`io.check_outputs`) before it is opened, so it never truncates one.
    """
    if not path:
        yield
        return
    check_outputs({"--log-file": path, **(writes or {})}, reads)
    try:
        handler = logging.FileHandler(path, mode="w", encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"--log-file {path}: {exc.strerror or exc}") from exc
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root, level = logging.getLogger(), log.level
    root.addHandler(handler)  # the root logger: third-party warnings and errors too
    log.setLevel(logging.DEBUG)
    logging.captureWarnings(True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default")  # each warning once per place, into the log (the CLI otherwise ignores them)
            log.info("%s", provenance.command_line())
            yield
    finally:
        logging.captureWarnings(False)
        log.setLevel(level)
        root.removeHandler(handler)
        handler.close()


__all__ = ["ExportProgress", "log_to_file", "stage_printer"]
