"""Every report says where it came from: versions, device, threads, seed, command line, UTC time.

Runs the real CLI on a small MLP (export --report, then compare --json and --report HTML) and
checks each provenance block against what this process sees installed.
"""

from __future__ import annotations

import datetime
import json
import os
from importlib import metadata

import pytest
import torch

FACTORY = '''
import torch

def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    return model, (torch.randn(3, 16),)
'''


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    (tmp_path / "tiny_mlp.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)  # package.module:callable imports from the current folder
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _check(block, command, seed):
    installed = {name: metadata.version(name) for name in ("deployfuse", "onnx", "onnxruntime", "onnxscript", "polygraphy")}
    for name, version in installed.items():
        assert block["versions"][name] == version, name
    assert block["versions"]["torch"] == torch.__version__
    assert "tensorrt-rtx" in block["versions"] or "tensorrt" in block["versions"]  # the dev install has TensorRT-RTX
    assert block["device"]["cpu"] and isinstance(block["device"]["gpus"], list)
    assert "CPUExecutionProvider" in block["device"]["onnxruntime_providers"]
    assert block["threads"]["cpu_count"] == os.cpu_count() and block["threads"]["torch"] == torch.get_num_threads()
    assert block["seed"] == seed and block["command"] == command
    age = datetime.datetime.now(datetime.timezone.utc) - datetime.datetime.fromisoformat(block["time_utc"])
    assert datetime.timedelta(0) <= age < datetime.timedelta(minutes=10)


def test_export_and_compare_reports_carry_provenance(cli, workdir):
    code, _, stderr = cli("export", "tiny_mlp:build", "-o", "mlp.onnx", "--report", "export.json", "--seed", "7", "-q")
    assert code == 0, stderr
    _check(json.loads((workdir / "export.json").read_text())["provenance"], "deployfuse export tiny_mlp:build -o mlp.onnx --report export.json --seed 7 -q", 7)

    args = ("compare", "tiny_mlp:build", "mlp.onnx", "--iterations", "3", "--warmup", "1", "--seed", "11", "--json", "cmp.json", "--report", "cmp.html")
    code, stdout, stderr = cli(*args)
    assert code == 0, stdout + stderr
    _check(json.loads((workdir / "cmp.json").read_text())["provenance"], "deployfuse " + " ".join(args), 11)
    page = (workdir / "cmp.html").read_text()
    assert "<h2>Environment</h2>" in page and f"<td class=text>{metadata.version('onnxruntime')}</td>" in page
    assert "deployfuse compare tiny_mlp:build mlp.onnx" in page


def test_version_names_deployfuse_and_its_runtimes(cli):
    code, stdout, _ = cli("--version")
    assert code == 0
    assert stdout.startswith(f"deployfuse {metadata.version('deployfuse')} (")
    assert f"onnxruntime {metadata.version('onnxruntime')}" in stdout and "torch " in stdout
