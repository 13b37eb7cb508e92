"""Where deployfuse writes: output paths checked before any work, and atomic writes.

Every command checks all of its output paths in one call (`check_outputs`) before it loads a
model: an output may not be one of the run's inputs, another output, or an existing file that
is not a regular file (a FIFO or a device node would be replaced by the atomic rename).
Overwriting an existing regular file is allowed. Writes then go to a temporary beside the
target that is renamed into place when complete, and removed on any exception, which
includes KeyboardInterrupt and the CLI's SIGTERM (see `deployfuse.cli`); the signals wait while a
temporary is made or removed (`interrupts.held`), so none is left between the two.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from deployfuse.errors import UsageError, first_line
from deployfuse.interrupts import held

if TYPE_CHECKING:
    import onnx

PathLike = str | os.PathLike[str]


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def check_writable_target(path: PathLike, flag: str = "output") -> Path:
    """Return `path` as a Path after checking its directory exists and is writable, and that
    it is not a directory or another existing non-regular file (FIFO, device, socket)."""
    target = Path(path)
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"{flag} {target}: output directory does not exist: {parent}")
    if target.is_dir():
        raise UsageError(f"{flag} {target}: output path is a directory")
    with contextlib.suppress(FileNotFoundError):
        mode = target.stat().st_mode
        if not stat.S_ISREG(mode):
            raise UsageError(f"{flag} {target}: exists and is {_kind(mode)}; deployfuse writes only regular files")
    try:  # os.access says yes to root even on read-only file systems: try for real
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as exc:
        raise UsageError(f"{flag} {target}: output directory is not writable: {parent} ({exc.strerror})") from exc
    return target


def _same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file: the same inode when both exist, else the same resolved path."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()


def check_writable_folder(path: PathLike, flag: str = "output") -> Path:
    """Return `path` as a Path after checking that it can be created or replaced as a folder:
    its parent exists and is writable, and it is not an existing file."""
    target = Path(path)
    parent = target.resolve().parent
    if not parent.is_dir():
        raise UsageError(f"{flag} {target}: the folder to create it in does not exist: {parent}")
    if target.exists() and not target.is_dir():
        raise UsageError(f"{flag} {target}: exists and is not a folder")
    try:
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as exc:
        raise UsageError(f"{flag} {target}: cannot write in {parent} ({exc.strerror})") from exc
    return target


def check_outputs(outputs: Mapping[str, PathLike | None], inputs: Mapping[str, PathLike | None] | None = None, folders: Collection[str] = ()) -> dict[str, Path]:
    """Check every output path of one run before any work; return them as Paths by flag.

    Args:
        outputs: flag -> path to be written (None: not asked for), e.g. {"-o": ..., "--report": ...}.
        inputs: flag -> path the run reads (None or a non-path such as `pkg.mod:fn`: skipped).
        folders: the output flags that name a folder the run creates or replaces (`--triton`):
            an input inside it would be deleted with it.

    Raises:
        UsageError: an output is not writable (see `check_writable_target`), names one of the
            inputs or an existing file inside an input folder (a Hugging Face model), or names
            the same file as another output.
    """
    checked: dict[str, Path] = {}
    for flag, path in outputs.items():
        if path is None:
            continue
        target = check_writable_folder(path, flag) if flag in folders else check_writable_target(path, flag)
        for in_flag, source in (inputs or {}).items():
            if source is None or not Path(source).exists():
                continue
            if _same_file(target, Path(source)):
                raise UsageError(f"{flag} {target} is the {in_flag} of this run: it would be overwritten; choose another path")
            if flag in folders and Path(source).resolve().is_relative_to(target.resolve()):
                raise UsageError(f"{flag} {target} holds the {in_flag} of this run: replacing the folder would delete it; choose another folder")
            if Path(source).is_dir() and target.exists() and target.resolve().is_relative_to(Path(source).resolve()):
                raise UsageError(f"{flag} {target} is a file of the {in_flag} folder of this run: it would be overwritten; choose another path")
        for other_flag, other in checked.items():
            if _same_file(target, other):
                raise UsageError(f"{flag} and {other_flag} both name {target}: give each output its own path")
        checked[flag] = target
    return checked


def load_onnx(path: PathLike, *, weights: bool = True) -> onnx.ModelProto:
    """The ONNX model at `path` (without its external weights unless `weights`: enough for
    metadata, nodes and the signature); UsageError naming the file when it is missing or not ONNX."""
    import onnx

    if not Path(path).is_file():
        raise UsageError(f"no such ONNX file: {path}")
    try:
        return onnx.load(os.fspath(path), load_external_data=weights)
    except Exception as exc:  # protobuf raises DecodeError and friends
        raise UsageError(f"{path} is not a readable ONNX model: {first_line(exc, typed=True)}") from exc


@contextlib.contextmanager
def atomic_path(path: PathLike) -> Iterator[Path]:
    """Yield a temporary path in the target's directory; rename it over `path` on success.

    The temporary lives beside the target so the final rename stays on one file system.
    On any exception (KeyboardInterrupt included) the temporary is removed and the target is
    left untouched.
    """
    target = check_writable_target(path)
    tmp: Path | None = None
    try:
        with held():  # the descriptor is closed before a signal noted in here is raised
            fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
            tmp = Path(tmp_name)
            os.close(fd)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a written artefact gets the usual mode
        yield tmp
        os.replace(tmp, target)
    finally:
        if tmp is not None:
            with held(), contextlib.suppress(FileNotFoundError):
                tmp.unlink()


@contextlib.contextmanager
def temporary_folder(parent: PathLike, prefix: str, suffix: str = "") -> Iterator[Path]:
    """A new hidden folder in `parent` (same file system as the target: renames out of it are
    atomic), removed with whatever is left in it when the block ends, however it ends."""
    folder: Path | None = None
    try:
        with held():
            folder = Path(tempfile.mkdtemp(prefix=prefix, suffix=suffix, dir=parent))
        yield folder
    finally:
        if folder is not None:
            with held():
                shutil.rmtree(folder, ignore_errors=True)


def write_text_atomic(path: PathLike, text: str) -> None:
    """Write `text` to `path` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def default_opset(model: onnx.ModelProto) -> int | None:
    """The model's opset of the default ONNX domain (None when it imports none)."""
    return next((i.version for i in model.opset_import if i.domain in ("", "ai.onnx")), None)
