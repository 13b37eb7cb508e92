"""Activation patterns shared by the bias+act and norm+act families.

Each entry builds `op, y -> act(y)` for one way the graph may spell the activation; the name is
the `activation` attribute of the deployfuse op it becomes. GELU also matches the fused forms
the gelu family emits (Gelu-20, com.microsoft Gelu / FastGelu) and, where that family left
them (TensorRT below opset 20), the decomposed forms.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from deployfuse.rewrite.rules.gelu import gelu_forms
from deployfuse.targets import MS

Builder = Callable[[Any, Any], Any]


def _gelu20(op, y):
    return op.Gelu(y, _allow_other_attributes=True, _outputs=["act_out"])


def activations(names: tuple[str, ...]) -> Iterator[tuple[str, Builder]]:
    """(activation name, pattern builder) for every spelling of the activations in `names`.

    A Gelu-20 node matches both "gelu" and "gelu_tanh"; `gelu20_approximate` tells which.
    """
    spellings: list[tuple[str, Builder]] = [
        ("relu", lambda op, y: op.Relu(y)),
        ("sigmoid", lambda op, y: op.Sigmoid(y)),
        ("silu", lambda op, y: op.Mul(y, op.Sigmoid(y))),
        ("silu", lambda op, y: op.Mul(op.Sigmoid(y), y)),
        ("gelu", _gelu20),
        ("gelu", lambda op, y: op.Gelu(y, _domain=MS)),
        ("gelu_tanh", _gelu20),
        ("gelu_tanh", lambda op, y: op.FastGelu(y, _domain=MS)),
    ]
    spellings += [("gelu" if kind == "erf" else "gelu_tanh", build) for kind, build in gelu_forms()]
    return ((name, build) for name, build in spellings if name in names)


def gelu20_approximate(act_out: Any) -> str:
    """The `approximate` attribute of a matched Gelu-20 node ("none" when absent)."""
    return act_out.producer().attributes.get_string("approximate", "none")
