"""A ViT-style patchify Conv read as tokens -> one Reshape/Transpose of the image and a GEMM.

    Transpose(Reshape(Conv(X, W, b), [B, O, L]), perm=[0, 2, 1])           [B, L, O]
        = Reshape(Transpose(Reshape(X, [B, C, Hp, ph, Wp, pw]), [0, 2, 4, 1, 3, 5]), [B, L, K]) · W' + b

X is [B, C, H, W], W is [O, C, ph, pw], Hp = H/ph, Wp = W/pw, L = Hp·Wp, K = C·ph·pw and
W' = W.reshape(O, K)ᵀ. With kernel = stride and no padding the windows tile the image without
overlap: Conv(X)[b, o, i, j] = Σ_{c,u,v} W[o, c, u, v]·X[b, c, i·ph + u, j·pw + v] + b[o]. The
6-D Reshape names X[b, c, i·ph + u, j·pw + v] as X6[b, c, i, u, j, v]; the Transpose brings the
window's (c, u, v) after the patch's (i, j); the last Reshape makes row l = i·Wp + j (the
flatten's token order) and column k = c·ph·pw + u·pw + v (W.reshape(O, K)'s order), so one
[B·L, K]·[K, O] GEMM gives every patch's O outputs. The Reshapes write 0 for the batch (copied,
allowzero=0), so a dynamic batch keeps working.

Matched: the forms HF ViT / DeiT / BEiT / CLIP / SigLIP / Swin (`conv(x).flatten(2).transpose(1,
2)`) and torchvision's vit (reshape + permute) export: a Reshape to [B, O, L] (a constant shape,
a Concat of the Conv's own Shape[0:2] and [-1] as TorchScript writes it, or an output shape known
to be [*, O, L]), then Transpose(0, 2, 1), the Conv read by nothing else. (ONNX's Flatten is
always 2-D, so torch's flatten(2) never exports as one.)
Refused: padding, dilation, groups, stride != kernel, a non-constant weight or bias, a
non-2-D Conv, and an input whose H and W are not static multiples of the kernel (the 6-D
Reshape would be wrong or fail). A patchify Conv whose NCHW output other ops read (ConvNeXt's
stem) is left alone: the GEMM form would need a Reshape and a Transpose back to NCHW, and on ORT
CPU that form took twice the Conv's time (ConvNeXt-T's stem, 4x4/4, 3 -> 96 on 224², fp32, one
thread, CPU time: 0.42 -> 0.84 ms at batch 1, 4.9 -> 8.2 ms at batch 8).

Why: on an H200 (ORT CUDA EP, fp16) ViT-B/16's patch Conv (3 input channels, NCHW, which cuDNN
does poorly) takes 0.50 ms at batch 64 and 0.12 ms at batch 8, ~11 % of the fp16 and fp8 models;
as a GEMM it is [B·196, 768]·[768, 768] (~0.03 ms) after a ~0.01 ms transpose. It runs before
gemm_act and bias_act (`rules.__init__`), so the new MatMul + Add gets their epilogues, and an
fp8 export quantizes it (one more Fp8GemmAct). ort-cuda only: on ORT CPU, MLAS's Conv (itself an
im2col + GEMM) was as fast or faster (ViT-B/16's patch embedding, fp32, one thread, CPU time:
2.46 against 2.33 ms at batch 1, 20.6 against 23.4 ms at batch 8); TensorRT runs such
convolutions well itself.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult, pattern

from deployfuse.rewrite.rules._attention_shapes import constant
from deployfuse.rewrite.rules._common import FusionRule
from deployfuse.targets import Target, get_target

FAMILY = "patch_embed"

_FORMS = ("reshape", "shape_of")  # how the exporter wrote [B, O, Hp, Wp] -> [B, O, L]


def _ints(value: ir.Value | None) -> list[int] | None:
    array = constant(value)
    return None if array is None or array.ndim != 1 or not np.issubdtype(array.dtype, np.integer) else [int(v) for v in array]


class Patches(NamedTuple):
    """A patchify Conv's geometry: input [*, C, H, W], kernel = stride = (ph, pw), O outputs."""

    channels: int
    height: int
    width: int
    ph: int
    pw: int
    weight: np.ndarray  # [O, C, ph, pw]

    @property
    def tokens(self) -> int:
        return (self.height // self.ph) * (self.width // self.pw)


def patchify_conv(conv: ir.Node) -> Patches | str:
    """The geometry of `conv` when it is a patchify Conv (kernel = stride, no padding, dilation
    1, group 1, constant weight and bias, static H and W multiples of the kernel), else why not."""
    x, w = conv.inputs[0], conv.inputs[1]
    weight = constant(w)
    if weight is None or weight.ndim != 4:
        return "the weight is not a constant [O, C, ph, pw] (not a 2-D Conv)"
    if len(conv.inputs) > 2 and conv.inputs[2] is not None and constant(conv.inputs[2]) is None:
        return "the bias is not a constant"
    attrs = conv.attributes
    kernel = list(weight.shape[2:])
    if list(attrs.get_ints("kernel_shape", kernel) or kernel) != kernel:
        return "kernel_shape disagrees with the weight"
    if list(attrs.get_ints("strides", [1, 1]) or [1, 1]) != kernel:
        return f"strides {list(attrs.get_ints('strides', [1, 1]) or [])} != kernel {kernel}"
    if any(attrs.get_ints("pads", [0] * 4) or []) or attrs.get_string("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        return "the Conv pads its input"
    if any(d != 1 for d in attrs.get_ints("dilations", [1, 1]) or []):
        return "the Conv is dilated"
    if attrs.get_int("group", 1) != 1:
        return "the Conv is grouped"
    shape = x.shape
    if shape is None or len(shape) != 4:
        return "the input is not known to be [B, C, H, W]"
    c, h, wd = shape[1], shape[2], shape[3]
    if not (isinstance(h, int) and isinstance(wd, int)) or h % kernel[0] or wd % kernel[1]:
        return f"H, W ({h}, {wd}) are not static multiples of the kernel {kernel}"
    if isinstance(c, int) and c != weight.shape[1]:
        return "the input's channels disagree with the weight"
    return Patches(int(weight.shape[1]), h, wd, kernel[0], kernel[1], weight)


def _to_tokens_refusal(form: str, flat: ir.Node, patches: Patches) -> str | None:
    """None when the Reshape `flat` makes the Conv's [B, O, Hp, Wp] into [B, O, L], else why not."""
    outputs, tokens = int(patches.weight.shape[0]), patches.tokens
    allowzero = flat.attributes.get_int("allowzero", 0)
    if form == "shape_of":  # Reshape(conv, Concat(Slice(Shape(conv), [0], [2]), tail)), as TorchScript writes it
        concat = flat.inputs[1].producer() if flat.inputs[1] is not None else None
        dims = concat.inputs[0].producer() if concat is not None and concat.inputs[0] is not None else None
        assert concat is not None and dims is not None  # the pattern matched them
        whole = dims.inputs[0].producer() if dims.inputs[0] is not None else None
        if whole is None or whole.attributes.get_int("start", 0) != 0 or "end" in whole.attributes:
            return "the Shape is not the Conv's whole shape"
        axes_steps = [_ints(v) for v in dims.inputs[3:]]
        if _ints(dims.inputs[1]) != [0] or _ints(dims.inputs[2]) != [2] or axes_steps not in ([], [[0]], [[0], [1]]):
            return "the Slice does not take the Conv's [B, O]"
        if concat.attributes.get_int("axis", 0) != 0 or _ints(concat.inputs[1]) not in ([-1], [tokens]):
            return "the shape's last axis is not L"
        return None
    shape = _ints(flat.inputs[1])
    if shape is not None and len(shape) == 3:
        conv_dims: list[int | str] = ["B", outputs, patches.height // patches.ph, patches.width // patches.pw]
        dims = [conv_dims[i] if d == 0 and not allowzero else d for i, d in enumerate(shape)]
        # a rank-3 Reshape keeps the element count: O in the middle and B first or L last fixes the third
        if dims[1] == outputs and (dims[0] == "B" or dims[2] == tokens) and dims.count(-1) <= 1:
            return None
    out = flat.outputs[0].shape
    if out is not None and len(out) == 3 and out[1] == outputs and out[2] == tokens:
        return None
    return f"the Reshape is not known to give [B, O, L] (shape {shape}, output {out})"


class PatchEmbed(FusionRule):
    """Transpose(to_tokens(Conv(X, W, b)), [0, 2, 1]) -> Reshape/Transpose(X) · W' + b."""

    def __init__(self, target: str | Target, form: str) -> None:
        super().__init__(FAMILY, target)
        self.form = form
        self._patches: Patches | None = None

    def pattern(self, op, x, w, shape, starts, ends, tail):
        conv = op.Conv(x, w, _allow_other_inputs=True, _allow_other_attributes=True, _outputs=["conv"])  # bias optional
        if self.form == "shape_of":
            shape = op.Concat(op.Slice(op.Shape(conv, _allow_other_attributes=True), starts, ends, _allow_other_inputs=True), tail, _allow_other_attributes=True)
        flat = op.Reshape(conv, shape, _allow_other_attributes=True, _outputs=["flat"])
        return op.Transpose(flat, _allow_other_attributes=True, _outputs=["tokens"])

    def check(self, context, x, conv, flat, tokens, **_) -> MatchResult:
        fail = MatchResult().fail
        if list(tokens.producer().attributes.get_ints("perm", []) or []) != [0, 2, 1]:
            return fail("the Transpose is not (0, 2, 1)", tokens)
        patches = patchify_conv(conv.producer())
        if isinstance(patches, str):
            return fail(patches, conv)
        refusal = _to_tokens_refusal(self.form, flat.producer(), patches)
        if refusal is not None:
            return fail(refusal, flat)
        self._patches = patches
        return self.choose(context, x, self.target.lowering(FAMILY))

    def rewrite(self, op, x, conv, **_):
        p = self._patches
        assert p is not None and x.shape is not None
        node = conv.producer()
        name = node.inputs[1].name
        outputs, depth, batch = p.weight.shape[0], p.channels * p.ph * p.pw, x.shape[0]

        def ints(values: list[int], part: str) -> ir.Value:
            return op.initializer(ir.tensor(np.array(values, np.int64)), name=f"{name}_{FAMILY}_{part}")

        def typed(value: ir.Value, *dims: int) -> ir.Value:  # later rules (fp8_gemm) read the dtype and K of what this writes
            value.dtype, value.shape = x.dtype, ir.Shape([batch, *dims])
            return value

        windows = typed(op.Reshape(x, ints([0, p.channels, p.height // p.ph, p.ph, p.width // p.pw, p.pw], "windows")),
                        p.channels, p.height // p.ph, p.ph, p.width // p.pw, p.pw)
        moved = typed(op.Transpose(windows, perm=[0, 2, 4, 1, 3, 5]), p.height // p.ph, p.width // p.pw, p.channels, p.ph, p.pw)
        rows = typed(op.Reshape(moved, ints([0, p.tokens, depth], "rows")), p.tokens, depth)
        weight = op.initializer(ir.tensor(np.ascontiguousarray(p.weight.reshape(outputs, depth).T)), name=f"{name}_{FAMILY}_weight")
        y = typed(self.emit(op, rows, weight), p.tokens, outputs)
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        return y if bias is None else typed(op.Add(y, bias), p.tokens, outputs)


def rules(target: str | Target) -> list[pattern.RewriteRule]:
    """The patch-embedding rules where the target lowers them (ort-cuda); none elsewhere."""
    if not get_target(target).lowering(FAMILY):
        return []
    return [PatchEmbed.rule(target, form) for form in _FORMS]
