"""FP8 GEMM: a float8 Q/DQ'd GEMM [+ bias] [+ activation] -> deployfuse.Fp8GemmAct (ort-cuda).

    act(DQ(Q(x, sx)) · DQ(Wq, sw) + b)   ->   Fp8GemmAct(x, sx, Wqᵀ, sw, b, activation)

Q/DQ are float8 e4m3 QuantizeLinear / DequantizeLinear with one scale per tensor and zero points
0, as `quantize.qdq.place_qdq` writes them on ort-cuda; Wq is the float8 weight [K, N] (stored
transposed, [N, K], for cuBLASLt's "TN" layout, once for all the GEMMs sharing it; a Gemm with
transB=1 has it so already). The GEMM comes as MatMul [+ Add] or as Gemm (GPT-2's Conv1D: on
[B·S, K], possibly viewed back to [B, S, N] before the activation, which then moves ahead of the
Reshape). ONNX Runtime's CUDA EP
runs the Q/DQ form as a dequantization and an fp16 MatMul; the fused node quantizes x and runs one
cuBLASLt fp8 GEMM with the bias (and ReLU / GELU) in its epilogue. cuBLASLt's GELU is the tanh form,
and exact-erf GELU (Gelu-20 approximate="none", com.microsoft Gelu) is computed in it too:

    max |gelu_erf(y) - gelu_tanh(y)| = 4.7e-4 (at y = 2.70, 1.8e-4 of the value)

which is below fp16's half step there (9.8e-4) and far below float8's (e4m3 keeps 3 mantissa bits:
steps of 1/16 to 1/8 of the value), the rounding the next GEMM applies to its input; the accuracy gate
judges the artefact with it. It takes a separate GELU kernel out of every layer: one fp16 read and
write of [tokens, 4·D], 12 of them in BERT-base (ONNX Runtime's took 10.8 us each at batch 8 on an
H200, bench/results/h200.profile.json; the fused form ran in bench/results/h200_quant.md section 3).
A GEMM without a bias, or with a bias of zeros (a model fresh from its config; adding it changes no value), gets an
empty one ([0]: none), so every Q/DQ'd GEMM becomes an Fp8GemmAct and cuBLASLt's epilogue adds nothing (an epilogue
adding zeros costs its fp8 kernels 9-15 % at BERT-base's shapes for 1024 tokens on an H100, h200_quant.md section 13).
The scales (the graph's float type in an fp16 graph) become float32 initializers, as the op takes them.

Not a fusion family of `rewrite.fuse`: its guard compares a rewrite with the graph before it
element by element, and in a quantized graph any change upstream of a quantizer moves some
activations to the next float8 value, differences that add up over layers (BERT-base fp16: every
family, this one included, 2.2-2.4x over the guard's fp16 tolerance on its Q/DQ graph). So the
fusions run first, on the float graph (less the families that would take the GEMMs out of reach,
`quantize.lowering.FP8_SKIPPED_FAMILIES`), the Q/DQ go on the fused graph, and `lower` applies these
rules as the fp8 quantizer's last step, whose result the accuracy gate judges against PyTorch
fp32. The forms met there: MatMul + Add (Q|K|V packed by `split_qkv`, split for MultiHeadAttention;
an up-projection before its GELU), a bare MatMul whose bias SkipLayerNormalization took, Gemm +
Reshape [+ FastGelu] (GPT-2). The GEMMs the gate keeps in float become `rules.gemm_act`'s GemmAct
there too (`float_gemms`), which the fused graph could not hold before the Q/DQ went on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import onnxscript.optimizer
from onnxscript.rewriter import MatchResult, pattern

from deployfuse.rewrite.rules._common import FusionRule, either, gemm_trans_b, scalar, stored_once
from deployfuse.targets import MS, Target, get_target

FAMILY = "fp8_gemm"
GRAPH_TYPES = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
"""The float types the rule fuses in: cuBLASLt's fp8 GEMM writes fp16/bf16 with a bias of that type."""

