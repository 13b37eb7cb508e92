"""Find Python values the exporters took from tensor data: branches and numbers baked into a graph.

`if x.sum() > 0:` cannot be recorded by a tracer: the TorchScript exporter follows the branch
the example input takes and warns (TracerWarning); the exported graph then computes that branch
for every input. Transformers models raise the same warning for shape checks
(`if seq_len > 1`), which are harmless once the shapes are verified, so the warning text alone
cannot tell the two apart. `DataDependenceSpy` does: while tracing, each conversion of a tensor
to a Python value (bool, int, float, `item`, `tolist`, `torch.equal`) is looked up in the trace
graph, and it is data-dependent when the tensor is computed from the model's input values, not
only from their shapes (`aten::size`). The dynamo exporter refuses such branches itself
(`GuardOnDataDependentSymNode`); `dynamo_data_dependence` turns that error into one line.
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from types import FrameType

import torch
from torch.overrides import TorchFunctionMode

# Tensor -> Python value conversions; the tracer can record none of them.
_CONVERSIONS = {
    torch.Tensor.__bool__: "a branch on a tensor's value (bool)",
    torch.Tensor.__int__: "a tensor's value as a Python int",
    torch.Tensor.__float__: "a tensor's value as a Python float",
    torch.Tensor.__index__: "a tensor's value as an index",
    torch.Tensor.item: "a tensor's value as a Python number (item)",
    torch.Tensor.tolist: "a tensor's values as a Python list (tolist)",
    torch.equal: "a branch on torch.equal",
    torch.Tensor.equal: "a branch on torch.equal",
    torch.allclose: "a branch on torch.allclose",
    torch.is_nonzero: "a branch on torch.is_nonzero",
}
_SHAPE_OPS = frozenset({"aten::size", "aten::sizes", "prim::shape", "aten::dim", "aten::numel", "aten::len"})
# Ops whose output shape depends on input values: a size read from them is data-dependent.
_VALUE_SHAPED_OPS = frozenset({"aten::nonzero", "aten::nonzero_numpy", "aten::argwhere", "aten::masked_select",
                               "aten::unique", "aten::_unique", "aten::_unique2", "aten::unique_consecutive", "aten::unique_dim"})
_TORCH_DIR = os.path.dirname(torch.__file__)
_THIS_DIR = os.path.dirname(__file__)


@dataclass(frozen=True)
class DataDependence:
    """One Python value taken from tensor data during tracing: where, what, and the tracer's warning."""

    location: str  # file:line of the model code
    code: str  # that line
    conversion: str
    warning: str = ""  # the TracerWarning the exporter raised there, if any

    def __str__(self) -> str:
        return f"{self.location} `{self.code}`: {self.conversion}" if self.code else f"{self.location}: {self.conversion}"


def _depends_on_values(value: torch._C.Value, inputs: set[int]) -> bool:
    """Whether the traced `value` is computed from the values (not only the shapes) of `inputs`."""
    seen: set[tuple[int, bool]] = set()
    stack = [(value, False)]  # (value, reached through a size: only value-shaped ops count)
    while stack:
        current, through_size = stack.pop()
        if (current.unique(), through_size) in seen:
            continue
        seen.add((current.unique(), through_size))
        node = current.node()
        kind = node.kind()
        if through_size and kind in _VALUE_SHAPED_OPS:
            return True
        if not through_size and current.unique() in inputs:
            return True
        stack.extend((v, through_size or kind in _SHAPE_OPS) for v in node.inputs())
    return False


def model_frame() -> FrameType | None:
    """The innermost frame outside torch and this package (its exporters and torch function modes):
    the model code being traced, None where there is none."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith((_TORCH_DIR, _THIS_DIR)):
        frame = frame.f_back
    return frame


def _model_frame() -> tuple[str, str]:
    """file:line and source of `model_frame`."""
    frame = model_frame()
    if frame is None:
        return "?", ""
    import linecache

    return f"{frame.f_code.co_filename}:{frame.f_lineno}", linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()


class DataDependenceSpy(TorchFunctionMode):
    """Records data-dependent conversions while the TorchScript tracer runs (see the module doc).

    Call `mark_inputs` with the model's input tensors at the start of the traced forward.
    """

    def __init__(self) -> None:
        super().__init__()
        self.inputs: set[int] = set()
        self.found: list[DataDependence] = []

    def mark_inputs(self, tensors: Iterable[torch.Tensor]) -> None:
        if torch._C._get_tracing_state() is not None:
            self.inputs |= {torch._C._get_value_trace(t).unique()  # type: ignore[attr-defined]  # missing from torch._C stubs
                             for t in tensors if isinstance(t, torch.Tensor)}

    def _from_inputs(self, tensor: torch.Tensor) -> bool:
        try:
            value = torch._C._get_value_trace(tensor)  # type: ignore[attr-defined]
        except RuntimeError:  # a tensor the trace never saw: not computed from the inputs
            return False
        return _depends_on_values(value, self.inputs)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        conversion = _CONVERSIONS.get(func)
        if conversion is None or not self.inputs or torch._C._get_tracing_state() is None:
            return func(*args, **(kwargs or {}))
        if not any(self._from_inputs(a) for a in args if isinstance(a, torch.Tensor)):
            return func(*args, **(kwargs or {}))
        with warnings.catch_warnings(record=True) as caught:  # the tracer's own warning, for the report
            warnings.simplefilter("always")
            result = func(*args, **(kwargs or {}))
        location, code = _model_frame()
        if all(f.location != location for f in self.found):
            text = next((" ".join(str(w.message).split()) for w in caught if issubclass(w.category, torch.jit.TracerWarning)), "")
            self.found.append(DataDependence(location, code, conversion, text))
        return result


_DYNAMO_CALL = re.compile(r'The following call raised this error:\s*File "([^"]+)", line (\d+), in \S+\s*\n\s*(.+)')


def dynamo_data_dependence(exc: BaseException) -> str | None:
    """One line when torch.export failed on a branch on tensor values, else None."""
    chain, seen = [], set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append(current)
        current = current.__cause__ or current.__context__
    if not any(type(e).__name__ == "GuardOnDataDependentSymNode" or "data-dependent expression" in str(e) for e in chain):
        return None
    text = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(str(e) for e in chain))
    where = _DYNAMO_CALL.search(text)
    at = f" at {where.group(1)}:{where.group(2)} `{where.group(3).strip()}`" if where else ""
    return f"data-dependent control flow{at}: torch.export cannot branch on tensor values (GuardOnDataDependentSymNode)"
