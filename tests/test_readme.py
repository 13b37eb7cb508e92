"""The README's commands are the ones CI and users run: keep them true."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

from conftest import ROOT


def _bash_blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def test_install_and_test_commands_are_what_ci_runs():
    install, test = (b.strip() for b in _bash_blocks()[:2])
    ci = (ROOT / ".ci" / "run").read_text()
    assert install in ci and test in ci


def test_export_command_runs(tmp_path):
    """Run the README's export from the repo root, as a user would, writing into tmp_path."""
    command = shlex.split(_bash_blocks()[2].strip())
    assert command[:2] == ["deployfuse", "export"]
    args = [str(tmp_path / a) if a.endswith((".onnx", ".json")) else a for a in command[2:]]
    done = subprocess.run([sys.executable, "-m", "deployfuse", "export", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "tiny_bert.json").read_text())
    assert (tmp_path / "tiny_bert.onnx").is_file() and len(report["verify"]) == 2
