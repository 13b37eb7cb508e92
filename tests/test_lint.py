"""The Python sources pass the linters configured in pyproject.toml: ruff (pyflakes, pycodestyle,
import order, bugbear, pyupgrade) over the package, tests and benchmarks, and mypy over the
package. Both are in the dev extra; fix a failure where it points (`ruff check --fix` sorts
imports), not with a blanket `noqa` / `type: ignore`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=ROOT)


def test_ruff_finds_nothing():
    done = _run("ruff", "check", "--no-fix", "deployfuse", "tests", "bench")
    assert done.returncode == 0, "ruff check (see [tool.ruff] in pyproject.toml):\n" + (done.stdout + done.stderr)[-6000:]


def test_mypy_finds_nothing():
    done = _run("mypy")  # files and settings: [tool.mypy] in pyproject.toml
    assert done.returncode == 0, "mypy (see [tool.mypy] in pyproject.toml):\n" + (done.stdout + done.stderr)[-6000:]
