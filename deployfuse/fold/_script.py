"""Fold BatchNorm in a TorchScript module with `torch.jit.freeze`, in place.

Freezing inlines the module and turns its attributes into constants; then TorchScript's own
frozen conv-bn fold runs, which checks that the BatchNorm is in eval mode and that the conv
output has no other user. Freezing's other numeric passes are left out: its linear-bn fold does
not check that the Linear output is 2-D (a 3-D one, which BatchNorm1d normalises along axis 1,
comes out wrong), and conv-add / conv-mul folding is not ours to do. ConvTranspose + BatchNorm
and Linear + BatchNorm therefore stay, and are reported. A TorchScript graph carries no ranks, so
a Conv1d fed an unbatched (2-D) input into BatchNorm1d is the one case trusted, not proven.

The frozen module replaces the original's C++ module (`_reconstruct`), so the caller's object is
updated in place; only `forward` is kept, as freezing does.
"""

from __future__ import annotations

import warnings
from collections import Counter

import torch

from deployfuse.fold._report import KINDS, FoldReport

_LAYER_KINDS = {
    **dict.fromkeys(("aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::_convolution"), "conv-bn"),
    **dict.fromkeys(("aten::conv_transpose1d", "aten::conv_transpose2d", "aten::conv_transpose3d"), "convtranspose-bn"),
    "aten::linear": "linear-bn",
}


def fold_script(module: torch.jit.ScriptModule) -> FoldReport:
    """Freeze `module` in place, fold its conv-bn pairs, and report what was folded and what stayed."""
    report = FoldReport(method="torch.jit.freeze")
    before = _batch_norms(module.inlined_graph)
    if not before:
        return report
    problem = None
    if not hasattr(module, "_reconstruct"):
        problem = f"a {type(module).__name__} cannot be frozen in place"
    elif module.training:
        problem = "the module is in training mode"
    if problem is None:
        try:
            with warnings.catch_warnings():  # freezing is deprecated, but TorchScript input has no other route
                warnings.simplefilter("ignore", FutureWarning)
                frozen = torch.jit.freeze(module, optimize_numerics=False)
            torch._C._jit_pass_fold_frozen_conv_bn(frozen.graph)
        except Exception as error:  # noqa: BLE001 - freezing fails on many attribute patterns; fold nothing, say why
            problem = f"torch.jit.freeze failed ({type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''})"
    if problem is not None:
        for name, _, _ in before:
            report.skip(name, problem)
        return report
    after = _batch_norms(frozen.graph)
    left = Counter(kind for _, kind, _ in after)
    for kind, n in Counter(kind for _, kind, _ in before).items():
        if kind in KINDS:
            report.counts[kind] = n - left[kind]
    module._reconstruct(frozen._c)
    for name, _, why in after:
        report.skip(name, why)
    return report


def _batch_norms(graph: torch.Graph) -> list[tuple[str, str | None, str]]:
    """Each aten::batch_norm in `graph` (nested blocks too): its name, its input layer's kind, why it is there."""
    found = []
    for node in graph.findAllNodes("aten::batch_norm"):  # type: ignore[attr-defined]  # missing from torch._C stubs
        inputs = list(node.inputs())
        found.append((_name(inputs), _LAYER_KINDS.get(inputs[0].node().kind()), _problem(inputs)))
    return found


def _name(inputs: list[torch.Value]) -> str:
    """The BatchNorm's attribute path, read off the names of its stored tensors (mean, var, weight, bias)."""
    for value in (inputs[3], inputs[4], inputs[1], inputs[2]):
        name = value.debugName()
        if isinstance(value.type(), torch.TensorType) and name.startswith("self.") and "." in name[5:]:
            return name[5:].rsplit(".", 1)[0]
    return inputs[3].debugName()


def _problem(inputs: list[torch.Value]) -> str:
    """Why freezing could not fold this batch_norm (inputs: x, weight, bias, mean, var, training, ...)."""
    kind = _LAYER_KINDS.get(inputs[0].node().kind())
    if not isinstance(inputs[3].type(), torch.TensorType):
        return "no running statistics (track_running_stats=False)"
    if inputs[5].toIValue() is not False:
        return "in training mode (normalises with batch statistics)"
    if kind is None:
        return "input is not a conv / conv-transpose / linear output"
    if kind == "convtranspose-bn":
        return "torch.jit.freeze does not fold ConvTranspose + BatchNorm"
    if kind == "linear-bn":
        return "Linear + BatchNorm is not folded in TorchScript: the graph does not say whether the Linear output is 2-D"
    return "the conv output has another user, or its weight is not constant"
