"""Artefacts the serving tests package and serve: a small MLP exported by deployfuse with a
dynamic batch axis, whose Linear + activation pairs become deployfuse.BiasAct nodes."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
import torch

from deployfuse.inputs import DynamicAxis


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.SiLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4),
    ).eval()


def export_mlp(out: Path, target: str) -> Path:
    import deployfuse

    deployfuse.export(mlp(), out, example_inputs=(torch.randn(2, 16),), dynamic=[DynamicAxis("input", 0, "batch")], target=target)
    return out


@pytest.fixture(scope="session")
def mlp_onnx(tmp_path_factory) -> Path:
    """ort-cuda target: deployfuse.BiasAct nodes, a batch axis, CUDA options in the metadata."""
    path = export_mlp(tmp_path_factory.mktemp("mlp") / "mlp.onnx", "ort-cuda")
    assert any(n.domain == "deployfuse" for n in onnx.load(str(path)).graph.node), "the fixture must exercise deployfuse.* nodes"
    return path


@pytest.fixture(scope="session")
def mlp_engine(tmp_path_factory) -> tuple[Path, Path]:
    """(engine, the ONNX it was built from): TensorRT-RTX builds for compute capability 8.9 without a GPU."""
    from deployfuse import build_engine

    folder = tmp_path_factory.mktemp("mlp_trt")
    source = export_mlp(folder / "mlp.onnx", "tensorrt")
    engine = folder / "mlp.plan"
    build_engine(source, engine, compute_capability="8.9", builder="tensorrt-rtx")
    return engine, source