_FP8 = ir.DataType.FLOAT8E4M3FN
Builder = Callable[[Any, Any], Any]
_ACTIVATIONS: dict[str, tuple[Builder, ...]] = {
    "relu": (lambda op, y: op.Relu(y),),
    "gelu_tanh": (  # Gelu-20 either way (tanh or erf), FastGelu, and com.microsoft's erf Gelu: all computed in tanh form
        lambda op, y: op.Gelu(y, _allow_other_attributes=True),  # approximate: "none" (erf) or "tanh"
        lambda op, y: op.FastGelu(y, _domain=MS),
        lambda op, y: op.Gelu(y, _domain=MS),
    ),
}


def _const(value: ir.Value | None) -> np.ndarray | None:
    tensor = None if value is None else ir.convenience.get_const_tensor(value)
    return None if tensor is None else np.asarray(tensor.numpy())


def _fp8_zero(value: ir.Value | None) -> bool:
    """True when `value` is a one-element float8 e4m3 constant 0 (a zero point)."""
    return value is not None and value.dtype == _FP8 and scalar(value) == 0.0


def _scale(value: ir.Value | None) -> float | None:
    """A one-element, positive, finite constant scale as a float, else None."""
    scale = scalar(value)
    return scale if scale is not None and np.isfinite(scale) and scale > 0 else None


def _transposed(op, w_q: ir.Value, weight: np.ndarray, fallback: str) -> ir.Value:
    """Wqᵀ [N, K] as an initializer named after Wq, stored once for all the GEMMs sharing Wq (`stored_once`)."""
    return stored_once(op, w_q.graph, np.ascontiguousarray(weight.T), f"{w_q.name}_t", fallback)


