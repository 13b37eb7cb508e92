"""Shared fixtures: zoo models exported once per session, with the `tensorrt` target."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import zoo


def export_zoo(name: str, out: Path, dynamic: bool) -> tuple[Path, torch.nn.Module]:
    """Export a zoo model with deployfuse's exporter (target tensorrt, no verification: the export tests do that)."""
    import deployfuse

    module, inputs = zoo.ZOO[name].build()
    deployfuse.export(module, out, example_inputs=inputs, dynamic=zoo.ZOO[name].dynamic if dynamic else (), target="tensorrt", verify=False)
    return out, module


@pytest.fixture(scope="session")
def bert_onnx(tmp_path_factory) -> Path:
    return export_zoo("bert", tmp_path_factory.mktemp("bert") / "bert.onnx", dynamic=True)[0]


@pytest.fixture(scope="session")
def resnet_onnx(tmp_path_factory) -> Path:
    return export_zoo("resnet18", tmp_path_factory.mktemp("resnet") / "resnet18.onnx", dynamic=False)[0]
