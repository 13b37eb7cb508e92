"""Shared test helpers: run the CLI in-process, and check an ONNX file against PyTorch."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # tests import the zoo as `zoo`
sys.path.insert(0, str(ROOT))  # factories like examples.tiny_bert:build

# Under pytest-xdist each worker gets one thread, so workers do not fight over the 2 cores.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)


@pytest.fixture
def cli(capsys):
    """Run `deployfuse ARGS...` in this process; return (exit code, stdout, stderr)."""
    from deployfuse.cli import main

    def run(*args: str) -> tuple[int, str, str]:
        try:
            code = main([str(a) for a in args])
        except SystemExit as exc:  # argparse exits on malformed flags
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    return run


def assert_onnx_matches_torch(onnx_path: Path, module: torch.nn.Module, inputs: dict[str, torch.Tensor], rtol: float = 1e-4) -> None:
    """Run the ONNX file on ORT (optimisations off) and the module on `inputs`; outputs must agree."""
    from deployfuse.export import flatten_outputs

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    feed_names = {i.name for i in session.get_inputs()}
    got = dict(zip([o.name for o in session.get_outputs()], session.run(None, {k: v.numpy() for k, v in inputs.items() if k in feed_names})))
    with torch.inference_mode():
        expected = flatten_outputs(module(**inputs))
    assert set(expected) <= set(got), f"ONNX outputs {sorted(got)} lack {sorted(set(expected) - set(got))}"
    for name, want in expected.items():
        want = want.numpy()
        scale = max(float(np.abs(want).max()), 1e-6)
        err = float(np.abs(got[name] - want).max())
        assert err <= rtol * scale, f"{name}: max abs error {err:.3e} > {rtol} x {scale:.3e}"


def pytest_collection_modifyitems(config, items) -> None:
    """The form matrix's `slow` forms (fp16, bf16, TorchScript *args) run only when a -m
    expression names `slow`: the suite's addopts deselect nothing by marker, so without this
    they would run in CI. They must pass when run (`pytest -m slow tests/rewrite/test_form_matrix.py`)."""
    if "slow" in (config.getoption("markexpr") or ""):
        return
    slow = [i for i in items if i.get_closest_marker("slow") is not None and "test_form_matrix" in i.nodeid]
    if slow:
        items[:] = [i for i in items if i not in slow]
        config.hook.pytest_deselected(items=slow)
