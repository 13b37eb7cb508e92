"""FP8 norm: a (Skip)LayerNormalization feeding fp8 GEMMs -> deployfuse.SkipLayerNormFp8, which quantizes their X (ort-cuda).

    Fp8GemmAct(SkipLayerNormalization(x, skip, g, b, bias), sx, ...)  ->  Fp8GemmAct(SkipLayerNormFp8(...).YQ, sx, ...)

Each Fp8GemmAct / Fp8Mlp runs its own quantize pass over X (a kernel and a read of [tokens, hidden] in fp16); in BERT,
GPT-2 and ViT the X of the QKV GEMM and of the MLP is a norm's output, so the norm writes the float8 copy instead, from
the row in registers (CUPTI on the H200, bench/results/h200_quant_fp8mlp.json: the quantize passes were 0.065-0.074 ms of
0.66-0.89 ms at batch 8, 0.16-0.27 ms at batch 64; two of the three a layer sit behind a norm). YQ is q(Y, XScale) of Y
in the graph's type, what the GEMMs' own passes computed: the same float8 values. Y stays where anything else reads it
(BERT's residual) and is dropped otherwise; SkipLayerNormalization's input_skip_bias_sum becomes Sum (GPT-2's residual).

Refused, with the reason in the returned list: GEMM readers with different XScale values (one YQ has one scale), a
LayerNormalization over more than the last axis, the norm's mean / inverse-std outputs in use, a reader whose K is not
a multiple of 16 (the CUDA GEMM reads a float8 X as it is, in rows of 16 bytes), non-constant parameters. A Reshape
between the norm and GEMMs that alone read it (GPT-2's Conv1D: [B, S, K] -> [B·S, K]) moves past them: they read YQ
[B, S, K] and their [B, S, N] is reshaped as it would have been (ONNX Runtime has no float8 Reshape). Not a family of
`rewrite.fuse` (see `rules.fp8_gemm`): `fp8_gemm.lower` applies it after the Fp8Mlp merge, on the final fp8 graph, where
the accuracy gate judges it. Its family name, `fp8_norm`, is the target's lowering key: a target without it keeps the
quantize passes in the GEMMs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from deployfuse.ops.defs import fp8_gemm_act, fp8_mlp, skip_layer_norm_fp8
from deployfuse.ops.functions import attach_functions
from deployfuse.rewrite.rules.fp8_mlp import _Graph
from deployfuse.targets import DEPLOYFUSE, MS, Target, get_target

FAMILY = "fp8_norm"
_READERS = (fp8_gemm_act.SPEC.name, fp8_mlp.SPEC.name)
_SKIP_EPSILON = 1e-12  # com.microsoft.SkipLayerNormalization's default
_LN_EPSILON = 1e-5  # LayerNormalization's


def _norm_kind(node: onnx.NodeProto) -> str | None:
    """"skip" for com.microsoft.SkipLayerNormalization, "ln" for LayerNormalization, else None."""
    if node.domain == MS and node.op_type == "SkipLayerNormalization":
        return "skip"
    if node.domain in ("", "ai.onnx") and node.op_type == "LayerNormalization":
        return "ln"
    return None


def _used(g: _Graph, name: str) -> bool:
    return bool(name) and (name in g.outputs or bool(g.readers.get(name)))


def _is_reader(g: _Graph, index: int, value: str) -> bool:
    node = g.nodes[index]
    return node.domain == DEPLOYFUSE and node.op_type in _READERS and node.input[0] == value


def _fp8_uses(g: _Graph, y: str) -> tuple[list[int], list[int]]:
    """The fp8 GEMMs reading `y` as X, directly or through a Reshape only they read whose constant shape ends in K (GPT-2's
    Conv1D flattens [B, S, K] to [B·S, K]), and those Reshapes."""
    readers, reshapes = [], []
    for i in dict.fromkeys(g.readers.get(y, [])):
        node = g.nodes[i]
        if _is_reader(g, i, y):
            readers.append(i)
        elif node.op_type == "Reshape" and node.domain in ("", "ai.onnx") and node.input[0] == y and node.output[0] not in g.outputs:
            after, shape = g.readers.get(node.output[0], []), g.const(node.input[1])
            keeps_last = shape is not None and shape.ndim == 1 and not (shape == 0).any() and shape[-1] > 0
            if after and keeps_last and all(_is_reader(g, j, node.output[0]) for j in after):
                reshapes.append(i)
                readers += list(dict.fromkeys(after))
    return readers, reshapes


def _refusal(g: _Graph, node: onnx.NodeProto, kind: str, fp8: list[int]) -> str | None:
    """Why the norm cannot take its fp8 readers' quantize pass, or None (the readers' own checks: `_readers_refusal`)."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    gamma = g.const(node.input[2 if kind == "skip" else 1])
    if gamma is None or gamma.ndim != 1:
        return "Gamma is not a constant vector"
    if kind == "ln" and attrs.get("axis", -1) != -1:
        rank = len(g.info[node.input[0]].type.tensor_type.shape.dim) if node.input[0] in g.info else None
        if rank is None or attrs["axis"] != rank - 1:
            return f"LayerNormalization over more than the last axis (axis={attrs['axis']})"
    if any(_used(g, o) for o in node.output[1:3]):
        return "its mean / inverse-std outputs are read"
    return None


