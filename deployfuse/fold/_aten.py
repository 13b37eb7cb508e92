"""Fold BatchNorm inside an aten-level `torch.fx.GraphModule` (what `torch.export.load(...).module()`
gives): parameters are `get_attr` nodes, layers are `aten.conv*` / `aten.linear` calls.

A pair is folded only when the graph proves it is safe: the BatchNorm is in eval mode with
running statistics, its input is a conv / conv-transpose / linear call whose output has no other
user, whose weight (and bias) attributes are read nowhere else, and whose output has the channel
axis where BatchNorm expects it (axis 1; a linear output must therefore be 2-D).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from functools import reduce
from typing import cast

import torch
from torch import fx

from deployfuse.fold._report import FoldReport
from deployfuse.fold._weights import batchnorm_scale_shift, fold_weights, output_channels

aten = torch.ops.aten

_CONVS = {aten.conv1d.default, aten.conv2d.default, aten.conv3d.default, aten.conv1d.padding, aten.conv2d.padding, aten.conv3d.padding}
_CONV_TRANSPOSES = {aten.conv_transpose1d.default, aten.conv_transpose2d.input, aten.conv_transpose3d.input}
_BATCH_NORMS = {aten.batch_norm.default, aten._native_batch_norm_legit_no_training.default}


@dataclass(frozen=True)
class Producer:
    """A conv / conv-transpose / linear call as far as folding cares."""

    kind: str  # a key of FoldReport.counts
    transposed: bool
    groups: int


def producer_of(node: fx.Node) -> Producer | None:
    """Describe `node` if it is an aten conv / conv-transpose / linear call (with bias at args[2])."""
    if node.op != "call_function":
        return None
    target, args = node.target, node.args
    if target in _CONVS:
        return Producer("conv-bn", False, int(node.kwargs.get("groups", args[6] if len(args) > 6 else 1)))
    if target in _CONV_TRANSPOSES:
        return Producer("convtranspose-bn", True, int(node.kwargs.get("groups", args[6] if len(args) > 6 else 1)))
    if target == aten.convolution.default:
        transposed = bool(args[6])
        return Producer("convtranspose-bn" if transposed else "conv-bn", transposed, int(args[8]))
    if target == aten.linear.default:
        return Producer("linear-bn", False, 1)
    return None


def is_batch_norm(node: fx.Node) -> bool:
    """True for an aten batch-norm call (the functional form or the eval-only decomposition)."""
    return node.op == "call_function" and node.target in _BATCH_NORMS


def batch_norm_problem(node: fx.Node) -> str | None:
    """Why this aten batch-norm call cannot be folded on its own account, or None."""
    if node.args[3] is None or node.args[4] is None:
        return "no running statistics (track_running_stats=False)"
    if node.target == aten.batch_norm.default and (node.args[5] if len(node.args) > 5 else node.kwargs.get("training")):
        return "in training mode (normalises with batch statistics)"
    return None


def channel_axis_problem(producer_node: fx.Node, producer: Producer, weight_rank: int) -> str | None:
    """Why the producer's output would not have its channels on axis 1, or None (needs meta['val'])."""
    value = producer_node.meta.get("val")
    if not isinstance(value, torch.Tensor):
        return "the rank of the layer output is unknown"
    expected = 2 if producer.kind == "linear-bn" else weight_rank
    if value.dim() != expected:
        return f"the layer output is {value.dim()}-D; BatchNorm normalises axis 1, which holds its channels only when it is {expected}-D"
    return None


def _attr(root: torch.nn.Module, target: object) -> torch.Tensor:
    """The parameter or buffer a get_attr node's target names."""
    return cast(torch.Tensor, reduce(getattr, str(target).split("."), root))


def _param_name(node: object) -> str | None:
    return node.target if isinstance(node, fx.Node) and node.op == "get_attr" else None  # type: ignore[return-value]


def fold_aten_graph(gm: fx.GraphModule) -> FoldReport:
    """Fold every safe conv/conv-transpose/linear -> batch_norm pair of `gm` in place."""
    report = FoldReport(method="aten-graph")
    reads: dict[str, int] = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            reads[node.target] = reads.get(node.target, 0) + len(node.users)
    for bn in [n for n in gm.graph.nodes if is_batch_norm(n)]:
        name = _batch_norm_name(bn)
        reason = _pair_problem(gm, bn, reads)
        if reason is not None:
            report.skip(name, reason)
            continue
        layer = bn.args[0]
        producer = producer_of(layer)
        assert producer is not None and isinstance(layer, fx.Node)
        _fold_pair(gm, layer, producer, bn)
        report.add(producer.kind)
    gm.graph.lint()
    gm.recompile()
    return report


