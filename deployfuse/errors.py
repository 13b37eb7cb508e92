"""Errors a user can act on, each with the exit code the CLI returns for it."""

from __future__ import annotations

import re
from pathlib import Path


class DeployfuseError(Exception):
    """Base class: a one-line message meant for the user, and an exit code."""

    exit_code = 2


class UsageError(DeployfuseError):
    """Bad input from the user (missing file, malformed flag, shapes the model rejects)."""

    exit_code = 2


class AccuracyError(DeployfuseError):
    """The artefact does not reproduce PyTorch within tolerance."""

    exit_code = 1


INTERNAL_ERROR_EXIT_CODE = 3  # deployfuse itself failed: a bug, reported with a log of the traceback


class Interrupted(KeyboardInterrupt):
    """The run was stopped by a signal (SIGINT, or SIGTERM turned into an exception by the CLI
    so that temporary files are removed on the way out). Exit code 128 + the signal number."""

    def __init__(self, signum: int):
        super().__init__(f"signal {signum}")
        self.exit_code = 128 + signum


def first_line(exc: BaseException, *, typed: bool = False, limit: int = 300) -> str:
    """The first line of `exc`'s message for a one-line error (terminal colours removed, cut at
    `limit` characters; a SyntaxError also says where); with `typed`, prefixed by the exception's
    type ("ValueError: ..."). An empty message gives the type's name."""
    text = exc.msg if isinstance(exc, SyntaxError) and exc.msg else str(exc)
    lines = re.sub(r"\x1b\[[0-9;]*m", "", text).strip().splitlines()
    line = lines[0][:limit] if lines else ""
    if isinstance(exc, SyntaxError) and exc.filename:
        line += f" ({Path(exc.filename).name}, line {exc.lineno})"
    if typed:
        return f"{type(exc).__name__}: {line}" if line else type(exc).__name__
    return line or type(exc).__name__
