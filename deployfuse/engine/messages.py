"""What Polygraphy and TensorRT say while an engine builds goes to deployfuse's log, not the terminal.

Polygraphy prints its own messages and TensorRT's (through its TensorRT logger) as `[W] ...` and
`[I] ...` lines on stdout, where they would mix with `deployfuse build`'s summary. Within
`captured()` they become records of the `deployfuse.tensorrt` logger, which `--log-file` writes
(and nothing prints when no handler is configured); the errors are also kept, so a failed build
names TensorRT's own reason in its one-line message.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

LOG = logging.getLogger("deployfuse.tensorrt")
_LEVELS = (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL)  # Polygraphy's START/FINISH (22, 28) are info


class _Forward(logging.Handler):
    """Re-emits Polygraphy's records as deployfuse.tensorrt records and keeps the errors."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__(logging.DEBUG)
        self.errors = errors

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage().strip()
        if record.levelno >= logging.ERROR:
            self.errors.append(message)
        if LOG.hasHandlers():  # else Python's last-resort handler would print warnings to stderr
            LOG.log(max(level for level in _LEVELS if level <= max(record.levelno, logging.DEBUG)), "%s", message)


@contextlib.contextmanager
def captured() -> Iterator[list[str]]:
    """Within the block, Polygraphy's and TensorRT's messages (info and up) go to the
    deployfuse.tensorrt logger instead of stdout; yields the list the error messages collect in.
    Polygraphy's logger settings are restored afterwards."""
    from polygraphy.logger import G_LOGGER

    errors: list[str] = []
    source = logging.getLogger("Polygraphy")  # where Polygraphy's python-logging mode writes
    handler = _Forward(errors)
    saved = (G_LOGGER.use_python_logging_system, G_LOGGER.colors, G_LOGGER.letter, source.level, source.propagate)
    G_LOGGER.use_python_logging_system = True
    G_LOGGER.colors = G_LOGGER.letter = False  # the log has its own level names; no colour codes in a file
    source.setLevel(logging.DEBUG)
    source.propagate = False
    source.addHandler(handler)
    try:
        with G_LOGGER.verbosity(G_LOGGER.INFO):
            yield errors
    finally:
        source.removeHandler(handler)
        G_LOGGER.use_python_logging_system, G_LOGGER.colors, G_LOGGER.letter = saved[:3]
        source.setLevel(saved[3])
        source.propagate = saved[4]
