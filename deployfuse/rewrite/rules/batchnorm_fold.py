"""Inference BatchNormalization folded into the layer before it, in the exported graph.

    BN(z) = z·s + t,   s = γ / √(var + ε),   t = β − mean·s        (per channel c, axis 1 of z)

    Conv / ConvTranspose:  W'[out c] = W[out c]·s[c],   b' = b·s + t
    Gemm (Y = α·A·B + β·C): B'[:, c] = B[:, c]·s[c] (B[c, :] with transB),   C' = C·s + t/β (C' = t, β = 1 without C)
    MatMul (+ Add b):       W'[:, c] = W[:, c]·s[c],   b' = b·s + t    (2-D output: BN1d's axis 1 is the feature axis)

The fold in PyTorch (`deployfuse.fold`) cannot reach every form: `torch.jit.freeze` folds only
Conv + BN, so a TorchScript model keeps ConvTranspose + BN and Linear + BN1d. This family folds
whatever any exporter left, exactly (float64 math, cast back to the weights' dtype).

A Reshape / Flatten between the layer and the BN is allowed where the math is still one scale
and shift per output channel of the layer: with static shapes (past the batch axis), the BN's
per-element scale, reshaped back to the layer's output, must be constant along every axis but
the layer's channel axis (e.g. Linear [N, C·L] → Reshape [N, C, L] → BN1d(C)). The BN must be in
inference mode with one output, the layer's (and the reshape's) output must feed only the BN,
and every weight and statistic must be a constant; else the rule declines and says why.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult, pattern

from deployfuse.rewrite.rules._attention_shapes import constant
from deployfuse.rewrite.rules._common import is_op

FAMILY = "batchnorm_fold"

_LAYERS = ("Conv", "ConvTranspose", "Gemm", "MatMul")


def _only_use(value: ir.Value) -> bool:
    return len(value.uses()) == 1 and not value.is_graph_output()


def _static_tail(value: ir.Value) -> tuple[int, ...] | None:
    """The shape of `value` past its first (batch) axis when every entry is a known integer."""
    if value.shape is None or len(value.shape) < 2 or not all(isinstance(d, int) for d in value.shape[1:]):
        return None
    return tuple(value.shape[1:])


class _Layer:
    """The layer feeding the BN (its output's channels on axis 1) and an optional bias Add."""

    def __init__(self, node: ir.Node, add: ir.Node | None = None) -> None:
        self.node, self.add = node, add

    @property
    def output(self) -> ir.Value:
        return (self.add or self.node).outputs[0]


def _layer(value: ir.Value) -> _Layer | str:
    """The layer whose output is `value` (Conv, ConvTranspose, Gemm, MatMul [+ Add b]); else why not."""
    node = value.producer()
    add = None
    if is_op(node, "Add"):
        for side in (0, 1):
            inner = node.inputs[side].producer()
            if is_op(inner, "MatMul") and constant(node.inputs[1 - side]) is not None and _only_use(node.inputs[side]):
                add, node = node, inner
                break
        else:
            return "the BN input is an Add that is not MatMul + constant bias"
    if not is_op(node, *_LAYERS):
        return "the BN input is not a Conv, ConvTranspose, Gemm or MatMul output (through a Reshape / Flatten)"
    if node.op_type in ("Conv", "ConvTranspose"):
        return _Layer(node)
    out = node.outputs[0]
    if out.shape is None or len(out.shape) != 2:
        return "the Gemm / MatMul output is not 2-D (BN normalises axis 1, which is then not the feature axis)"
    return _Layer(node, add)


def _channel_scale(bn_scale: np.ndarray, z: ir.Value, y: ir.Value) -> np.ndarray | str:
    """The per-channel factor on the layer output `y` (axis 1) that a per-channel factor on z
    (axis 1) becomes through the reshape y → z; else why there is none."""
    if z is y:
        return bn_scale
    z_tail, y_tail = _static_tail(z), _static_tail(y)
    if z_tail is None or y_tail is None or int(np.prod(z_tail)) != int(np.prod(y_tail)):
        return "the reshape between the layer and the BN is not static past the batch axis"
    if z_tail[0] != bn_scale.size:
        return "the BN's channels are not axis 1 of its input"
    field = np.broadcast_to(bn_scale.reshape((-1,) + (1,) * (len(z_tail) - 1)), z_tail).reshape(y_tail)
    field = field.reshape(y_tail[0], -1)
    if not (field == field[:, :1]).all():
        return "through the reshape, the BN's scale is not one value per channel of the layer"
    return field[:, 0]


class FoldBatchNorm(pattern.RewriteRuleClassBase):
    """BatchNormalization(layer(x) [→ Reshape / Flatten]) → layer'(x) [→ Reshape / Flatten]."""

    def __init__(self) -> None:
        super().__init__(name="batchnorm_fold")

    def pattern(self, op, z, gamma, beta, mean, var):
        return op.BatchNormalization(z, gamma, beta, mean, var, _allow_other_attributes=True, _outputs=["normed"])

    def check(self, context, z, gamma, beta, mean, var, normed, **_) -> MatchResult:
        fail = MatchResult().fail
        node = normed.producer()
        if node.attributes.get_int("training_mode", 0) != 0 or any(o.uses() or o.is_graph_output() for o in node.outputs[1:]):
            return fail("the BatchNormalization is in training mode", normed)
        stats = [constant(v) for v in (gamma, beta, mean, var)]
        if any(s is None for s in stats):
            return fail("the BN's scale, bias, mean or variance is not a constant", normed)
        reshape = z.producer() if is_op(z.producer(), "Reshape", "Flatten") else None
        y = reshape.inputs[0] if reshape is not None else z
        if reshape is not None and not _only_use(y):
            return fail("the layer output before the reshape feeds something else", y)
        layer = _layer(y)
        if isinstance(layer, str):
            return fail(layer, z)
        if not _only_use(layer.node.outputs[0]) or not _only_use(z):
            return fail("the layer's output feeds something else (folding would change the other use)", z)
        if constant(layer.node.inputs[1]) is None or (len(layer.node.inputs) > 2 and layer.node.inputs[2] is not None and constant(layer.node.inputs[2]) is None):
            return fail("the layer's weight or bias is not a constant", layer.node.outputs[0])
        gamma64, beta64, mean64, var64 = (s.astype(np.float64).reshape(-1) for s in stats)
        scale = gamma64 / np.sqrt(var64 + node.attributes.get_float("epsilon", 1e-5))
        shift = beta64 - mean64 * scale
        channel_scale = _channel_scale(scale, z, y)
        channel_shift = _channel_scale(shift, z, y)
        if isinstance(channel_scale, str) or isinstance(channel_shift, str):
            return fail(channel_scale if isinstance(channel_scale, str) else channel_shift, z)
        folded = _fold(layer, channel_scale, channel_shift)
        if isinstance(folded, str):
            return fail(folded, layer.node.outputs[0])
        self._plan = (layer, folded, reshape)
        return MatchResult()

    def rewrite(self, op, normed, **_):
        layer, (weight, bias, attrs), reshape = self._plan
        node = layer.node
        name = node.outputs[0].name or "layer"
        w = op.initializer(ir.tensor(weight), name=f"{name}_bn_folded_weight")
        b = op.initializer(ir.tensor(bias), name=f"{name}_bn_folded_bias")
        kept = {k: a.value for k, a in node.attributes.items()}
        kept.update(attrs)
        if node.op_type == "MatMul":
            out = op.Add(op.MatMul(node.inputs[0], w), b)
        else:
            out = getattr(op, node.op_type)(node.inputs[0], w, b, **kept)
        out.dtype, out.shape = layer.output.dtype, layer.output.shape
        if reshape is not None:
            attrs = {k: a.value for k, a in reshape.attributes.items()}
            out = getattr(op, reshape.op_type)(out, *reshape.inputs[1:], **attrs)
        return out


def _fold(layer: _Layer, scale: np.ndarray, shift: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict] | str:
    """The folded (weight, bias, changed attributes) of `layer`, in the weight's dtype."""
    node = layer.node
    weight = constant(node.inputs[1])
    dtype = weight.dtype
    w = weight.astype(np.float64)
    bias_value = node.inputs[2] if len(node.inputs) > 2 else None
    channels = scale.size
    attrs: dict = {}
    if node.op_type == "Conv":
        if w.shape[0] != channels:
            return "the Conv's output channels differ from the BN's"
        w = w * scale.reshape((-1,) + (1,) * (w.ndim - 1))
    elif node.op_type == "ConvTranspose":
        groups = node.attributes.get_int("group", 1)
        if w.shape[1] * groups != channels:
            return "the ConvTranspose's output channels differ from the BN's"
        grouped = w.reshape((groups, w.shape[0] // groups, w.shape[1]) + w.shape[2:])
        grouped = grouped * scale.reshape((groups, 1, w.shape[1]) + (1,) * (w.ndim - 2))
        w = grouped.reshape(w.shape)
    elif node.op_type == "Gemm":
        if node.attributes.get_int("transA", 0) not in (0, 1):
            return "unexpected Gemm attributes"
        trans_b = node.attributes.get_int("transB", 0)
        if w.ndim != 2 or w.shape[0 if trans_b else 1] != channels:
            return "the Gemm's output features differ from the BN's"
        w = w * (scale[:, None] if trans_b else scale[None, :])
        beta = node.attributes.get_float("beta", 1.0)
        if bias_value is None:
            attrs["beta"] = 1.0
            return w.astype(dtype), shift.astype(dtype), attrs
        if beta == 0.0:
            return "the Gemm's C has β = 0"
        c = constant(bias_value).astype(np.float64)
        return w.astype(dtype), (c * scale + shift / beta).astype(dtype), attrs
    else:  # MatMul [+ Add]
        if w.ndim != 2 or w.shape[1] != channels:
            return "the MatMul weight is not [K, features] with the BN's features"
        w = w * scale[None, :]
        if layer.add is not None:
            bias_value = next(v for v in layer.add.inputs if constant(v) is not None)
            if constant(bias_value).size not in (1, channels):
                return "the bias is not one value per feature"
    b = constant(bias_value).astype(np.float64).reshape(-1) if bias_value is not None else np.zeros(channels)
    return w.astype(dtype), (b * scale + shift).astype(dtype), attrs


def rules(target: str) -> list[pattern.RewriteRule]:
    """The fold, for every target: it only removes work."""
    return [FoldBatchNorm.rule()]
