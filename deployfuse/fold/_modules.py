"""Fold BatchNorm modules of an `nn.Module` into the Conv / ConvTranspose / Linear module feeding them.

The pairs come from a graph of the forward, so "the layer output feeds only the BatchNorm" is
read off the graph, not guessed from module order: `torch.fx.symbolic_trace` where it works
(torchvision-style models), else `torch.export` (non-strict, needs example inputs), whose aten
nodes carry `nn_module_stack` naming the module each came from. A folded BatchNorm is replaced
by `nn.Identity` in its parent; the layer's weight is updated in place and gains a bias if it
had none.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.utils import parametrize

from deployfuse.errors import first_line
from deployfuse.fold._aten import is_batch_norm, producer_of
from deployfuse.fold._report import FoldReport
from deployfuse.fold._weights import batchnorm_scale_shift, fold_weights, output_channels

ExampleInputs = Sequence[torch.Tensor] | Mapping[str, torch.Tensor]

# layer type -> (report kind, the BatchNorm type whose channel axis is the layer's output channels)
_PAIRS: dict[type[nn.Module], tuple[str, type[nn.Module]]] = {
    nn.Conv1d: ("conv-bn", nn.BatchNorm1d),
    nn.Conv2d: ("conv-bn", nn.BatchNorm2d),
    nn.Conv3d: ("conv-bn", nn.BatchNorm3d),
    nn.ConvTranspose1d: ("convtranspose-bn", nn.BatchNorm1d),
    nn.ConvTranspose2d: ("convtranspose-bn", nn.BatchNorm2d),
    nn.ConvTranspose3d: ("convtranspose-bn", nn.BatchNorm3d),
    nn.Linear: ("linear-bn", nn.BatchNorm1d),
}


@dataclass(frozen=True)
class _Link:
    """One BatchNorm call in the traced graph and what feeds it."""

    batchnorm: str  # module path
    layer: str | None  # module path of the layer whose output is the BatchNorm input, if any
    source: str  # the input node, for messages
    other_users: int  # consumers of the layer output besides this BatchNorm


def fold_modules(module: nn.Module, example_inputs: ExampleInputs | None = None) -> FoldReport:
    """Fold every provably safe layer -> BatchNorm pair of `module` in place."""
    paths = {id(m): p for p, m in module.named_modules()}
    batchnorms = [p for p, m in module.named_modules() if isinstance(m, _BatchNorm)]
    report = FoldReport()
    if not batchnorms:
        return report
    args, kwargs = _split(example_inputs)
    try:
        links, calls = _links_fx(module, paths)
        report.method = "fx"
    except Exception as fx_error:  # symbolic tracing fails on data-dependent Python; many exception types
        if example_inputs is None:
            for path in batchnorms:
                report.skip(path, f"torch.fx cannot trace the model ({first_line(fx_error, typed=True)}); give example inputs to trace it with torch.export")
            return report
        try:
            links, calls = _links_export(module, args, kwargs)
            report.method = "torch.export"
        except Exception as export_error:  # noqa: BLE001 - any tracing failure means: fold nothing, say why
            for path in batchnorms:
                report.skip(path, f"neither torch.fx ({first_line(fx_error, typed=True)}) nor torch.export ({first_line(export_error, typed=True)}) can trace the model")
            return report
    ranks = _output_ranks(module, {link.layer for link in links if link.layer}, args, kwargs) if example_inputs is not None else {}
    shared = _shared_parameters(module)
    seen = set()
    for link in links:
        seen.add(link.batchnorm)
        problem = _problem(module, link, calls, ranks, shared)
        if problem is not None:
            report.skip(link.batchnorm, problem)
            continue
        assert link.layer is not None
        _fold(module, link.layer, link.batchnorm)
        report.add(_PAIRS[type(module.get_submodule(link.layer))][0])
    for path in batchnorms:
        if path not in seen:
            report.skip(path, "not called by the traced forward")
    return report


def _split(example_inputs: ExampleInputs | None) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if example_inputs is None:
        return (), {}
    if isinstance(example_inputs, Mapping):
        return (), dict(example_inputs)
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,), {}
    return tuple(example_inputs), {}


def _links_fx(module: nn.Module, paths: dict[int, str]) -> tuple[list[_Link], Counter[str]]:
    graph = fx.symbolic_trace(module).graph
    canonical = {n.target: paths.get(id(module.get_submodule(n.target)), n.target) for n in graph.nodes if n.op == "call_module"}
    calls = Counter(canonical[n.target] for n in graph.nodes if n.op == "call_module")
    links = []
    for node in graph.nodes:
        if node.op == "call_module" and isinstance(module.get_submodule(node.target), _BatchNorm):
            source = node.args[0]
            layer = canonical[source.target] if isinstance(source, fx.Node) and source.op == "call_module" else None
            users = len(source.users) if isinstance(source, fx.Node) else 1
            links.append(_Link(canonical[node.target], layer, str(source), users - 1))
    return links, calls


def _module_path(node: fx.Node) -> str | None:
    stack = node.meta.get("nn_module_stack")
    return str(list(stack.values())[-1][0]) if stack else None


def _links_export(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[_Link], Counter[str]]:
    graph = torch.export.export(module, args, kwargs, strict=False).graph
    calls: Counter[str] = Counter()
    links = []
    for node in graph.nodes:
        path = _module_path(node)
        if path is None or not (is_batch_norm(node) or producer_of(node)):
            continue
        calls[path] += 1
        if is_batch_norm(node) and isinstance(_submodule(module, path), _BatchNorm):
            source = node.args[0]
            layer = _module_path(source) if isinstance(source, fx.Node) and producer_of(source) else None
            links.append(_Link(path, layer, str(source), len(source.users) - 1 if isinstance(source, fx.Node) else 0))
    return links, calls


def _submodule(module: nn.Module, path: str) -> nn.Module | None:
    try:
        return module.get_submodule(path)
    except AttributeError:
        return None


def _output_ranks(module: nn.Module, layers: set[str], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, int]:
    """Rank of each layer's output in one forward on the example inputs (hooks; no graph needed).

    Buffers are restored afterwards: the forward must not move a training-mode BatchNorm's statistics.
    """
    buffers = [(b, b.clone()) for b in module.buffers()]
    ranks: dict[str, int] = {}
    handles = []
    for path in layers:
        def record(_m: nn.Module, _i: Any, out: Any, path: str = path) -> None:
            if isinstance(out, torch.Tensor):
                ranks[path] = out.dim()
        handles.append(module.get_submodule(path).register_forward_hook(record))
    try:
        with torch.no_grad():
            module(*args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
        with torch.no_grad():
            for buffer, saved in buffers:
                buffer.copy_(saved)
    return ranks


def _shared_parameters(module: nn.Module) -> set[int]:
    counts = Counter(id(p) for _, p in module.named_parameters(remove_duplicate=False))
    return {key for key, n in counts.items() if n > 1}


def _problem(module: nn.Module, link: _Link, calls: Counter[str], ranks: dict[str, int], shared: set[int]) -> str | None:  # noqa: PLR0911
    """Why this BatchNorm cannot be folded into its input layer, or None."""
    bn = module.get_submodule(link.batchnorm)
    if bn.training:
        return "in training mode (normalises with batch statistics)"
    if bn.running_mean is None or bn.running_var is None:
        return "no running statistics (track_running_stats=False)"
    if calls[link.batchnorm] > 1:
        return f"called {calls[link.batchnorm]} times"
    if link.layer is None:
        return f"input {link.source} is not the output of a Conv / ConvTranspose / Linear module"
    layer = module.get_submodule(link.layer)
    if type(layer) not in _PAIRS:
        return f"input comes from {link.layer} ({type(layer).__name__}), not a Conv / ConvTranspose / Linear"
    kind, bn_type = _PAIRS[type(layer)]
    if type(bn) is not bn_type:
        return f"{type(layer).__name__} + {type(bn).__name__}: BatchNorm normalises axis 1, which holds the {type(layer).__name__} output channels only for {bn_type.__name__}"
    if calls[link.layer] > 1:
        return f"{link.layer} is called {calls[link.layer]} times"
    if link.other_users:
        return f"the {link.layer} output also feeds {link.other_users} other node(s)"
    if parametrize.is_parametrized(layer):
        return f"{link.layer} has parametrized weights"
    if any(id(p) in shared for p in (layer.weight, layer.bias) if p is not None):
        return f"{link.layer} shares its weight or bias with another module"
    transposed = kind == "convtranspose-bn"
    channels = output_channels(layer.weight, transposed, getattr(layer, "groups", 1))
    if bn.num_features != channels:
        return f"{bn.num_features} BatchNorm channels, {channels} {link.layer} output channels"
    if bn_type is nn.BatchNorm1d:  # BatchNorm1d takes 2-D and 3-D input: only the rank says where the channels are
        expected = 2 if kind == "linear-bn" else 3
        rank = ranks.get(link.layer)
        if rank is None:
            return f"the rank of the {link.layer} output is unknown (give example inputs)"
        if rank != expected:
            return f"the {link.layer} output is {rank}-D; BatchNorm1d normalises axis 1, its channels only when it is {expected}-D"
    return None


def _fold(module: nn.Module, layer_path: str, bn_path: str) -> None:
    layer = module.get_submodule(layer_path)
    bn = module.get_submodule(bn_path)
    transposed = isinstance(layer, nn.modules.conv._ConvTransposeNd)
    scale, shift = batchnorm_scale_shift(bn.running_mean, bn.running_var, bn.eps, bn.weight, bn.bias)
    weight, bias = fold_weights(layer.weight, layer.bias, scale, shift, transposed, getattr(layer, "groups", 1))
    with torch.no_grad():
        layer.weight.copy_(weight)
        if layer.bias is not None:
            layer.bias.copy_(bias)
        else:
            layer.bias = nn.Parameter(bias, requires_grad=layer.weight.requires_grad)
    parent, _, name = bn_path.rpartition(".")
    setattr(module.get_submodule(parent), name, nn.Identity())
