"""Models only deployfuse's native kernels can run, for the custom-op library tests of the guard, autotune and fp8 rules."""

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


def without_deployfuse_bodies(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` without its deployfuse function bodies: only the custom-op library's kernels can run those nodes."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    kept = [f for f in out.functions if f.domain != "deployfuse"]
    del out.functions[:]
    out.functions.extend(kept)
    return out


def random_feed(rng: np.random.Generator, model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Fresh random values for a graph's static-shaped inputs: float16 normals, token ids below 500, and all ones for an
    int64 input named like a mask."""
    feed = {}
    for value in model.graph.input:
        dims = [d.dim_value for d in value.type.tensor_type.shape.dim]
        if value.type.tensor_type.elem_type == onnx.TensorProto.INT64:
            feed[value.name] = np.ones(dims, np.int64) if "mask" in value.name else rng.integers(0, 500, dims)
        else:
            feed[value.name] = rng.standard_normal(dims).astype(np.float16)
    return feed
