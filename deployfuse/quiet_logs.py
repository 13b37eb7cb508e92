"""Third-party libraries that log advice or harmless failures at WARNING, kept off the user's terminal while
deployfuse calls them (deployfuse reports what matters itself)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def quieted(logger_name: str | None = None) -> Iterator[None]:
    """The named logger (None: the root logger) at ERROR for the block's duration, its level restored after."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