def _batch_norm_name(bn: fx.Node) -> str:
    stack = bn.meta.get("nn_module_stack")
    if stack:
        return str(list(stack.values())[-1][0])
    mean = _param_name(bn.args[3])
    return mean.rsplit(".", 1)[0] if mean and "." in mean else bn.name


def _pair_problem(gm: fx.GraphModule, bn: fx.Node, reads: dict[str, int]) -> str | None:
    problem = batch_norm_problem(bn)
    if problem is not None:
        return problem
    layer = bn.args[0]
    producer = producer_of(layer) if isinstance(layer, fx.Node) else None
    if producer is None:
        return f"input {getattr(layer, 'name', layer)} is not a conv / conv-transpose / linear output"
    assert isinstance(layer, fx.Node)
    if len(layer.users) != 1:
        return f"the {layer.name} output also feeds {len(layer.users) - 1} other node(s)"
    if bn.target == aten._native_batch_norm_legit_no_training.default and any(
        u.target is not operator.getitem or (u.args[1] != 0 and u.users) for u in bn.users
    ):
        return "its saved statistics are used"
    for i in (3, 4, *(i for i in (1, 2) if bn.args[i] is not None)):
        if _param_name(bn.args[i]) is None:
            return "its statistics or affine parameters are computed, not stored"
    weight = _param_name(layer.args[1])
    bias_arg = layer.args[2] if len(layer.args) > 2 else layer.kwargs.get("bias")
    bias = _param_name(bias_arg)
    if weight is None or (bias_arg is not None and bias is None):
        return f"the {layer.name} weight or bias is computed, not stored"
    if reads[weight] != 1 or (bias is not None and reads[bias] != 1):
        return f"the {layer.name} weight or bias is also read elsewhere"
    w = _attr(gm, weight)
    channels = output_channels(w, producer.transposed, producer.groups)
    if _attr(gm, bn.args[3].target).numel() != channels:  # type: ignore[union-attr]
        return f"{_attr(gm, bn.args[3].target).numel()} BatchNorm channels, {channels} layer output channels"  # type: ignore[union-attr]
    return channel_axis_problem(layer, producer, w.dim())


def _fold_pair(gm: fx.GraphModule, layer: fx.Node, producer: Producer, bn: fx.Node) -> None:
    gamma, beta, mean, var = (_attr(gm, a.target) if isinstance(a, fx.Node) else None for a in bn.args[1:5])
    eps = float(bn.args[7] if bn.target == aten.batch_norm.default else bn.args[6])
    scale, shift = batchnorm_scale_shift(mean, var, eps, gamma, beta)
    weight_target = str(layer.args[1].target)  # type: ignore[union-attr]
    weight = _attr(gm, weight_target)
    bias_arg = layer.args[2] if len(layer.args) > 2 else layer.kwargs.get("bias")
    bias = _attr(gm, bias_arg.target) if isinstance(bias_arg, fx.Node) else None
    new_weight, new_bias = fold_weights(weight, bias, scale, shift, producer.transposed, producer.groups)
    with torch.no_grad():
        weight.copy_(new_weight)
        if bias is not None:
            bias.copy_(new_bias)
    if bias is None:
        owner_path, _, attr = weight_target.rpartition(".")
        owner = gm.get_submodule(owner_path)
        name = _free_name(owner, "bias")
        owner.register_parameter(name, torch.nn.Parameter(new_bias, requires_grad=weight.requires_grad))
        with gm.graph.inserting_before(layer):
            bias_node = gm.graph.get_attr(f"{owner_path}.{name}" if owner_path else name)
        if len(layer.args) > 2:
            layer.update_arg(2, bias_node)
        elif "bias" in layer.kwargs:
            layer.update_kwarg("bias", bias_node)
        else:
            layer.args = (*layer.args, bias_node)
    _remove_batch_norm(gm, bn, layer)


def _free_name(owner: torch.nn.Module, name: str) -> str:
    suffix = 0
    while hasattr(owner, name if not suffix else f"{name}_{suffix}"):
        suffix += 1
    return name if not suffix else f"{name}_{suffix}"


def _remove_batch_norm(gm: fx.GraphModule, bn: fx.Node, layer: fx.Node) -> None:
    inputs = [a for a in bn.args if isinstance(a, fx.Node) and a is not layer]
    if bn.target == aten.batch_norm.default:
        bn.replace_all_uses_with(layer)
    else:
        for item in list(bn.users):
            if item.args[1] == 0:
                item.replace_all_uses_with(layer)
            gm.graph.erase_node(item)
    gm.graph.erase_node(bn)
    for node in inputs:
        if not node.users:
            gm.graph.erase_node(node)
