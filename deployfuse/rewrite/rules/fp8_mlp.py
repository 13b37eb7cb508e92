"""FP8 MLP: two chained Fp8GemmAct -> deployfuse.Fp8Mlp (ort-cuda), the hidden activation kept in float8.

    FC2(FC1(x))  =  Fp8GemmAct(Fp8GemmAct(x, sx, W1, s1, b1, act), sh, W2, s2, b2)
                ->  Fp8Mlp(x, sx, W1, s1, b1, sh, W2, s2, b2, act)

FC1 writes [tokens, N1] in fp16 and FC2 reads it back to quantize it with its XScale sh; Fp8Mlp's
FC1 writes it in float8 with that scale directly (cuBLASLt's D scale), one byte an element and no
quantize pass: in BERT-base at batch 64 on an H200, ~20 us of quantize pass and ~25 MB of fp16
traffic per layer. Its hidden activation is FC1's float32 result quantized, where the pair rounds it
to fp16 first: a value near a float8 rounding midpoint can land on the other side (a float8 step),
the same kind of difference as any fp16 rounding upstream of a quantizer.

The pair merges when FC2's X is FC1's output, directly or through Reshapes that keep the last axis
(GPT-2's Conv1D views [B, S, N1] back to [B·S, N1]), nothing else reads FC1's output or the
Reshapes', FC2 has no activation, both share fast_accum and take the heuristic's algorithm
(`--autotune` picks Fp8Mlp's algo1/algo2 afterwards, on the final artefact), and N1 is a multiple
of 16 (H's rows in float8, as the CUDA kernel needs them). Where Reshapes sat in between, Y is
reshaped to FC2's output: the shape of the Reshape feeding FC2 (constant), with N2 for N1.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from deployfuse.ops.defs import fp8_gemm_act
from deployfuse.targets import DEPLOYFUSE

_FC = fp8_gemm_act.SPEC


def _attr(node: onnx.NodeProto, name: str) -> object:
    return _FC.node_attrs(node)[name]


class _Graph:
    """The nodes of one graph by index, with the producer and readers of each value, and its constants."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.nodes = list(graph.node)
        self.producer = {o: i for i, n in enumerate(self.nodes) for o in n.output}
        self.readers: dict[str, list[int]] = {}
        for i, n in enumerate(self.nodes):
            for name in n.input:
                self.readers.setdefault(name, []).append(i)
        self.outputs = {o.name for o in graph.output}
        self.initializers = {t.name: t for t in graph.initializer}
        self.info = {v.name: v for v in (*graph.value_info, *graph.output)}

    def const(self, name: str) -> np.ndarray | None:
        if name in self.initializers:
            return numpy_helper.to_array(self.initializers[name])
        node = self.node_of(name)
        if node is not None and node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            return numpy_helper.to_array(node.attribute[0].t)
        return None

    def last_dim(self, value: str) -> int | None:
        """The static size of the value's last axis where shape inference recorded one."""
        info = self.info.get(value)
        dims = info.type.tensor_type.shape.dim if info is not None else ()
        return dims[-1].dim_value if dims and dims[-1].HasField("dim_value") else None

    def node_of(self, value: str) -> onnx.NodeProto | None:
        return self.nodes[self.producer[value]] if value in self.producer else None

    def only_reader(self, value: str, reader: int) -> bool:
        return value not in self.outputs and self.readers.get(value) == [reader]

    def is_fc(self, index: int) -> bool:
        node = self.nodes[index]
        return node.domain == DEPLOYFUSE and node.op_type == _FC.name


