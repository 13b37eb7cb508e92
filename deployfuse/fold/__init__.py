"""Fold eval-mode BatchNorm into the Conv / ConvTranspose / Linear layer before it, before export.

`fold_batchnorm` works in place on every model form `deployfuse.loading` produces:
a plain `nn.Module` (pairs found with torch.fx or torch.export, BatchNorm replaced by
`nn.Identity`), an aten-level `GraphModule` from `torch.export.load(...).module()` (folded in its
graph), and a TorchScript module (`torch.jit.freeze`). Arithmetic lives in `_weights`.
"""

from __future__ import annotations

import torch
from torch import fx

from deployfuse.fold._aten import fold_aten_graph
from deployfuse.fold._modules import ExampleInputs, fold_modules
from deployfuse.fold._report import KINDS, FoldReport
from deployfuse.fold._script import fold_script

__all__ = ["KINDS", "FoldReport", "fold_batchnorm"]


def fold_batchnorm(module: torch.nn.Module, example_inputs: ExampleInputs | None = None) -> FoldReport:
    """Fold every provably safe layer -> BatchNorm pair of `module` in place (`module` in eval mode).

    Args:
        module: the model; BatchNorms in training mode are never folded.
        example_inputs: positional tensors, or tensors by forward parameter name. Optional; they
            let a model that torch.fx cannot trace be traced with torch.export, and tell whether
            a BatchNorm1d input is 2-D or 3-D (without them Linear/Conv1d + BatchNorm1d are skipped).

    Returns:
        Counts per kind ("conv-bn", "convtranspose-bn", "linear-bn") and one line per BatchNorm
        left in place, saying why.
    """
    if isinstance(module, torch.jit.ScriptModule):
        return fold_script(module)
    if isinstance(module, fx.GraphModule) and any(isinstance(n.target, torch._ops.OpOverload) for n in module.graph.nodes):
        return fold_aten_graph(module)
    return fold_modules(module, example_inputs)
