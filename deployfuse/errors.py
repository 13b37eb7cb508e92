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