class Fp8Gemm(FusionRule):
    """act(MatMul(DQ(Q(x)), DQ(Wq)) [+ b]) or act([Reshape](Gemm(DQ(Q(x)), DQ(Wq) [, b]))) -> Fp8GemmAct."""

    def __init__(self, target: str | Target, gemm: bool, reshape: bool, bias: bool, activation: str, build: Builder | None, swap: bool = False) -> None:
        name = "fp8_gemm" + ("" if activation == "none" else f"_{activation}") + ("" if bias else "_unbiased")
        super().__init__(name, target)
        self.gemm, self.reshape, self.bias, self.activation, self.build, self.swap = gemm, reshape, bias, activation, build, swap

    def pattern(self, op, x, x_scale, x_zero, dq_scale, dq_zero, w_q, w_scale, w_zero, bias, shape):
        x_dq = op.DequantizeLinear(op.QuantizeLinear(x, x_scale, x_zero, _outputs=["x_q"]), dq_scale, dq_zero, _outputs=["x_dq"])
        w_dq = op.DequantizeLinear(w_q, w_scale, w_zero, _outputs=["w_dq"])
        if self.gemm:
            y = op.Gemm(x_dq, w_dq, bias, _outputs=["linear"]) if self.bias else op.Gemm(x_dq, w_dq, _outputs=["linear"])
            if self.reshape:
                y = op.Reshape(y, shape, _allow_other_attributes=True, _outputs=["reshaped"])
        else:
            y = op.MatMul(x_dq, w_dq, _outputs=["linear"])
            if self.bias and self.build is None:  # a pattern cannot end in a choice: one rule per operand order
                y = op.Add(bias, y) if self.swap else op.Add(y, bias)
            elif self.bias:
                y = either(op.Add, y, bias)
        return y if self.build is None else self.build(op, y)

    def check(self, context, x, x_scale, x_zero, dq_scale, dq_zero, w_q, w_scale, w_zero, linear, x_q, bias=None, reshaped=None, **_) -> MatchResult:
        fail = MatchResult().fail
        if x.dtype not in GRAPH_TYPES:
            return fail(f"x is {x.dtype}: the fp8 GEMM is emitted in fp16/bf16 graphs", x)
        quantize = x_q.producer()
        if quantize.attributes.get_int("saturate", 1) != 1 or quantize.attributes.get_int("block_size", 0) != 0:
            return fail("QuantizeLinear does not saturate, or quantizes blockwise", x_q)
        if not (_fp8_zero(x_zero) and _fp8_zero(dq_zero) and _fp8_zero(w_zero)):
            return fail("a zero point is not a float8 e4m3 zero", [x_zero, dq_zero, w_zero])
        sx, dq_sx, sw = _scale(x_scale), _scale(dq_scale), _scale(w_scale)
        if sx is None or sx != dq_sx:
            return fail("x's QuantizeLinear and DequantizeLinear do not share one positive scalar scale", [x_scale, dq_scale])
        if sw is None:
            return fail("the weight's scale is not one positive scalar (per-channel scales have no Fp8GemmAct form)", w_scale)
        weight = _const(w_q)
        if weight is None or w_q.dtype != _FP8 or weight.ndim != 2:
            return fail("the weight is not a float8 e4m3 constant matrix", w_q)
        k, n = weight.shape[::-1] if self._trans_b(linear) else weight.shape
        if self.gemm:
            attrs = linear.producer().attributes
            if attrs.get_int("transA", 0) or attrs.get_float("alpha", 1.0) != 1.0 or attrs.get_float("beta", 1.0) != 1.0:
                return fail("Gemm transposes A or scales (transA/alpha/beta)", linear)
        last = x.shape[-1] if x.shape is not None and len(x.shape) > 0 else None
        if isinstance(last, int) and last != k:  # a symbolic or unknown K (Swin's attention output, a computed Reshape) is the weight's: the GEMM reads it
            return fail("x is not [..., K] for the weight's K", x)
        if bias is not None:
            array = _const(bias)
            if array is None or bias.dtype != x.dtype or array.size != n or array.shape[-1] != n or array.ndim > 2:
                return fail("the bias is not a constant vector of the weight's N in x's dtype", bias)
        if reshaped is not None and (reshaped.shape is None or len(reshaped.shape) == 0 or reshaped.shape[-1] != n):
            return fail("the Reshape after the Gemm changes the last axis", reshaped)
        return self.choose(context, x, self.target.lowering(FAMILY))

    def _trans_b(self, linear: ir.Value) -> bool:
        return self.gemm and gemm_trans_b(linear)

    def rewrite(self, op, x, x_scale, w_q, w_scale, linear, bias=None, shape=None, reshaped=None, **_):
        trans_b, weight = self._trans_b(linear), _const(w_q)
        prefix = f"{linear.producer().name}_fp8"  # node names are unique: so are the new initializers'

        def initializer(array: np.ndarray, part: str) -> ir.Value:
            return op.initializer(ir.tensor(array), name=f"{prefix}_{part}")

        scales = [initializer(np.array(_scale(s), dtype=np.float32), f"{part}_scale") for s, part in ((x_scale, "x"), (w_scale, "w"))]
        w_t = w_q if trans_b else _transposed(op, w_q, weight, f"{prefix}_weight_t")  # [K, N] -> [N, K]
        n = weight.shape[0 if trans_b else 1]
        vector = None if bias is None else _const(bias)
        if vector is not None and not vector.any():  # zeros: none, no epilogue to add them
            vector = None
        if vector is None or vector.ndim != 1:  # none (an empty bias), or Gemm's C as a row [1, N]
            bias = initializer((np.zeros(0) if vector is None else vector.reshape(n)).astype(x.dtype.numpy()), "bias")
        y = self.emit(op, x, scales[0], w_t, scales[1], bias, activation=self.activation)
        if reshaped is not None:
            y = op.Reshape(y, shape, **{k: a.value for k, a in reshaped.producer().attributes.items()})
        return y


def rules(target: str | Target) -> list[pattern.RewriteRule]:
    """The fp8 GEMM rules for `target` (ort-cuda): activations first, then the bias alone, then
    GEMMs without a bias, so each form sees only what the ones before left."""
    target = get_target(target)
    if not target.lowering(FAMILY):
        return []
    forms = ((False, False), (True, False), (True, True))  # (gemm, reshape)
    out = []
    for bias in (True, False):
        for name in target.activations.get(FAMILY, ()):
            out += [Fp8Gemm.rule(target, gemm, reshape, bias, name, build) for build in _ACTIVATIONS[name] for gemm, reshape in forms]
        if bias:
            out += [Fp8Gemm.rule(target, False, False, True, "none", None, swap) for swap in (False, True)]
            out += [Fp8Gemm.rule(target, True, reshape, True, "none", None) for reshape in (False, True)]
        else:
            out += [Fp8Gemm.rule(target, gemm, reshape, False, "none", None) for gemm, reshape in forms]
    return out


