"""Record the fp16 overflow clamp of transformers models as a graph, not as a branch.

BART, Marian, PLBart, LED, MVP, Informer and more transformers models end a layer with (DETR's
family does the same, in training only)

    if hidden_states.dtype == torch.float16 and not torch.isfinite(hidden_states).all():
        hidden_states = torch.clamp(hidden_states, min=-clamp_value, max=clamp_value)

a branch on tensor values that only an fp16 export takes: torch.export refuses it
(GuardOnDataDependentSymNode) and the TorchScript tracer bakes in the example's side. While an
exporter traces, `OverflowClampAsWhere` answers such a test with "take the branch" and turns
the clamp that follows into `torch.where(isfinite(x).all(), x, clamp(x))`, which computes the
branch for every input exactly as PyTorch does. It only answers an `if` on `all()` of
`isfinite(x)` (or `any()` of `isinf(x)` / `isnan(x)`) whose body clamps (read from the model's
source) and whose first operation clamps that same x; any other branch is left to the
exporters' own checks, which refuse it.
"""

from __future__ import annotations

import linecache
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from deployfuse.export.data_dependence import model_frame

# predicate -> (reduction, the reduction's value for which the branch is not taken: no overflow)
_OVERFLOW_TESTS: dict[Callable[..., torch.Tensor], tuple[Callable[..., torch.Tensor], bool]] = {
    torch.isfinite: (torch.Tensor.all, True),
    torch.Tensor.isfinite: (torch.Tensor.all, True),
    torch.isinf: (torch.Tensor.any, False),
    torch.Tensor.isinf: (torch.Tensor.any, False),
    torch.isnan: (torch.Tensor.any, False),
    torch.Tensor.isnan: (torch.Tensor.any, False),
}
_CLAMPS = frozenset({torch.clamp, torch.clip, torch.Tensor.clamp, torch.Tensor.clip})


def _branch_clamps() -> bool:
    """Whether the model code asking for the bool is an `if` whose body clamps (read from its source)."""
    frame = model_frame()
    if frame is None:
        return False
    lines = linecache.getlines(frame.f_code.co_filename)
    head = lines[frame.f_lineno - 1] if 0 < frame.f_lineno <= len(lines) else ""
    if not head.lstrip().startswith(("if ", "elif ")):
        return False
    indent = len(head) - len(head.lstrip())
    for line in lines[frame.f_lineno:]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            return False  # the body ended without a clamp
        if "clamp(" in line or "clip(" in line:
            return True
    return False


class OverflowClampAsWhere(TorchFunctionMode):
    """While tracing, `if <x overflowed>: x = clamp(x)` becomes `x = where(<x overflowed>, clamp(x), x)`.

    Enter it inside any mode that watches tensor-to-bool conversions, so that it answers the
    tests it rewrites first. `rewritten` counts the clamps it turned into a `where`.
    """

    def __init__(self) -> None:
        super().__init__()
        self.rewritten = 0
        # id of a predicate's output -> (that output, x, the reduction, its no-overflow value); kept
        # alive here so that an id is never reused during the trace
        self._predicates: dict[int, tuple[torch.Tensor, torch.Tensor, Callable[..., torch.Tensor], bool]] = {}
        self._tests: dict[int, tuple[torch.Tensor, torch.Tensor, bool]] = {}  # id of a reduction's output -> (it, x, no-overflow value)
        self._branch: tuple[torch.Tensor, torch.Tensor, bool] | None = None  # the test just answered "overflow", awaiting its clamp

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if self._branch is not None and getattr(func, "__name__", "") == "__get__":  # a property read (x.dtype) on the way
            return func(*args, **kwargs)
        branch, self._branch = self._branch, None
        if branch is not None:
            test, x, safe = branch
            if func in _CLAMPS and args and args[0] is x:  # the branch's clamp: computed for every input, kept on overflow
                self.rewritten += 1
                clamped = func(*args, **kwargs)
                return torch.where(test, x, clamped) if safe else torch.where(test, clamped, x)
            raise _NotAClamp(func)
        if func is torch.Tensor.__bool__ and id(args[0]) in self._tests and _branch_clamps():
            test, x, safe = self._tests[id(args[0])]
            self._branch = (test, x, safe)
            return not safe  # the overflow side: the clamp that follows is recorded, then selected by `where`
        result = func(*args, **kwargs)
        if func in _OVERFLOW_TESTS and args and isinstance(args[0], torch.Tensor):
            reduction, safe = _OVERFLOW_TESTS[func]
            self._predicates[id(result)] = (result, args[0], reduction, safe)
        elif args and id(args[0]) in self._predicates and len(args) == 1 and not kwargs:
            _, x, reduction, safe = self._predicates[id(args[0])]
            if func is reduction:
                self._tests[id(result)] = (result, x, safe)
        return result


class _NotAClamp(RuntimeError):
    """The branch taken on an overflow test did not start by clamping the tested tensor."""

    def __init__(self, func: Any) -> None:
        super().__init__(f"a branch on an overflow test (isfinite/isinf/isnan) starts with {getattr(func, '__name__', func)}, "
                         "not a clamp of the tested tensor: it cannot be recorded as a torch.where")
