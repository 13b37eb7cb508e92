"""Int8 weights as uint8 where this CPU's u8 x s8 kernels saturate.

ONNX Runtime's int8 CPU kernels (MLAS) multiply uint8 activations by int8 weights. On x86 CPUs
without VNNI (AVX2 and AVX-512 without VNNI: AMD Zen 2/3, Intel before Cascade Lake) they add two
u8 x s8 products into an int16 (`vpmaddubsw`), which saturates: 255 * 127 * 2 = 64770 > 32767.
A dynamic int8 MatMul then loses several % of relative error (0.108 against 0.004 on a random
64 x 32 layer on an AVX2 AMD EPYC, tests/test_u8s8.py), and the same artefact is accurate on a
CPU with VNNI. ONNX Runtime's own guidance for such CPUs is uint8 weights (u8 x u8 kernels widen
to 16 bits first) or 7-bit weights (reduce_range, less accurate everywhere).

deployfuse keeps int8 in the artefact (the fast form where VNNI runs it) and, when a probe shows
that this ONNX Runtime on this CPU saturates, runs it with each int8 weight w and zero point z
stored as w + 128 and z + 128 in uint8: (a - za)(w - z) is unchanged, so the kernels compute the
same integers, without the saturation. `backends.ort.session` and `deployfuse.InferenceSession`
apply it, so the accuracy gate measures what the runtime will run. ONNX Runtime used directly on
such a CPU runs the artefact as stored.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["SATURATION_NOTE", "for_this_cpu", "saturates", "unsigned_weights"]

SATURATION_NOTE = ("note: this CPU has no VNNI, so ONNX Runtime's u8 x s8 int8 kernels saturate here; deployfuse runs (and gated) the "
                   "int8 weights as uint8, in its slower kernels. --int8-mode dynamic-7bit keeps the faster ones, at one bit less of weight "
                   "precision (bench/results/cpu_int8.md)")

LOG = logging.getLogger("deployfuse")

# (domain, op type) -> the (weight, zero point) input slots that may hold int8 weights
WEIGHT_SLOTS = {
    ("", "MatMulInteger"): (1, 3),
    ("", "ConvInteger"): (1, 3),
    ("com.microsoft", "DynamicQuantizeMatMul"): (1, 3),
    ("com.microsoft", "MatMulIntegerToFloat"): (1, 5),
    ("", "DequantizeLinear"): (0, 2),
}


def for_this_cpu(model: onnx.ModelProto | str | Path | bytes, providers: Sequence[Any],
                 header: onnx.ModelProto | None = None) -> onnx.ModelProto | str | Path | bytes:
    """`model` as ONNX Runtime should get it here: itself, or `unsigned_weights(model)` serialized when the
    providers include the CPU's, the model has int8 weights in integer GEMM slots and `saturates()`.
    `header`: the model at a path, already loaded without its external data (not loaded again)."""
    names = {p if isinstance(p, str) else p[0] for p in providers}
    if "CPUExecutionProvider" not in names:
        return model
    if isinstance(model, onnx.ModelProto):
        header = model
    elif isinstance(model, bytes):
        header = onnx.load_from_string(model)
    elif header is None:
        header = onnx.load(str(model), load_external_data=False)
    if not {(n.domain, n.op_type) for n in _nodes(header.graph)} & set(WEIGHT_SLOTS) or not saturates():
        return model
    full = header if isinstance(model, (onnx.ModelProto, bytes)) else onnx.load(str(model))
    from deployfuse.quantize.qdq import PROTOBUF_LIMIT  # late, as in unsigned_weights

    unsigned = unsigned_weights(full)
    if unsigned is None:
        return model
    if unsigned.ByteSize() > PROTOBUF_LIMIT:
        LOG.warning("int8 weights run as stored: this CPU's u8 x s8 kernels saturate, and the model is too large to rewrite in memory")
        return model
    LOG.info("int8 weights run as uint8 (+128): this CPU's u8 x s8 kernels saturate (no VNNI)")
    return unsigned.SerializeToString()


@functools.cache
def saturates() -> bool:
    """Whether ONNX Runtime's CPU kernel for uint8 x int8 saturates here: one DynamicQuantizeMatMul whose
    every pair of products is 255 * 127, against the exact result."""
    import onnxruntime as ort

    k = 64
    x = np.ones((1, k), np.float32)
    x[0, -1] = -1.0  # the activation's range [-1, 1]: 1 quantizes to 255
    weight = np.full((k, 1), 127, np.int8)
    graph = helper.make_graph(
        [helper.make_node("DynamicQuantizeMatMul", ["x", "w", "s", "z"], ["y"], domain="com.microsoft")], "u8s8_probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(np.ones(1, np.float32), "s"), numpy_helper.from_array(np.zeros(1, np.int8), "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)], ir_version=9)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    got = float(session.run(None, {"x": x})[0][0, 0])
    scale = 2.0 / 255.0  # dynamic quantization of [-1, 1]: 1 -> 255, -1 -> 0, zero point 128 (rounded from 127.5)
    exact = scale * 127.0 * ((255 - 128) * (k - 1) + (0 - 128))
    return abs(got - exact) > 1e-3 * abs(exact)


def unsigned_weights(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """A copy of `model` with each int8 weight initializer read only in integer GEMM weight slots
    (`WEIGHT_SLOTS`, in the graph or its subgraphs: the gate's switchboard holds its GEMMs in If
    branches) whose values can saturate (`_can_saturate`) stored as uint8 w + 128, its zero point as
    uint8 z + 128 (a missing one added as 128); None when there is none (nothing to change). A
    weight or zero point that another node also reads stays as it is, and so does every node
    reading it."""
    from deployfuse.quantize.qdq import fresh_name  # late: the quantize package opens its sessions through this one

    nodes = list(_nodes(model.graph))
    fed = {i.name for i in model.graph.input}
    stored = {t.name: t for g in _graphs(model.graph) for t in g.initializer if t.name not in fed}
    readers: dict[str, list[int]] = {}
    for at, node in enumerate(nodes):
        for name in node.input:
            readers.setdefault(name, []).append(at)

    def operands(node: onnx.NodeProto) -> tuple[str, str] | None:
        slots = WEIGHT_SLOTS.get((node.domain, node.op_type))
        if slots is None:
            return None
        weight, zero = (node.input[i] if len(node.input) > i else "" for i in slots)
        int8 = all(not name or (name in stored and stored[name].data_type == TensorProto.INT8) for name in (weight, zero))
        return (weight, zero) if weight and int8 and _can_saturate(stored[weight]) else None

    chosen = {at: ops for at, node in enumerate(nodes) if (ops := operands(node)) is not None}
    while True:  # a weight or zero point read by a node left out leaves out every node reading it
        dropped = {at for at, ops in chosen.items() if any(name and set(readers[name]) - set(chosen) for name in ops)}
        if not dropped:
            break
        chosen = {at: ops for at, ops in chosen.items() if at not in dropped}
    if not chosen:
        return None
    out = onnx.ModelProto()  # the same nodes and initializers, in the same order: `chosen` and the names hold for it
    out.CopyFrom(model)
    nodes = list(_nodes(out.graph))
    stored = {t.name: t for g in _graphs(out.graph) for t in g.initializer if t.name not in fed}
    taken = set(stored) | {o for n in nodes for o in n.output}
    for name in {name for ops in chosen.values() for name in ops if name}:
        stored[name].CopyFrom(numpy_helper.from_array((numpy_helper.to_array(stored[name]).astype(np.int16) + 128).astype(np.uint8), name))
    for at, (weight, zero) in chosen.items():
        if zero:
            continue
        node = nodes[at]  # a missing zero point is 0: as uint8, 128 in the shape of the weight's scale (outer scope: every subgraph sees it)
        z_at = WEIGHT_SLOTS[(node.domain, node.op_type)][1]
        name = fresh_name(f"{weight}_zero_point_u8", taken)
        out.graph.initializer.append(numpy_helper.from_array(np.full(_zero_point_shape(node, stored), 128, np.uint8), name))
        node.input.extend([""] * (z_at + 1 - len(node.input)))
        node.input[z_at] = name
    return out


def _can_saturate(weight: onnx.TensorProto) -> bool:
    """Whether two u8 x s8 products of `weight` can leave int16: 255 * (|w0| + |w1|) > 32767 needs some |w| > 64, so 7-bit
    weights (ONNX Runtime's reduce_range) run as stored, in the faster u8 x s8 kernels."""
    return bool(np.abs(numpy_helper.to_array(weight).astype(np.int16)).max(initial=0) > 64)


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """`graph` and every subgraph in it (If branches, Loop and Scan bodies), depth first."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                yield from _graphs(sub)


def _nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    for g in _graphs(graph):
        yield from g.node


def _zero_point_shape(node: onnx.NodeProto, initializers: dict[str, onnx.TensorProto]) -> tuple[int, ...]:
    """The shape of the zero point `node` would take: its scale's (DequantizeLinear, DynamicQuantizeMatMul), else a scalar."""
    scale_at = {"DequantizeLinear": 1, "DynamicQuantizeMatMul": 2}.get(node.op_type)
    if scale_at is not None and len(node.input) > scale_at and node.input[scale_at] in initializers:
        return tuple(initializers[node.input[scale_at]].dims)
    return ()