def lower(model: onnx.ModelProto, target: str | Target) -> tuple[onnx.ModelProto, int]:
    """`model` with every float8 Q/DQ'd GEMM the rules take rewritten into Fp8GemmAct, then each
    FC1 -> FC2 pair of them merged into one Fp8Mlp (`rules.fp8_mlp`: the hidden activation kept in
    float8), each norm feeding them made to quantize their X (`rules.fp8_norm`) and the first one to do the
    embedding lookups (`rules.fp8_embed`), then each attention
    (`rules.fp8_attention_out`), then the float GEMMs left (those the gate keeps) made GemmAct
    (`float_gemms`), function bodies attached; and how many GEMMs were made float8 (an Fp8Mlp holds two). Not
    guarded (see the module's docstring): the caller judges the result. Rules apply one name at a
    time, in `rules` order, as `rewrite.fuse` applies them."""
    from deployfuse.ops import attach_functions
    from deployfuse.rewrite.rules import fp8_attention_out, fp8_embed, fp8_mlp, fp8_norm

    ir_model = ir.serde.deserialize_model(model)
    count = _apply(ir_model, rules(target))
    lowered = fp8_embed.fuse(fp8_norm.fuse(fp8_mlp.merge(ir.serde.serialize_model(ir_model))[0], target)[0], target)[0]
    lowered, kept = float_gemms(fp8_attention_out.fuse(lowered, target)[0], target)
    if count or kept:
        attach_functions(lowered)
    return lowered, count


def float_gemms(model: onnx.ModelProto, target: str | Target) -> tuple[onnx.ModelProto, int]:
    """`model` with the float GEMMs [+ bias] [+ activation] the fp8 rules left (the layers the gate keeps in
    fp16/bf16, and any GEMM `place_qdq` cannot quantize) rewritten into deployfuse.GemmAct by `rules.gemm_act`'s
    own rules, and how many. An fp8 export fuses without the `gemm_act` family (`quantize.lowering.FP8_SKIPPED_FAMILIES`:
    the Q/DQ must reach the GEMMs first), so without this a kept GEMM stays ONNX Runtime's Gemm or MatMul + Add,
    whose CUDA fp16 Gemm adds a bias by a separate broadcast pass over the output before the GEMM (H200,
    GPT-2 fp8 at batch 64, its one kept 8192x768 projection: BroadcastBiasKernel 0.027 ms, the GEMM 0.017 ms,
    bench/results/h200_quant_session6.json); GemmAct adds it in cuBLASLt's epilogue. What `rules.gemm_act` leaves alone stays: a bias add feeding an exact-erf GELU
    (BERT's, ViT's) remains MatMul + Add + Gelu, which ONNX Runtime's optimizer makes a BiasGelu, and a bare
    MatMul (its bias in a SkipLayerNormalization) has no bias pass to save."""
    from deployfuse.rewrite.rules import gemm_act

    ir_model = ir.serde.deserialize_model(model)
    count = _apply(ir_model, gemm_act.rules(target))
    return (ir.serde.serialize_model(ir_model), count) if count else (model, 0)


def _apply(ir_model: ir.Model, rules: list[pattern.RewriteRule]) -> int:
    """Apply `rules` to `ir_model` one name at a time, in order, as `rewrite.fuse` does; the nodes left unused
    removed. How many matched."""
    groups: dict[str, list[pattern.RewriteRule]] = {}
    for rule in rules:
        groups.setdefault(rule.name or "", []).append(rule)
    count = sum(pattern.RewriteRuleSet(group).apply_to_model(ir_model) for group in groups.values())
    onnxscript.optimizer.remove_unused_nodes(ir_model)
    return count
