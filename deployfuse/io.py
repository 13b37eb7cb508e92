"""Atomic writes: a file appears complete under its final name, or not at all."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from deployfuse.errors import UsageError


def check_writable_target(path: str | os.PathLike[str]) -> Path:
    """Return `path` as a Path after checking its directory exists and is writable."""
    target = Path(path)
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"output directory does not exist: {parent}")
    try:  # os.access says yes to root even on read-only file systems: try for real
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as exc:
        raise UsageError(f"output directory is not writable: {parent} ({exc.strerror})") from exc
    if target.is_dir():
        raise UsageError(f"output path is a directory: {target}")
    return target


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path in the target's directory; rename it over `path` on success.

    The temporary lives beside the target so the final rename stays on one file system.
    On any exception the temporary is removed and the target is left untouched.
    """
    target = check_writable_target(path)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a written artefact gets the usual mode
    try:
        yield tmp
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` to `path` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
