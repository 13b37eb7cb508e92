"""Errors a user can act on, each with the exit code the CLI returns for it."""

from __future__ import annotations


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