def _pair(g: _Graph, fc2: int) -> tuple[int, list[int], np.ndarray | None] | None:
    """(FC1, the Reshapes between, the last one's shape) as node indices when FC2 merges with the Fp8GemmAct feeding it."""
    node = g.nodes[fc2]
    if _attr(node, "activation") != "none" or _attr(node, "algo") != -1:
        return None
    x, reshapes, reader = node.input[0], [], fc2
    while x in g.producer and g.nodes[g.producer[x]].op_type == "Reshape" and g.nodes[g.producer[x]].domain in ("", "ai.onnx"):
        if not g.only_reader(x, reader):
            return None
        reader = g.producer[x]
        reshapes.append(reader)
        x = g.nodes[reader].input[0]
    fc1 = g.producer.get(x)
    if fc1 is None or not g.is_fc(fc1) or not g.only_reader(x, reader):
        return None
    first = g.nodes[fc1]
    if _attr(first, "algo") != -1 or _attr(first, "fast_accum") != _attr(node, "fast_accum"):
        return None
    w1 = g.const(first.input[2])
    n1 = None if w1 is None or w1.ndim != 2 else int(w1.shape[0])
    if n1 is None or n1 % 16 != 0:
        return None
    shapes = [g.const(g.nodes[r].input[1]) for r in reshapes]
    shape = shapes[0] if shapes else None  # the Reshape feeding FC2: constant, N1 last, no 0 (copy) entry, so Y's can say N2 instead
    if reshapes and (shape is None or shape.ndim != 1 or shape[-1] != n1 or (shape == 0).any()):
        return None
    if any((s is None or s.ndim != 1 or s[-1] != n1) and g.last_dim(g.nodes[r].output[0]) != n1 for r, s in zip(reshapes[1:], shapes[1:])):
        return None  # the others keep N1 last: a constant shape says so, or shape inference (GPT-2's dynamic [B, S, N1])
    return fc1, reshapes, shape


def _merged(g: _Graph, model: onnx.ModelProto, fc2: int, fc1: int, reshapes: list[int], shape: np.ndarray | None) -> list[onnx.NodeProto]:
    """The Fp8Mlp node taking the pair's place [and the Reshape of its Y to FC2's output shape, its shape added as an initializer]."""
    first, second = g.nodes[fc1], g.nodes[fc2]
    name = f"{first.name}_mlp"
    y = second.output[0] if not reshapes else f"{name}_y"
    attrs = {"activation": _attr(first, "activation"), "fast_accum": _attr(first, "fast_accum")}
    new = [helper.make_node("Fp8Mlp", [*first.input[:5], *second.input[1:5]], [y], name=name, domain=DEPLOYFUSE, **attrs)]
    if reshapes:
        assert shape is not None
        n2 = int(np.asarray(g.const(second.input[2])).shape[0])
        target = numpy_helper.from_array(np.concatenate([shape[:-1], [n2]]).astype(np.int64), f"{name}_shape")
        model.graph.initializer.append(target)
        new.append(helper.make_node("Reshape", [y, target.name], [second.output[0]], name=f"{name}_reshape"))
    return new


def merge(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """`model` with each mergeable Fp8GemmAct pair of its main graph replaced by one Fp8Mlp (in place), and how many.

    One pass in node order: an Fp8GemmAct already taken (FC2 of one pair, FC1 of the next in a chain) is not taken again."""
    g = _Graph(model.graph)
    pairs: dict[int, tuple[int, list[int], np.ndarray | None]] = {}  # FC2 -> its FC1, the Reshapes between, the Reshape shape
    taken: set[int] = set()
    for fc2 in range(len(g.nodes)):
        if g.is_fc(fc2) and (pair := _pair(g, fc2)) is not None and pair[0] not in taken:
            pairs[fc2] = pair
            taken |= {fc2, pair[0]}
    if not pairs:
        return model, 0
    gone = {i for fc1, reshapes, _ in pairs.values() for i in (fc1, *reshapes)}  # all before their FC2: the new nodes take FC2's place
    dropped = {o for i in gone for o in g.nodes[i].output}
    nodes = [n for i, node in enumerate(g.nodes) if i not in gone for n in (_merged(g, model, i, *pairs[i]) if i in pairs else [node])]
    info = [v for v in model.graph.value_info if v.name not in dropped]
    for field, values in ((model.graph.node, nodes), (model.graph.value_info, info)):
        del field[:]
        field.extend(values)  # copies each message
    return model, len(pairs)
