"""A real BERT (tests/zoo.py) saved as a file and exported once per session with
`deployfuse.export`, fused (ort-cpu rules) and unfused, and a helper to break a fused graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

import deployfuse
from deployfuse.compare.localize import fused_nodes


def perturb(model: onnx.ModelProto, node_name: str, input_index: int, delta: float = 0.0, scale: float = 1.0) -> onnx.ModelProto:
    """A copy where `node_name` reads its own copy of weight input `input_index`, as `w * scale + delta`.

    Cleanup shares equal initializers between nodes (all LayerNorm scales start as ones), so
    the weight is cloned first and only this node sees the change.
    """
    changed = onnx.ModelProto()
    changed.CopyFrom(model)
    node = next(n for n in changed.graph.node if n.name == node_name)
    weights = {t.name: t for t in changed.graph.initializer}
    value = numpy_helper.to_array(weights[node.input[input_index]]) * np.float32(scale) + np.float32(delta)
    clone = numpy_helper.from_array(value.astype(np.float32), f"{node.input[input_index]}.perturbed")
    changed.graph.initializer.append(clone)
    node.input[input_index] = clone.name
    return changed


@pytest.fixture(scope="session")
def bert_files(tmp_path_factory) -> dict[str, Path]:
    """bert.pt (pickled module), inputs.pt, and its unfused and fused exports (dynamic batch and seq)."""
    import zoo

    root = tmp_path_factory.mktemp("compare")
    entry = zoo.ZOO["bert"]
    module, example = entry.build()
    torch.save(module, root / "bert.pt")
    torch.save(example, root / "inputs.pt")
    deployfuse.export(root / "bert.pt", root / "unfused.onnx", example_inputs=example, dynamic=entry.dynamic,
                      trust_pickle=True, fuse=False, verify=False)
    deployfuse.export(root / "bert.pt", root / "fused.onnx", example_inputs=example, dynamic=entry.dynamic,
                      trust_pickle=True, target="ort-cpu", verify=False)
    return {"model": root / "bert.pt", "inputs": root / "inputs.pt", "unfused": root / "unfused.onnx", "fused": root / "fused.onnx", "dir": root}


@pytest.fixture(scope="session")
def bert_dynamic() -> list[str]:
    """The --dynamic flags of the BERT export."""
    import zoo

    return [f"--dynamic={d.name}:{d.axis}:{d.label}" for d in zoo.ZOO["bert"].dynamic]


def weighted_fused_nodes(model: onnx.ModelProto) -> list[tuple[str, int, str]]:
    """(node, input index, rule) of every fused node that reads a float weight, in graph order."""
    weights = {t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
    found = []
    for node, rule in fused_nodes(model):
        index = next((i for i, name in enumerate(node.input) if name in weights), None)
        if index is not None:
            found.append((node.name, index, rule))
    return found
