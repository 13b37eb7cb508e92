"""Reading a linear projection y = x·W + b off the graph, whatever form the exporter wrote.

    MatMul(x, W) [+ b]                              x [.., Din], W [Din, D], b [D]
    Gemm(A, B, C; alpha, beta, transB)              = A·(alpha·B[ᵀ]) + beta·C      (C a row: [D] or [1, D])
    Reshape(Gemm | MatMul(Reshape(x, [B·S, Din])), [B, S, D])                        (addmm, GPT-2's Conv1D)

`projection` returns the `Linear` with alpha, beta and transB folded into W and b, or the reason
it declines. The flattened form is exact only when the tokens come back in order: the inner
Reshape keeps x's last axis (rows are x's tokens in order) and the outer one gives back x's B
and S; `tokens` proves both. Used by `packed_qkv` and `split_qkv` (which pack the Q, K, V
weights, `self_attention_qkv`) and by `attention` (which reads S from x, so that the projection
stays free to be packed).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import onnx_ir as ir

from deployfuse.rewrite.rules._attention_shapes import DimOf, constant, rank, same_dim, scalar, static_dim
from deployfuse.rewrite.rules._common import is_op


class Linear(NamedTuple):
    """y = x·weight + bias (bias None: no bias); `weight_value` names the stored weight."""

    x: ir.Value
    weight_value: ir.Value
    weight: np.ndarray
    bias: np.ndarray | None


def _gemm(node: ir.Node) -> Linear | str:
    attrs = node.attributes
    if attrs.get_int("transA", 0):
        return "Gemm has transA=1 (the tokens would be its columns)"
    weight = constant(node.inputs[1])
    if weight is None or weight.ndim != 2:
        return "Gemm's B is not a constant matrix"
    weight = weight.T if attrs.get_int("transB", 0) else weight
    c_value = node.inputs[2] if len(node.inputs) > 2 else None
    c = constant(c_value)
    if c_value is not None and c is None:
        return "Gemm's C is not a constant"
    if c is not None and (c.ndim not in (1, 2) or c.size != weight.shape[1] or c.shape[-1] != weight.shape[1]):
        return f"Gemm's C {list(c.shape)} is not a row [D] or [1, D] (D = {weight.shape[1]})"
    alpha, beta = attrs.get_float("alpha", 1.0), attrs.get_float("beta", 1.0)
    bias = None if c is None else c.reshape(-1) * np.asarray(beta, c.dtype)
    return Linear(node.inputs[0], node.inputs[1], weight * np.asarray(alpha, weight.dtype), bias)


def linear(value: ir.Value, exclusive: bool = True) -> Linear | str:
    """`value` = x·W [+ b] as MatMul [+ Add] or Gemm, W (2-D) and b constants; or why not.
    `exclusive`: the MatMul's output may have no other consumer than the bias Add."""
    node = value.producer()
    if is_op(node, "Gemm"):
        return _gemm(node)
    bias = None
    if is_op(node, "Add"):
        for side in (0, 1):
            inner = node.inputs[side].producer()
            if is_op(inner, "MatMul") and constant(node.inputs[1 - side]) is not None:
                bias, value, node = constant(node.inputs[1 - side]), node.inputs[side], inner
                break
        else:
            return "not x·W + b with b a constant"
    if not is_op(node, "MatMul"):
        return "not a MatMul [+ Add] or Gemm projection"
    if exclusive and len(value.uses()) != 1:
        return "x·W has other consumers"
    weight = constant(node.inputs[1])
    if weight is None or weight.ndim != 2:
        return "the MatMul's weight is not a constant matrix"
    if bias is not None and bias.ndim != 1:
        return f"the bias {list(bias.shape)} is not a vector"
    return Linear(node.inputs[0], node.inputs[1], weight, bias)


def reshaped_from(value: ir.Value, exclusive: bool = True) -> ir.Value | None:
    """`y` when `value` comes from `y` through Reshapes alone (each input read once unless not
    `exclusive`): element order never changes, so that is Reshape(y, value's shape); else None."""
    node, inner = value.producer(), None
    while is_op(node, "Reshape") and (not exclusive or len(node.inputs[0].uses()) == 1):
        inner = node.inputs[0]
        node = inner.producer()
    return inner


