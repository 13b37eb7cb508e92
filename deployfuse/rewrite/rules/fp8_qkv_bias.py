"""FP8 QKV bias: the packed QKV GEMM's bias moves into the FusedMHA that reads its output (ort-cuda).

    FusedMHA(P, P, P, Mask?, YScale?, packed_qkv=1),  P = [Reshape](Fp8GemmAct(x, sx, W, sw, b))
      ->  FusedMHA(P, P, P, Mask?, YScale?, b),        P = [Reshape](Fp8GemmAct(x, sx, W, sw, ∅))

A bias vector in the epilogue costs cuBLASLt's fp8 kernels time even where they are otherwise bound by the math: BERT-base's
QKV GEMM took 6.02 against 5.36 us at 1024 tokens and 31.9 against 25.7 us at 8192 on an H100 (bench/results/h200_quant.md
section 13). FusedMHA takes it nearly free: b_Q goes into Q as it lands in shared memory, b_V into Y in the epilogue, and b_K
is left out, since it adds the same q_i·b_K to every score of row i, which the softmax cancels (`ops.defs.fused_mha`). The
attention is the same; Q, K and V are rounded to T without the bias before b_Q and b_V are added, where the GEMM rounded once.

Exports apply it only with DEPLOYFUSE_FP8_QKV_BIAS=1 (`enabled`) until FusedMHA's CUDA kernels with a Bias have run their checks
on a GPU (bench/ops_gpu.py; the CPU kernel and function bodies are checked by tests/ops/test_fused_mha_bias.py).

Taken where the GEMM has no activation and a constant non-empty bias, and P feeds only that FusedMHA, directly or through
Reshapes that keep the last axis and feed only each other (GPT-2's Gemm). Applied by `fp8_gemm.lower` after
`fp8_attention_out`; `undo` puts the biases back (`autotune`'s other side, and the benchmark's ablation). Its family name is the
target's lowering key (ort-cuda only: TensorRT's FusedMHA plugin refuses the packed form and the Bias).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from deployfuse.ops.defs import fp8_gemm_act, fused_mha
from deployfuse.ops.functions import attach_functions
from deployfuse.rewrite.rules.fp8_mlp import _Graph
from deployfuse.rewrite.rules.fp8_norm import _timed_against
from deployfuse.targets import DEPLOYFUSE, Target, get_target

FAMILY = "fp8_qkv_bias"
ENV = "DEPLOYFUSE_FP8_QKV_BIAS"
_BIAS = fused_mha.SPEC.inputs.index("Bias")
_GEMM_BIAS = fp8_gemm_act.SPEC.inputs.index("Bias")
_EMPTY = "_bias_in_attention"  # the suffix of the empty bias the GEMM gets: `undo` knows the GEMMs by it


def _is(node: onnx.NodeProto | None, spec_name: str) -> bool:
    return node is not None and node.domain == DEPLOYFUSE and node.op_type == spec_name


def _width(g: _Graph, gemm: onnx.NodeProto | None) -> int | None:
    """N of an Fp8GemmAct (its W is [N, K]), where W is a constant."""
    if not _is(gemm, fp8_gemm_act.SPEC.name):
        return None
    assert gemm is not None
    weight = g.initializers.get(gemm.input[2])
    return int(weight.dims[0]) if weight is not None and len(weight.dims) == 2 else None


def _keeps_last_axis(g: _Graph, reshape: onnx.NodeProto, width: int | None) -> bool:
    """Whether the Reshape's output keeps the last axis `width` wide: a constant target shape ending in it, or shapes that
    inference recorded."""
    if width is None:
        return False
    shape = g.const(reshape.input[1])
    if shape is not None and shape.ndim == 1 and shape.size and int(shape[-1]) == width:
        return True
    return g.last_dim(reshape.input[0]) == width and g.last_dim(reshape.output[0]) == width


def _qkv_gemm(g: _Graph, index: int) -> tuple[onnx.NodeProto | None, str]:
    """The Fp8GemmAct whose output the packed FusedMHA g.nodes[index] reads (directly or through Reshapes: GPT-2's, and the
    one `fp8_norm` moved past it), or None and why."""
    node = g.nodes[index]
    packed = node.input[0]
    if not fused_mha.SPEC.node_attrs(node)["packed_qkv"] or list(node.input[:3]) != [packed] * 3:
        return None, "not one packed QKV tensor"
    if packed in g.outputs or set(g.readers.get(packed, [])) != {index}:
        return None, "the packed QKV has other readers"
    producer, reshapes = g.node_of(packed), []
    while producer is not None and producer.op_type == "Reshape" and producer.domain == "":
        reshapes.append(producer)
        value = producer.input[0]
        if value in g.outputs or g.readers.get(value) != [g.producer[producer.output[0]]]:
            return None, "the GEMM's output has other readers than the Reshapes to the attention"
        producer = g.node_of(value)
    if not _is(producer, fp8_gemm_act.SPEC.name):
        return None, "the packed QKV does not come from an Fp8GemmAct"
    assert producer is not None
    if fp8_gemm_act.SPEC.node_attrs(producer)["activation"] != "none":
        return None, "the GEMM applies an activation after its bias"
    if not all(_keeps_last_axis(g, r, _width(g, producer)) for r in reshapes):
        return None, "a Reshape may change the last axis"
    return producer, ""


def enabled() -> bool:
    """Whether `fuse` applies the rule: DEPLOYFUSE_FP8_QKV_BIAS=1 (off otherwise; see the module)."""
    return os.environ.get(ENV, "0") == "1"


def fuse(model: onnx.ModelProto, target: str | Target) -> tuple[onnx.ModelProto, int, list[str]]:
    """`model` with each packed QKV GEMM's bias moved into the FusedMHA reading it (in place, main graph); how many; why each
    FusedMHA with a QKV GEMM left as it was was refused ("<node>: <reason>"). A target without the `fp8_qkv_bias` lowering
    (every one but ort-cuda) gets the model unchanged, as every target does unless `enabled`."""
    if not get_target(target).lowering(FAMILY) or not enabled():
        return model, 0, []
    g = _Graph(model.graph)
    moved, refused = 0, []
    for index, node in enumerate(g.nodes):
        if not _is(node, fused_mha.SPEC.name) or (len(node.input) > _BIAS and node.input[_BIAS]):
            continue
        gemm, why = _qkv_gemm(g, index)
        if gemm is None:
            if why != "not one packed QKV tensor":
                refused.append(f"{node.name or node.output[0]}: {why}")
            continue
        bias = gemm.input[_GEMM_BIAS] if len(gemm.input) > _GEMM_BIAS else ""
        vector = g.const(bias) if bias else None
        if vector is None or vector.size == 0:
            continue  # no bias to move
        if vector.ndim != 1 or vector.shape[0] != _width(g, gemm):
            refused.append(f"{node.name or node.output[0]}: the bias is not one vector as wide as the packed QKV")
            continue
        empty = f"{gemm.name or gemm.output[0]}{_EMPTY}"
        model.graph.initializer.append(numpy_helper.from_array(np.zeros(0, dtype=vector.dtype), empty))
        gemm.input[_GEMM_BIAS] = empty
        node.input.extend([""] * (_BIAS + 1 - len(node.input)))
        node.input[_BIAS] = bias
        moved += 1
    return model, moved, refused


def undo(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` with each FusedMHA's Bias back in its QKV GEMM's epilogue: the same math, as before the rule, with
    the function body of each FusedMHA's new variant (runs as it is)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = _Graph(out.graph)
    emptied = set()
    for index, node in enumerate(g.nodes):
        if not _is(node, fused_mha.SPEC.name) or len(node.input) <= _BIAS or not node.input[_BIAS]:
            continue
        gemm, _ = _qkv_gemm(g, index)
        if gemm is None or not gemm.input[_GEMM_BIAS].endswith(_EMPTY):
            continue  # a Bias this rule did not move
        emptied.add(gemm.input[_GEMM_BIAS])
        gemm.input[_GEMM_BIAS] = node.input[_BIAS]
        del node.input[_BIAS:]
        while len(node.input) > 3 and not node.input[-1]:
            del node.input[-1]
    kept = [t for t in out.graph.initializer if t.name not in emptied]
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept)
    attach_functions(out)
    return out


def has_moved_bias(model: onnx.ModelProto) -> bool:
    """Whether some FusedMHA of `model` takes a Bias."""
    return any(_is(n, fused_mha.SPEC.name) and len(n.input) > _BIAS and n.input[_BIAS] for n in model.graph.node)


def autotune(model: onnx.ModelProto, feed: Mapping[str, np.ndarray], library: str | os.PathLike[str] | None) -> tuple[onnx.ModelProto, str]:
    """Keep the family only if it does not make the model slower on ort-cuda (`rewrite.autotune.time_family`, the model and
    its `undo` on this machine's CUDA EP with the custom-op library): (the model to ship, one line; "" when no bias moved)."""
    if not has_moved_bias(model):
        return model, ""
    return _timed_against(model, undo(model), FAMILY, feed, library)
