"""Export progress: plain finished-step lines off a terminal, a live coloured display with the
fusion family on one, and --log-file with every step, family and third-party warning."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from deployfuse.cli._progress import ExportProgress
from deployfuse.report import Step

FACTORY = '''
import warnings
import torch

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        warnings.warn("the model warns on every call", UserWarning)
        return torch.nn.functional.gelu(self.linear(x))

def build():
    torch.manual_seed(0)  # compare rebuilds it: the same weights
    return Model(), (torch.randn(2, 8),)
'''


@pytest.fixture
def warns(tmp_path, monkeypatch):
    """`warns:build` importable from tmp_path, the current folder."""
    (tmp_path / "warns.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_plain_lines_off_a_terminal_and_a_full_log_file(cli, warns):
    code, _, stderr = cli("export", "warns:build", "-o", "m.onnx", "--log-file", "run.log")
    assert code == 0, stderr
    assert "\x1b[" not in stderr and "the model warns" not in stderr  # no colour in a pipe; warnings go to the log
    steps = [line.split()[:2] for line in stderr.splitlines() if line.split()[:1] and line.split()[0] in ("load", "export", "fuse", "verify", "save")]
    assert steps == [["load", "ok"], ["export", "ok"], ["fuse", "ok"], ["verify", "ok"], ["save", "ok"]]
    log = (warns / "run.log").read_text()
    assert "deployfuse export warns:build -o m.onnx --log-file run.log" in log
    assert "UserWarning: the model warns on every call" in log
    assert "fuse: family gelu" in log and "save: ok" in log


def test_compare_log_file_takes_the_stages_and_the_warnings(cli, warns):
    code, _, stderr = cli("export", "warns:build", "-o", "m.onnx", "--no-fuse", "-q")
    assert code == 0, stderr
    code, stdout, stderr = cli("compare", "warns:build", "m.onnx", "--iterations", "2", "--warmup", "1", "--log-file", "compare.log")
    assert code == 0, stdout + stderr
    assert "running torch, ort-cpu" in stderr and "the model warns" not in stdout + stderr
    log = (warns / "compare.log").read_text()
    assert "deployfuse compare warns:build m.onnx" in log and "running torch, ort-cpu" in log and "timing ort-cpu" in log
    assert "UserWarning: the model warns on every call" in log


def test_live_display_on_a_terminal_shows_the_family_and_colours_the_status():
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, color_system="standard", width=100)
    with ExportProgress(console=console) as progress:
        progress("fuse", None)
        progress.family("attention", 4, 13)
        assert progress._bar.tasks[0].description == "fuse: attention" and progress._bar.tasks[0].completed == 4
        progress("fuse", Step("fuse", "ok", 1.5, "43 nodes"))
        progress("verify", Step("verify", "failed", 0.1, "logits differs"))
    text = screen.getvalue()
    assert "\x1b[32mok" in text and "\x1b[1;31mfailed" in text and "43 nodes" in text


def test_unwritable_log_file_is_bad_input(cli, tmp_path):
    code, _, stderr = cli("export", "examples.tiny_bert:build", "-o", tmp_path / "x.onnx", "--log-file", tmp_path / "no" / "such" / "run.log")
    assert code == 2 and "--log-file" in stderr and "output directory does not exist" in stderr  # checked as every output is
    assert not (tmp_path / "x.onnx").exists()


def test_log_file_never_overwrites_an_input_or_another_output(cli, tmp_path):
    model, onnx_file = tmp_path / "m.pt", tmp_path / "m.onnx"
    model.write_bytes(b"not really a model")  # its bytes must survive
    onnx_file.write_bytes(b"nor an ONNX file")
    for args, flag in [(("export", model, "-o", onnx_file, "--log-file", model), "MODEL"),
                       (("export", model, "-o", tmp_path / "new.onnx", "--log-file", tmp_path / "new.onnx"), "-o"),
                       (("compare", model, onnx_file, "--log-file", onnx_file), "ONNX")]:
        code, _, stderr = cli(*args)
        assert code == 2 and "--log-file" in stderr and f"{flag} " in stderr and str(args[-1]) in stderr, stderr
    assert model.read_bytes() == b"not really a model" and onnx_file.read_bytes() == b"nor an ONNX file"
