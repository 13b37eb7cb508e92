"""Public names a package imports on first use, so importing the package stays light."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable


def lazy_getattr(package: str, names: dict[str, str]) -> Callable[[str], object]:
    """A module-level `__getattr__` for `package`: each of `names` (public name -> module
    defining it) is imported on first use and then kept on the package."""

    def __getattr__(name: str) -> object:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(names[name]), name)
        sys.modules[package].__dict__[name] = value
        return value

    return __getattr__
