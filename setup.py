"""Ships plugins/ (the native op sources and their CMake files) inside the wheel.

pyproject.toml holds all metadata; this only maps the repository's plugins/ folder to the
package folder deployfuse/_plugins, so `deployfuse plugins build` works from an installed
wheel. The folder stays at the repository root, where a source checkout builds it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SOURCES = Path(__file__).resolve().parent / "plugins"
INSTALLED_AS = Path("deployfuse") / "_plugins"


def plugin_files() -> list[Path]:
    """Every file of plugins/, relative to it, but its build/ output and hidden files."""
    found = (p.relative_to(SOURCES) for p in SOURCES.rglob("*") if p.is_file())
    return sorted(p for p in found if p.parts[0] != "build" and not any(part.startswith(".") for part in p.parts))


class BuildPyWithPlugins(build_py):
    """build_py that also copies plugins/ into the built package (not for editable installs,
    whose package finds plugins/ in the checkout)."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / INSTALLED_AS
        for rel in plugin_files():
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(SOURCES / rel, target / rel)


setup(cmdclass={"build_py": BuildPyWithPlugins})