def _readers_refusal(g: _Graph, fp8: list[int]) -> str | None:
    """Why one float8 output cannot feed the fp8 GEMMs `fp8` (whatever writes it), or None."""
    scales = [g.const(g.nodes[i].input[1]) for i in fp8]
    if any(s is None for s in scales):
        return "an XScale is not a constant"
    if len({float(np.asarray(s).reshape(-1)[0]) for s in scales if s is not None}) > 1:
        return "its fp8 GEMM readers use different XScale values"
    weights = [g.const(g.nodes[i].input[2]) for i in fp8]
    if any(w is None or w.ndim != 2 or w.shape[1] % 16 for w in weights):
        return "a reader's K is not a multiple of 16 (the CUDA GEMM reads a float8 X as it is, in rows of 16 bytes)"
    return None


def _fused(g: _Graph, model: onnx.ModelProto, node: onnx.NodeProto, kind: str, fp8: list[int], reshapes: list[int]) -> onnx.NodeProto:
    """The SkipLayerNormFp8 node in the norm's place (zero Beta / Bias added as initializers where the norm had none); the
    readers (and the Reshapes between) re-pointed at YQ."""
    ins = list(node.input)
    x, skip = ins[0], (ins[1] if kind == "skip" else None)
    gamma = ins[2] if kind == "skip" else ins[1]
    beta = ins[3] if kind == "skip" and len(ins) > 3 else (ins[2] if kind == "ln" and len(ins) > 2 else "")
    bias = ins[4] if kind == "skip" and len(ins) > 4 else ""
    gamma_value = g.const(gamma)
    assert gamma_value is not None  # _refusal checked it
    prefix = f"{node.name or node.output[0]}_fp8"

    def or_zeros(name: str, part: str) -> str:
        """`name`, or a zero vector like Gamma added where the norm had none."""
        if name:
            return name
        model.graph.initializer.append(numpy_helper.from_array(np.zeros_like(gamma_value), f"{prefix}_{part}"))
        return f"{prefix}_{part}"

    beta, bias = or_zeros(beta, "beta"), or_zeros(bias, "bias")
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    epsilon = float(attrs.get("epsilon", _SKIP_EPSILON if kind == "skip" else _LN_EPSILON))
    taken = set(fp8) | set(reshapes)
    others = [i for i in g.readers.get(node.output[0], []) if i not in taken]  # the residual, a graph output: Y stays for them
    y = node.output[0] if others or node.output[0] in g.outputs else ""
    total = node.output[3] if kind == "skip" and len(node.output) > 3 and _used(g, node.output[3]) else ""
    yq = f"{prefix}_yq"
    for i in fp8:
        g.nodes[i].input[0] = yq
    inputs = [x, gamma, beta, bias, g.nodes[fp8[0]].input[1]] + ([skip] if skip else [])
    return helper.make_node(skip_layer_norm_fp8.SPEC.name, inputs, [y, yq, total], name=prefix, domain=DEPLOYFUSE, epsilon=epsilon)


def _reshaped_outputs(g: _Graph, model: onnx.ModelProto, reshape: onnx.NodeProto, readers: list[int]) -> dict[int, onnx.NodeProto]:
    """For the readers of a Reshape that now read YQ [..., K] instead (ONNX Runtime has no float8 Reshape kernel): the
    Reshape of each one's Y to the shape it had, the Reshape's shape with N for K (an Fp8GemmAct keeps X's leading dims)."""
    shape = g.const(reshape.input[1])
    assert shape is not None  # _fp8_uses checked it
    out = {}
    for i in readers:
        node = g.nodes[i]
        if node.input[0] != reshape.output[0]:
            continue
        w = g.const(node.input[6 if node.op_type == fp8_mlp.SPEC.name else 2])
        assert w is not None  # _refusal checked the readers' weights
        target = numpy_helper.from_array(np.concatenate([shape[:-1], [w.shape[0]]]).astype(np.int64), f"{node.name}_fp8_shape")
        model.graph.initializer.append(target)
        flat = node.output[0]
        node.output[0] = f"{flat}_fp8"
        out[i] = helper.make_node("Reshape", [node.output[0], target.name], [flat], name=f"{node.name}_fp8_reshape")
    return out


