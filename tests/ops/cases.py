"""Op cases shared by the ops tests: (op, main shape, attributes) covering every variant,
awkward sizes (odd hidden sizes, one row, q_seq != k_seq) and non-default numeric attributes."""

from __future__ import annotations

from typing import Any

CASES: list[tuple[str, tuple[int, ...], dict[str, Any]]] = [
    ("LayerNormGelu", (3, 5, 37), {}),
    ("LayerNormGelu", (1, 1, 770), {"approximate": "tanh", "epsilon": 1e-3}),
    ("LayerNormGelu", (2, 3, 4, 6), {"axis": -2}),
    ("GroupNormAct", (2, 12, 5, 7), {"num_groups": 4}),
    ("GroupNormAct", (2, 12, 5, 7), {"num_groups": 3, "activation": "gelu", "epsilon": 1e-3}),
    ("GroupNormAct", (1, 6, 1, 3), {"num_groups": 6, "activation": "none"}),
    *[("BiasAct", (4, 9, 33), {"activation": a}) for a in ("relu", "gelu", "gelu_tanh", "silu", "sigmoid")],
    ("BiasAct", (7, 8), {"activation": "gelu"}),
    ("FusedMHA", (2, 7, 7, 24), {"num_heads": 3}),
    ("FusedMHA", (2, 5, 9, 24), {"num_heads": 2, "causal": 1, "mask": True, "scale": 0.3}),
    ("FusedMHA", (1, 9, 9, 16), {"num_heads": 4, "causal": 1}),
    ("FusedMHA", (2, 1, 13, 40), {"num_heads": 5, "mask": True}),
]


def case_id(case: tuple[str, tuple[int, ...], dict[str, Any]]) -> str:
    op, shape, attrs = case
    return f"{op}-{'x'.join(map(str, shape))}-" + ",".join(f"{k}={v}" for k, v in attrs.items())
