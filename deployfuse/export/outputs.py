"""Name a model's outputs: one ONNX output per tensor of a tuple, dict or ModelOutput.

Names follow the pytree path of each tensor in the output, in the order the exporters
flatten it: `last_hidden_state`, `pooler_output` for a transformers ModelOutput,
`output_0`, `output_1` for a tuple, `output` for a single tensor, `logits_0_a` when nested.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree


def _key_name(entry: Any) -> str:
    for attr in ("key", "idx", "name"):
        if hasattr(entry, attr):
            return str(getattr(entry, attr))
    return str(entry)


def flatten_outputs(value: Any) -> dict[str, torch.Tensor]:
    """The tensors in `value` keyed by an ONNX-friendly name derived from their path."""
    if isinstance(value, torch.Tensor):
        return {"output": value}
    leaves, _ = _pytree.tree_flatten_with_path(value)
    named: dict[str, torch.Tensor] = {}
    for path, leaf in leaves:
        if not isinstance(leaf, torch.Tensor):
            continue
        parts = [_key_name(p) for p in path]
        name = "_".join(parts) if parts else "output"
        if parts and parts[0].isdigit():
            name = "output_" + name
        named[name] = leaf
    return named
