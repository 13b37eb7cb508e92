"""How a command ends: signals become exceptions (so temporaries are removed on the way out),
and a failure of deployfuse itself becomes one line, a log file with the traceback, exit 3."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
import traceback
from collections.abc import Iterator, Sequence

from deployfuse.errors import INTERNAL_ERROR_EXIT_CODE, first_line
from deployfuse.interrupts import raise_interrupted

# SIGTERM (kill, timeouts, container stops) and SIGHUP (a closed terminal) would end the
# process at once, leaving half-written temporaries; as exceptions, finally-blocks run. SIGINT
# raises KeyboardInterrupt anyway; through the same handler `interrupts.held` can hold it too,
# out of the making and removing of a temporary.
_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


@contextlib.contextmanager
def signals_as_exceptions() -> Iterator[None]:
    """Within the block, SIGTERM, SIGHUP and SIGINT raise `Interrupted` (a KeyboardInterrupt);
    the previous handlers come back afterwards. Outside the main thread (signal handlers cannot
    be set there) nothing changes."""
    previous = {}
    try:
        for signum in _SIGNALS:
            previous[signum] = signal.signal(signum, raise_interrupted)
    except ValueError:  # not the main thread
        pass
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def interrupted(command: str, exc: KeyboardInterrupt) -> int:
    """Say so in one line; exit 130 for SIGINT, 128 + N for signal N."""
    print(f"{command}: interrupted", file=sys.stderr)
    return getattr(exc, "exit_code", 130)


def internal_failure(command: str, argv: Sequence[str], exc: BaseException) -> int:
    """Write the traceback to a log file, print one line naming it, return exit code 3."""
    fd, log = tempfile.mkstemp(prefix="deployfuse-", suffix=".log")
    with os.fdopen(fd, "w") as out:
        out.write(f"{command} {' '.join(argv)}\n\n")
        out.write("".join(traceback.format_exception(exc)))
    print(f"{command}: internal error (a deployfuse bug, please report it): {first_line(exc, typed=True)}; traceback in {log}", file=sys.stderr)
    return INTERNAL_ERROR_EXIT_CODE