def tokens(x: ir.Value, out: ir.Value) -> ir.Value | None:
    """The [B, S, Din] tensor whose tokens `x` holds in order (`x` itself, or the tensor a
    Reshape(·, [B·S, Din]) flattened into `x`), when `out` [B, S, D] has its B and S: then
    Reshape(x·W + b, out's shape) is that tensor's projection, token for token. Else None."""
    node = x.producer()
    if rank(x) == 2 and is_op(node, "Reshape"):
        source = node.inputs[0]
        if rank(source) != 3 or static_dim(source, 2) is None or static_dim(x, 1) != static_dim(source, 2):
            return None
        x = source
    if rank(x) != 3 or rank(out) != 3 or not all(same_dim(DimOf(out, a), DimOf(x, a)) for a in (0, 1)):
        return None
    return x


def projection(value: ir.Value, exclusive: bool = True) -> Linear | str:
    """`value` = (x·W [+ b]) [· s] as a `Linear` on x, W, b and the scalar s constants (s folded
    in: (x·W + b)·s = x·(s·W) + s·b); or why not. x·W + b may be reshaped back to x's [B, S, D] on
    the way (a head split and merge), and may run on the flattened tokens:
    Reshape(Gemm | MatMul [+ Add](Reshape(x, [B·S, Din])), [B, S, D]), as addmm exports.
    `exclusive`: no other node reads the projection's intermediate values (needed to remove it)."""
    node, factor = value.producer(), None
    if exclusive and len(value.uses()) != 1:
        return "the projection has other consumers"
    if is_op(node, "Mul"):
        side = 0 if scalar(node.inputs[1]) is not None else 1 if scalar(node.inputs[0]) is not None else None
        if side is None or (exclusive and len(node.inputs[side].uses()) != 1):
            return "a Mul on the projection is not an exclusive scale by a constant"
        factor, value = scalar(node.inputs[1 - side]), node.inputs[side]
    out, inner = value, reshaped_from(value, exclusive)
    found = linear(inner if inner is not None else value, exclusive)
    if isinstance(found, str):
        return found
    if inner is not None:
        x = tokens(found.x, out)
        if x is None or found.weight.shape[0] != static_dim(x, 2):
            return "the flattened projection is not provably Reshape(x [B, S, Din], [B·S, Din]) back to x's B, S"
        found = found._replace(x=x)
    if factor is not None:
        found = found._replace(weight=found.weight * np.asarray(factor, found.weight.dtype),
                               bias=None if found.bias is None else found.bias * np.asarray(factor, found.bias.dtype))
    return found


class QKVWeights(NamedTuple):
    """Q | K | V = x·weight + bias, column blocks [Din, 3D] and [3D]; `name` prefixes the packed initializers."""

    x: ir.Value
    weight: np.ndarray
    bias: np.ndarray
    name: str


def self_attention_qkv(query: ir.Value, key: ir.Value, value: ir.Value) -> QKVWeights | str:
    """x and the packed weight [Wq | Wk | Wv] and bias [bq | bk | bv] (a zero block for a
    projection without bias) when Q, K, V are three `projection`s of one x [B, S, Din] with
    weights [Din, D] of one dtype and biases [D]; or why not."""
    parts = [projection(v) for v in (query, key, value)]
    reasons = [p for p in parts if isinstance(p, str)]
    if reasons:
        return f"Q, K or V is not x·W [+ b] with constant W, b used once: {reasons[0]}"
    found = [p for p in parts if not isinstance(p, str)]
    x = found[0].x
    if any(p.x is not x for p in found):
        return "Q, K, V are projections of different inputs (cross-attention)"
    weights = [p.weight for p in found]
    if rank(x) != 3 or weights[0].ndim != 2 or any(w.shape != weights[0].shape or w.dtype != weights[0].dtype for w in weights):
        return "x is not [B, S, Din] or the weights are not all [Din, D] of one dtype"
    hidden = weights[0].shape[1]
    biases = [np.zeros(hidden, weights[0].dtype) if p.bias is None else p.bias for p in found]
    if any(b.shape != (hidden,) or b.dtype != weights[0].dtype for b in biases):
        return "a bias is not a vector [D] of the weights' dtype"
    return QKVWeights(x, np.concatenate(weights, axis=1), np.concatenate(biases), found[0].weight_value.name or "qkv")
