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


def _quick_start() -> list[list[str]]:
    """The commands of the README's first bash block, the Hugging Face quick start."""
    first = _bash_blocks()[0]
    return [shlex.split(line) for line in first.strip().splitlines()]


def test_install_and_test_commands_are_what_ci_runs():
    install, test = (b.strip() for b in _bash_blocks()[1:3])
    ci = (ROOT / ".ci" / "run").read_text()
    assert install in ci and test in ci


def test_hugging_face_quick_start_runs_from_any_folder(tmp_path):
    """Run the README's first commands (a save_pretrained folder, export by task, compare) and
    its InferenceSession snippet in an empty folder, as a user would."""
    commands = _quick_start()
    assert [c[:2] for c in commands] == [["python3", "-m"], ["deployfuse", "export"], ["deployfuse", "compare"]]
    for command in commands:
        program = [sys.executable] if command[0] == "python3" else [sys.executable, "-m", "deployfuse"]
        done = subprocess.run([*program, *command[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "tiny_bert.json").read_text())
    assert (tmp_path / "tiny_bert.onnx").is_file() and report["task"] == "fill-mask"
    assert "input_ids:1:sequence_length" in report["dynamic"] and len({json.dumps(v["shapes"]) for v in report["verify"]}) == 2
    compared = json.loads((tmp_path / "tiny_bert_compare.json").read_text())
    assert compared["passed"] and [o["name"] for o in compared["accuracy"][0]["outputs"]] == ["logits"]

    done = subprocess.run([sys.executable, "-c", _python_block("## Quick start")], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "(3, 40, 1000)", "a batch and sequence the export never saw"


def _python_block(after_heading: str) -> str:
    section = (ROOT / "README.md").read_text().split(after_heading, 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_python_api_example_runs_from_any_folder(tmp_path):
    """The README's Python API example, verbatim, in an empty folder outside the checkout (after
    the quick start's command that saves the `tiny-bert` folder it reads)."""
    save = _quick_start()[0]
    assert save[:2] == ["python3", "-m"]
    subprocess.run([sys.executable, *save[1:]], cwd=tmp_path, check=True, capture_output=True, timeout=600)
    checks = """
report = result.report
assert result.onnx_path.is_file() and report.verification["draws_per_shape"] == 3
assert len(report.verification["shapes"]) == 2, "the dynamic seq axis is verified at a second length"
assert all(o["passed"] for v in report.to_dict()["verify"] for o in v["outputs"])
"""
    done = subprocess.run([sys.executable, "-c", _python_block("## Python API") + checks], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "bert.onnx" in done.stdout and (tmp_path / "bert.onnx").is_file()
    assert not str(tmp_path).startswith(str(ROOT))
