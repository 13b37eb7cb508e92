"""Helpers every rule uses: constants in the graph, dtypes, and the target's choice of op."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult, pattern

from deployfuse.targets import Lowering, Target, get_target


def is_op(node: ir.Node | None, *op_types: str) -> bool:
    """True when `node` is a standard-domain node of one of `op_types`."""
    return node is not None and node.op_type in op_types and node.domain in ("", "ai.onnx")


def scalar(value: ir.Value | None) -> float | None:
    """The value of a one-element constant tensor, else None."""
    if value is None:
        return None
    const = ir.convenience.get_const_tensor(value)
    if const is None or const.size != 1:
        return None
    return float(np.asarray(const.numpy()).reshape(()))


def dtype_name(value: ir.Value | None) -> str:
    """ONNX type name of a value's element type ("float", "float16", ...; "" if unknown)."""
    if value is None or value.dtype is None:
        return ""
    return {ir.DataType.FLOAT: "float", ir.DataType.FLOAT16: "float16", ir.DataType.BFLOAT16: "bfloat16", ir.DataType.DOUBLE: "double"}.get(value.dtype, "")


def default_opset(context: Any) -> int:
    """The model's default-domain opset (context is the rule's MatchContext)."""
    imports = context.model.opset_imports
    return imports.get("", imports.get("ai.onnx", 0))


def mean_last(op: Any, x: Any, name: str) -> Any:
    """A ReduceMean of `x` whose output binds as `name`: its axes come as an input from opset 18
    and as an attribute before, so the pattern leaves them to `over_last_axis`."""
    return op.ReduceMean(x, _allow_other_inputs=True, _outputs=[name])


def plus_epsilon(op: Any, variance: Any, eps: Any) -> Any:
    """variance + ε, or the variance alone (a norm written without ε, whose ε is then 0)."""
    return pattern.OrValue([op.Add(variance, eps), variance])


def over_last_axis(mean: ir.Value, x: ir.Value) -> bool:
    """True when `mean` is a ReduceMean over exactly the last axis of `x` ([-1] or [rank-1],
    from the `axes` input or attribute) that keeps the reduced axis."""
    node = mean.producer()
    if node is None or node.attributes.get_int("keepdims", 1) != 1:
        return False
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        const = ir.convenience.get_const_tensor(node.inputs[1])
        axes = None if const is None else [int(a) for a in np.asarray(const.numpy()).reshape(-1)]
    else:
        axes = node.attributes.get_ints("axes")
        axes = None if axes is None else list(axes)
    rank = None if x.shape is None else len(x.shape)
    return axes == [-1] or (rank is not None and axes == [rank - 1])


def check_norm_moments(x: ir.Value, means: Sequence[ir.Value], square_pow: bool, two: ir.Value | None, eps: ir.Value | None, upcast: ir.Value | None,
                       downcast: ir.Value | None) -> MatchResult | None:
    """The checks every decomposed norm shares: the means (`mean_last` outputs) are over the
    last axis only, the square is x², ε (if any) is a scalar constant, and upcasts (when present) go
    x.dtype -> float -> x.dtype. A failed MatchResult, or None."""
    fail = MatchResult().fail
    if not all(over_last_axis(m, x) for m in means):
        return fail("a mean is not over the last axis only, keeping it", list(means))
    if square_pow and scalar(two) != 2.0:
        return fail("Pow exponent is not 2", two)
    if eps is not None and scalar(eps) is None:
        return fail("ε is not a scalar constant", eps)
    if upcast is not None and (upcast.dtype != ir.DataType.FLOAT or downcast is None or downcast.dtype != x.dtype):
        return fail("casts are not x.dtype -> float -> x.dtype", [v for v in (upcast, downcast) if v is not None])
    return None


def const_1d(value: ir.Value | None, size: int | None = None) -> bool:
    """True when `value` is a constant vector (rank 1), of `size` elements if given."""
    if value is None:
        return False
    const = ir.convenience.get_const_tensor(value)
    return const is not None and len(const.shape) == 1 and (size is None or const.shape[0] == size)


