"""A model only deployfuse's native kernels can run, for the guard's and autotune's custom-op library tests."""

from __future__ import annotations

import numpy as np
import onnx

from deployfuse.ops.models import example_inputs, single_op_model


def kernel_only_bias_act() -> tuple[onnx.ModelProto, onnx.ModelProto, dict[str, np.ndarray]]:
    """A deployfuse.BiasAct (GELU) model with its function body, the same without it (only a
    registered native kernel can run that one), and a fresh random feed."""
    xs = example_inputs("BiasAct", (4, 32), rng=np.random.default_rng())
    with_body = single_op_model("BiasAct", xs, activation="gelu")
    kernel_only = onnx.ModelProto()
    kernel_only.CopyFrom(with_body)
    del kernel_only.functions[:]
    return with_body, kernel_only, {"X": xs[0], "Bias": xs[1]}
