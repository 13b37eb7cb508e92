"""FP8 attention output: a FusedMHA feeding fp8 GEMMs writes their float8 X itself (ort-cuda).

    Fp8GemmAct(FusedMHA(q, k, v, mask).Y, sx, ...)  ->  Fp8GemmAct(FusedMHA(q, k, v, mask, YScale=sx).YQ, sx, ...)

In an fp8 export each attention's output projection is an Fp8GemmAct whose X is FusedMHA's Y, so the GEMM runs its own
quantize pass (a kernel and an fp16 read of [tokens, hidden]). On an H200 at BERT-base batch 64 the 12 passes take
0.056 ms of 2.33 ms GPU time plus 12 launches, and the 8192x768x768 fp8 GEMM without its pass beats fp16 where with it
it does not (0.0161 ms with the pass, ~0.0125 without, fp16 0.0169). Here FusedMHA's epilogue writes the float8 copy
while the row is in registers, as SkipLayerNormFp8 does for the norms (`rules.fp8_norm`):

    YQ = q(Y, YScale) = saturate_e4m3(round_nearest_even(Y_T / YScale)),  YScale = the readers' XScale

with Y_T the attention output as rounded to the graph's type T, which is what the GEMM's own pass quantized: the same
float8 values reach the GEMM. Y stays where anything else reads it (or it is a graph output) and is dropped otherwise.

Refused, with the reason in the returned list: readers with different or non-constant XScale values (one YQ has one
scale), a reader whose K is not a multiple of 16 (the CUDA GEMM reads a float8 X as it is, in rows of 16 bytes). A Reshape
between FusedMHA and GEMMs that alone read it (GPT-2's Conv1D) moves past them, as in `rules.fp8_norm`. Applied by
`fp8_gemm.lower` right after `fp8_norm`; its family name, `fp8_attention_out`, is the target's lowering key (ort-cuda
only: TensorRT's plugin has no YQ).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np
import onnx

from deployfuse.ops.defs import fused_mha
from deployfuse.ops.functions import attach_functions
from deployfuse.rewrite.rules.fp8_mlp import _Graph
from deployfuse.rewrite.rules.fp8_norm import _timed_against, quantizing_producers
from deployfuse.targets import DEPLOYFUSE, Target, get_target

FAMILY = "fp8_attention_out"
_MASK, _Y_SCALE = (fused_mha.SPEC.inputs.index(name) for name in ("Mask", "YScale"))


def _is_attention(node: onnx.NodeProto) -> bool:
    """A FusedMHA not yet writing YQ."""
    return node.domain == DEPLOYFUSE and node.op_type == fused_mha.SPEC.name and not (len(node.input) > _Y_SCALE and node.input[_Y_SCALE])


def _writing_yq(g: _Graph, node: onnx.NodeProto, fp8: list[int], reshapes: list[int]) -> onnx.NodeProto:
    """The FusedMHA node given YScale and writing YQ (Y kept only for readers other than `fp8` and `reshapes`); the readers
    re-pointed at YQ."""
    taken = set(fp8) | set(reshapes)
    y = node.output[0]
    keep_y = y in g.outputs or any(i not in taken for i in g.readers.get(y, []))
    yq = f"{node.name or y}_yq"
    for i in fp8:
        g.nodes[i].input[0] = yq
    out = onnx.NodeProto()
    out.CopyFrom(node)
    inputs = list(node.input) + [""] * (_Y_SCALE + 1 - len(node.input))  # "" for an absent Mask
    inputs[_Y_SCALE] = g.nodes[fp8[0]].input[1]
    out.input[:] = inputs
    out.output[:] = [y if keep_y else "", yq]
    return out


def fuse(model: onnx.ModelProto, target: str | Target) -> tuple[onnx.ModelProto, int, list[str]]:
    """`model` with each FusedMHA whose Y feeds Fp8GemmAct / Fp8Mlp X inputs writing their float8 YQ (in place, main graph);
    how many; and why each refused one was refused ("<node>: <reason>"). A target without the `fp8_attention_out` lowering
    (every one but ort-cuda) gets the model unchanged."""
    if not get_target(target).lowering(FAMILY):
        return model, 0, []
    return quantizing_producers(model, _is_attention, _writing_yq)


def without_fp8_x(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` in which the GEMMs read each FusedMHA's Y again (their own quantize pass) and no YQ is written: the
    same attention and GEMMs, the quantization where it was before the rule (`autotune`'s other side), with the function
    body of each FusedMHA's new variant (runs as it is)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for node in out.graph.node:
        if node.domain != DEPLOYFUSE or node.op_type != fused_mha.SPEC.name or len(node.output) < 2 or not node.output[1]:
            continue
        yq, y = node.output[1], node.output[0] or f"{node.name}_y"
        node.output[:] = [y]
        del node.input[_Y_SCALE:]
        while len(node.input) > _MASK and not node.input[-1]:
            del node.input[-1]
        for reader in out.graph.node:
            reader.input[:] = [y if name == yq else name for name in reader.input]
    attach_functions(out)
    return out


def autotune(model: onnx.ModelProto, feed: Mapping[str, np.ndarray], library: str | os.PathLike[str] | None) -> tuple[onnx.ModelProto, str]:
    """Keep the family only if it does not make the model slower on ort-cuda (`rewrite.autotune.time_family`, the fused and
    the `without_fp8_x` model on this machine's CUDA EP with the custom-op library): (the model to ship, one line; "" when no
    FusedMHA writes YQ)."""
    if not any(n.domain == DEPLOYFUSE and n.op_type == fused_mha.SPEC.name and len(n.output) > 1 and n.output[1] for n in model.graph.node):
        return model, ""
    return _timed_against(model, without_fp8_x(model), FAMILY, feed, library)