def last_dim(value: ir.Value | None) -> int | None:
    """The static size of a value's last axis, else None."""
    if value is None or value.shape is None or len(value.shape) == 0:
        return None
    dim = value.shape[-1]
    return dim if isinstance(dim, int) else None


def gemm_trans_b(linear: ir.Value) -> bool:
    """Whether the Gemm producing `linear` reads its B transposed (transB=1: a 2-D nn.Linear stores Wᵀ)."""
    node = linear.producer()
    return node is not None and bool(node.attributes.get_int("transB", 0))


def stored_once(op: Any, graph: ir.Graph | None, array: np.ndarray, name: str, fallback: str) -> ir.Value:
    """`array` as an initializer named `name`, stored once for every rewrite that derives it from the same weights
    (ALBERT's layers share theirs: a copy per layer would multiply the artefact's weights, and a second initializer of
    the same name breaks the graph): the one an earlier rewrite stored when `name` holds the same values, else a new one,
    named `fallback` (unique to the rewrite) where `name` holds something else."""
    stored = graph.initializers.get(name) if graph is not None else None
    held = None if stored is None else ir.convenience.get_const_tensor(stored)
    if held is not None:
        values = held.numpy()
        if values.shape == array.shape and values.dtype == array.dtype and values.tobytes() == array.tobytes():
            return stored
    return op.initializer(ir.tensor(array), name=name if stored is None else fallback)


def broadcast_shape(*shapes: Sequence[Any]) -> list[Any] | None:
    """ONNX (numpy) broadcasting of shapes whose sizes are numbers or named dims (equal sizes: the same number or name);
    None where an axis is not provably one size: two different sizes, neither the number 1, or an unnamed dim."""
    if any(isinstance(d, ir.SymbolicDim) and d.value is None for shape in shapes for d in shape):
        return None
    out: list[Any] = []
    for axis in range(-max(len(s) for s in shapes), 0):
        sizes = {s[axis] for s in shapes if len(s) >= -axis} - {1}
        if len(sizes) > 1:
            return None
        out.append(sizes.pop() if sizes else 1)
    return out


def either(op_type: Any, a: Any, b: Any) -> Any:
    """A commutative binary op pattern (op.Mul, op.Add) matching either operand order.

    Cheaper than `RewriteRule.commute()`, which multiplies whole rules by 2^(commutative nodes).
    Only for an operand that is a node pattern or a constant: between two plain variables the
    first order always binds, and a check that fails later cannot retry the other order.
    """
    return pattern.OrValue([op_type(a, b), op_type(b, a)])


class FusionRule(pattern.RewriteRuleClassBase):
    """A rewrite rule that knows its target; `choose` picks the first lowering the target runs."""

    def __init__(self, name: str, target: str | Target) -> None:
        super().__init__(name)
        self.target: Target = get_target(target)
        self.lowering: Lowering | None = None

    def choose(self, context: Any, x: ir.Value, options: Sequence[Lowering]) -> MatchResult:
        """Set `self.lowering` to the first option with a kernel for `x`'s dtype, or fail saying why."""
        opset, dtype = default_opset(context), dtype_name(x)
        if not dtype:
            return MatchResult().fail("input dtype is not a known float type", x)
        for option in options:
            if self.target.emits(option.domain, option.op_type, opset, dtype):
                self.lowering = option
                return MatchResult()
        names = ", ".join(f"{o.domain or 'ai.onnx'}::{o.op_type}" for o in options) or "nothing"
        return MatchResult().fail(f"{self.target} has no kernel for {names} on {dtype} (opset {opset})")

    def emit(self, op: Any, *inputs: ir.Value | None, **attrs: Any) -> Any:
        """Emit the chosen lowering with `inputs` and extra attributes: its output, or a tuple of
        them when `_outputs` asks for several."""
        low = self.lowering
        assert low is not None, "choose() must succeed before emit()"
        return getattr(op, low.op_type)(*inputs, _domain=low.domain, **low.attrs, **attrs)
