"""SIGTERM, SIGHUP and SIGINT as exceptions, held while a temporary is made or removed.

The CLI turns these signals (SIGINT: as Python does) into `Interrupted` so that finally-blocks remove half-written
temporaries on the way out. An exception can land between any two bytecodes, though: right after
`mkdtemp` returns, before the try that would remove the folder, or halfway through `rmtree`, and the
temporary stays behind. Inside `held()` the CLI's handler only notes the signal; the exception is
raised when the outermost held block ends, once the temporary is either owned by a try or gone.
Python runs signal handlers, and so raises these exceptions, on the main thread only: `held()` in
another thread has nothing to hold, and must not make the main thread's signals wait.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from deployfuse.errors import Interrupted

_depth = 0
_pending: list[int] = []


def raise_interrupted(signum: int, frame: object) -> None:
    """The CLI's handler for SIGTERM, SIGHUP and SIGINT: raise `Interrupted`, or note it inside `held()`."""
    if _depth:
        _pending.append(signum)
        return
    raise Interrupted(signum)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Within the block (nested blocks count as one) the CLI's signals wait; the first that came is
    raised as `Interrupted` when the outermost block ends."""
    global _depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if not _depth and _pending:
            signum = _pending[0]
            _pending.clear()
            raise Interrupted(signum)


__all__ = ["held", "raise_interrupted"]
