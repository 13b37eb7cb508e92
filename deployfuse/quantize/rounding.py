"""Int8 weights rounded to the calibration activations (GPTQ), for ort-cpu's dynamic int8.

Rounding each weight to its nearest int8 step (what ONNX Runtime's quantizer does) leaves each
output column an error that the activations multiply; GPTQ (Frantar et al., 2022) rounds one
input row at a time and moves the rounding error onto the rows not yet rounded, in proportion to
how the calibration activations correlate them (H = X^T X), which minimises ||X W - X W_q||
instead of ||W - W_q||. The scales stay ONNX Runtime's (symmetric per output column, max|w| / 127,
or / 64 in `--int8-mode dynamic-7bit`, its reduce_range) and so do its kernels: only which integer
each weight becomes changes.

Why: on BERT-base (trained-like biases and norms, seq 128), every GEMM in dynamic int8 was at
relative error 2.36e-2 with nearest rounding and 1.78e-2 with this on the gate's calibration
samples (held-out 2.32e-2 and 1.79e-2, in an export with float64 Gram matrices). One held-out
sample sits near the default budget of 2e-2: with the float32 ones `grams` accumulates, the
benchmark's export measured 2.08e-2 on it and the gate put 1 layer of 72 back in fp32, where
nearest rounding needed 10 (bench/results/cpu_int8.md). The activations stay quantized at run time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

DAMPING = 0.01  # added to H's diagonal, as a share of its mean: keeps the factorisation stable
BLOCK = 128  # rows rounded between two updates of the rows after them (the error moves the same)
_GRAM_BYTES = 768 * 1024**2  # float32 Gram matrices accumulated at once (BERT-base: 0.54 GB); more take another pass


def int8_per_column(weight: np.ndarray, gram: np.ndarray | None = None, levels: int = 127) -> tuple[np.ndarray, np.ndarray]:
    """A MatMul weight (K, N) in symmetric int8 per output column (-levels..levels, scale
    max|column| / levels, ONNX Runtime's: 127, or 64 with its reduce_range), and the scales: rounded
    to the nearest step without `gram`, by GPTQ with `gram` (X^T X of the layer's input activations, K x K)."""
    w = torch.from_numpy(np.array(weight, dtype=np.float32))
    absmax = w.abs().amax(dim=0).double()
    scale = torch.where(absmax > 0, absmax / levels, torch.ones_like(absmax)).float()
    if gram is None:
        return torch.clamp(torch.round(w / scale), -levels, levels).to(torch.int8).numpy(), scale.numpy()
    return _gptq(w, torch.from_numpy(np.asarray(gram, dtype=np.float64)), scale, levels).numpy(), scale.numpy()


def _gptq(w: torch.Tensor, gram: torch.Tensor, scale: torch.Tensor, levels: int) -> torch.Tensor:
    rows = w.shape[0]
    dead = torch.diagonal(gram) == 0  # an input that is always 0: any weight does, take 0
    w[dead] = 0
    h = gram.clone()
    h[dead, dead] = 1
    h += DAMPING * float(torch.diagonal(h).mean()) * torch.eye(rows, dtype=h.dtype)
    # U upper triangular with U^T U = H^-1: from the Cholesky factor of H with its rows and
    # columns reversed (H = R R^T, R upper), U = R^-1.
    r = torch.linalg.cholesky(h.flip(0, 1)).flip(0, 1)
    u = torch.linalg.solve_triangular(r, torch.eye(rows, dtype=h.dtype), upper=True).float()
    q = torch.empty_like(w)
    for start in range(0, rows, BLOCK):
        end = min(start + BLOCK, rows)
        block = w[start:end].clone()
        errors = torch.empty_like(block)
        for i in range(end - start):
            row = start + i
            q[row] = torch.clamp(torch.round(block[i] / scale), -levels, levels)
            errors[i] = (block[i] - q[row] * scale) / u[row, row]
            block[i + 1:] -= torch.outer(u[row, row + 1:end], errors[i])
        w[end:] -= u[start:end, end:].T @ errors
    return q.to(torch.int8)


def grams(model: onnx.ModelProto, inputs: Sequence[str], feeds: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """X^T X (float32) of each of the tensors `inputs` of the fp32 `model` (rows: every position
    of the leading axes; columns: the last axis), summed over `feeds`; a few passes over the
    feeds when the matrices would not fit in `_GRAM_BYTES` together."""
    from deployfuse.backends import ort as ort_backend

    sizes = _last_axis_sizes(model, inputs)
    passes: list[list[str]] = [[]]
    used = 0
    for name in inputs:
        if passes[-1] and used + 4 * sizes[name] ** 2 > _GRAM_BYTES:
            passes.append([])
            used = 0
        passes[-1].append(name)
        used += 4 * sizes[name] ** 2
    result: dict[str, np.ndarray] = {}
    for names in passes:
        exposed = onnx.ModelProto()
        exposed.CopyFrom(model)
        known = {o.name for o in exposed.graph.output} | {i.name for i in exposed.graph.input}
        exposed.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names if n not in known)
        session = ort_backend.session(exposed)
        totals = {n: torch.zeros(sizes[n], sizes[n]) for n in names}
        for feed in feeds:
            out = {**feed, **ort_backend.run(session, feed)}
            for n in names:
                x = torch.from_numpy(np.ascontiguousarray(out[n], dtype=np.float32).reshape(-1, sizes[n]))
                totals[n].addmm_(x.T, x)
        result.update({n: t.numpy() for n, t in totals.items()})
    return result


def _last_axis_sizes(model: onnx.ModelProto, inputs: Sequence[str]) -> dict[str, int]:
    """Each tensor's last axis, from the weight it multiplies (its rows)."""
    weights = {t.name: t for t in model.graph.initializer}
    sizes: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type == "MatMul" and node.input[0] in inputs and node.input[1] in weights:
            sizes[node.input[0]] = int(weights[node.input[1]].dims[0])
    missing = [n for n in inputs if n not in sizes]
    if missing:
        raise ValueError(f"no MatMul with an initializer weight reads {missing[0]}")
    return sizes


def weighted_matmuls(model: onnx.ModelProto, layers: Mapping[str, onnx.NodeProto]) -> dict[str, onnx.NodeProto]:
    """The MatMuls of `layers` whose weight is a 2-D initializer: those `int8_per_column` rounds."""
    weights = {t.name: t for t in model.graph.initializer}
    return {name: n for name, n in layers.items() if n.op_type == "MatMul" and n.input[1] in weights and len(weights[n.input[1]].dims) == 2}


def rounded_weights(model: onnx.ModelProto, layers: Mapping[str, onnx.NodeProto], feeds: Sequence[Mapping[str, np.ndarray]],
                    levels: int = 127) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The int8 weight and scales of each of `weighted_matmuls(model, layers)`, by weight name,
    GPTQ-rounded to its input's activations on `feeds` (calibration samples), in -levels..levels."""
    weights = {t.name: t for t in model.graph.initializer}
    matmuls = weighted_matmuls(model, layers).values()
    gram = grams(model, sorted({n.input[0] for n in matmuls}), feeds)
    return {n.input[1]: int8_per_column(numpy_helper.to_array(weights[n.input[1]]), gram[n.input[0]], levels) for n in matmuls}


__all__ = ["grams", "int8_per_column", "rounded_weights", "weighted_matmuls"]