def fuse(model: onnx.ModelProto, target: str | Target) -> tuple[onnx.ModelProto, int, list[str]]:
    """`model` with each norm whose output feeds Fp8GemmAct / Fp8Mlp X inputs replaced by a SkipLayerNormFp8 feeding them
    its float8 YQ (in place, main graph); how many; and why each refused norm was refused ("<node>: <reason>"). A target
    without the `fp8_norm` lowering (every one but ort-cuda) gets the model unchanged."""
    if not get_target(target).lowering(FAMILY):
        return model, 0, []
    return quantizing_producers(
        model, lambda node: _norm_kind(node) is not None, lambda g, node, fp8, reshapes: _fused(g, model, node, _norm_kind(node) or "", fp8, reshapes),
        refusal=lambda g, node, fp8: _refusal(g, node, _norm_kind(node) or "", fp8),
    )


def quantizing_producers(
    model: onnx.ModelProto,
    takes: Callable[[onnx.NodeProto], bool],
    rewritten: Callable[[_Graph, onnx.NodeProto, list[int], list[int]], onnx.NodeProto],
    refusal: Callable[[_Graph, onnx.NodeProto, list[int]], str | None] | None = None,
) -> tuple[onnx.ModelProto, int, list[str]]:
    """What this rule and `rules.fp8_attention_out` share: each node that `takes` whose first output feeds fp8 GEMM X
    inputs (directly, or through a Reshape only they read, which moves past them), refused neither by those readers
    (`_readers_refusal`: one XScale, K a multiple of 16) nor by the producer's own `refusal`, becomes
    `rewritten(g, node, readers, reshapes)`, which re-points the readers at its float8 output (in place, main graph); how
    many; why each refused one was refused ("<node>: <reason>")."""
    g = _Graph(model.graph)
    replaced: dict[int, onnx.NodeProto] = {}
    refused: list[str] = []
    after: dict[int, onnx.NodeProto] = {}  # node index -> the Reshape of its output that follows it
    gone: set[int] = set()  # the Reshapes between a producer and its readers
    for index, node in enumerate(g.nodes):
        if not takes(node):
            continue
        fp8, reshapes = _fp8_uses(g, node.output[0])
        if not fp8:
            continue
        why = _readers_refusal(g, fp8) or (refusal(g, node, fp8) if refusal else None)
        if why is not None:
            refused.append(f"{node.name or node.output[0]}: {why}")
            continue
        for r in reshapes:
            after.update(_reshaped_outputs(g, model, g.nodes[r], fp8))
        replaced[index] = rewritten(g, node, fp8, reshapes)
        gone |= set(reshapes)
    if replaced:
        dropped = {g.nodes[i].output[0] for i in gone} | {o for i, n in replaced.items() for o in g.nodes[i].output if o and o not in n.output}
        nodes = [m for i, n in enumerate(g.nodes) if i not in gone for m in (replaced.get(i, n), *([after[i]] if i in after else []))]
        info = [v for v in model.graph.value_info if v.name not in dropped]
        for field, values in ((model.graph.node, nodes), (model.graph.value_info, info)):
            del field[:]
            field.extend(values)  # copies each message
    return model, len(replaced), refused


def without_fp8_x(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` in which the GEMMs read each SkipLayerNormFp8's Y again (their own quantize pass) and no YQ is
    written: the same norms and GEMMs, the quantization where it was before the rule (`autotune`'s other side), with its
    function bodies (runs as it is)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for norm in (n for n in out.graph.node if n.domain == DEPLOYFUSE and n.op_type == skip_layer_norm_fp8.SPEC.name):
        yq, y = norm.output[1], norm.output[0] or f"{norm.name}_y"
        norm.output[0], norm.output[1] = y, ""
        for node in out.graph.node:
            node.input[:] = [y if name == yq else name for name in node.input]
    attach_functions(out)
    return out


def autotune(model: onnx.ModelProto, feed: Mapping[str, np.ndarray], library: str | os.PathLike[str] | None) -> tuple[onnx.ModelProto, str]:
    """Keep the family only if it does not make the model slower on ort-cuda (`rewrite.autotune.time_family`, the fused and
    the `without_fp8_x` model timed on this machine's CUDA EP with the custom-op library): (the model to ship, one line; "" when
    the model has no SkipLayerNormFp8, as an int8 or a tensorrt one)."""
    if not any(n.domain == DEPLOYFUSE and n.op_type == skip_layer_norm_fp8.SPEC.name for n in model.graph.node):
        return model, ""
    return _timed_against(model, without_fp8_x(model), FAMILY, feed, library)


def _timed_against(
    model: onnx.ModelProto, before: onnx.ModelProto, family: str, feed: Mapping[str, np.ndarray], library: str | os.PathLike[str] | None
) -> tuple[onnx.ModelProto, str]:
    """`model`, or `before` (the model without `family`) where `model` is slower on ort-cuda, and the decision in one line."""
    from deployfuse.rewrite.autotune import time_family

    decision = time_family(before, model, "ort-cuda", feed, custom_ops_library=library)
    return (model, f"{family} kept: {decision.reason}") if decision.keep else (before, f"{family} reverted: {decision.reason}")
