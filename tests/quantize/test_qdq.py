"""Q/DQ placement for tensorrt and ort-cuda (`deployfuse.quantize.qdq`) on a tiny BERT and ResNet-18:
where the pairs go (GEMM inputs only, never around norms, softmax or residual sums), the scales
(symmetric, per channel for int8 weights, amax / 448 for fp8 activations), the exact Q/DQ form
of a GEMM, `exclude`, and the quantized graph's outputs against PyTorch fp32."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from deployfuse.backends import ort as ort_backend
from deployfuse.compare.localize import with_outputs
from deployfuse.export import flatten_outputs
from deployfuse.inputs import make_inputs, specs_of
from deployfuse.ops.schema import E4M3_MAX
from deployfuse.quantize.qdq import place_qdq, quantizable_nodes, untransposed_weights
from tests.quantize.qdq_models import cosine, exported

QUANT_TYPE = {"int8": TensorProto.INT8, "fp8": TensorProto.FLOAT8E4M3FN}
# Worst output against PyTorch fp32 on fresh inputs: max|error| / max|reference| and cosine.
# int8 keeps 7 bits of each GEMM input, E4M3 3 mantissa bits (about 2**-4 relative per value).
TOLERANCE = {"int8": (3e-2, 0.999), "fp8": (8e-2, 0.998)}


class Graph:
    """Producers, consumers and initializers of a graph, for reading a placement."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.nodes = {n.name: n for n in model.graph.node}
        self.weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        self.types = {t.name: t.data_type for t in model.graph.initializer}
        self.producer = {o: n for n in model.graph.node for o in n.output}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in model.graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)

    def of(self, op_type: str) -> list[onnx.NodeProto]:
        return [n for n in self.model.graph.node if n.op_type == op_type]

    def dq_of(self, tensor: str) -> onnx.NodeProto | None:
        node = self.producer.get(tensor)
        return node if node is not None and node.op_type == "DequantizeLinear" else None


def _axis(node: onnx.NodeProto) -> int:
    return next((a.i for a in node.attribute if a.name == "axis"), 1)


@pytest.fixture(scope="module")
def bert():
    return exported("bert")


@pytest.fixture(scope="module")
def cnn():
    return exported("resnet18")


@pytest.mark.parametrize("precision", ["int8", "fp8"])
def test_bert_pairs_sit_on_gemm_inputs_only(bert, precision):
    model = bert.onnx
    gemms = quantizable_nodes(model, precision)
    # 2 layers x (Q, K, V, output, 2 MLP) + the pooler; the attention score and context MatMuls
    # multiply two activations and are not listed.
    assert len(gemms) == 13 and {Graph(model).nodes[name].op_type for name in gemms} == {"MatMul", "Gemm"}
    g = Graph(place_qdq(model, precision, bert.calibration, set()))
    assert len(g.of("QuantizeLinear")) == 13 and len(g.of("DequantizeLinear")) == 26  # one activation pair + one weight DQ per GEMM
    for name in gemms:
        node = g.nodes[name]
        act, weight = g.dq_of(node.input[0]), g.dq_of(node.input[1])
        assert act is not None and weight is not None, name
        assert g.producer[act.input[0]].op_type == "QuantizeLinear" and g.types[weight.input[0]] == QUANT_TYPE[precision]
        assert all(c.op_type != "QuantizeLinear" for c in g.consumers[node.output[0]])  # GEMM outputs stay float
    for dq in g.of("DequantizeLinear"):  # every dequantized tensor feeds exactly one listed GEMM, nothing else
        assert [c.name for c in g.consumers[dq.output[0]]] in ([n] for n in gemms), dq.name
    for q in g.of("QuantizeLinear"):  # what is quantized: LayerNorm, Gelu and attention outputs, never a norm's input
        assert all(c.op_type in ("QuantizeLinear", "LayerNormalization", "Add", "Mul", "Reshape", "FusedMHA", "BiasAct", "Gather", "Gemm", "MatMul")
                   for c in g.consumers[q.input[0]])
    for node in g.model.graph.node:  # norms, softmax/attention and residual sums read float tensors only
        if node.op_type in ("LayerNormalization", "Softmax", "FusedMHA", "Add", "BiasAct"):
            assert not any(g.dq_of(i) for i in node.input), f"{node.op_type} {node.name} reads a dequantized tensor"
    residual = [n for n in g.of("Add") if any(p and p.op_type == "LayerNormalization" for p in map(g.producer.get, n.input))]
    assert residual  # the residual sums reading a LayerNorm output that a GEMM reads quantized


def test_int8_scales_are_symmetric_and_per_output_channel(bert, cnn):
    for model, calibration in ((bert.onnx, bert.calibration), (cnn.onnx, cnn.calibration)):
        g = Graph(place_qdq(model, "int8", calibration, set()))
        for node in (n for n in g.model.graph.node if n.op_type in ("MatMul", "Gemm", "Conv") and g.dq_of(n.input[1])):
            dq = g.dq_of(node.input[1])
            weight, scale = g.weights[dq.input[0]], g.weights[dq.input[1]]
            trans_b = any(a.name == "transB" and a.i for a in node.attribute)
            out_axis = {"MatMul": weight.ndim - 1, "Gemm": 0 if trans_b else 1, "Conv": 0}[node.op_type]
            assert _axis(dq) == out_axis and scale.shape == (weight.shape[out_axis],), node.name
            assert not g.weights[dq.input[2]].any()
        for q in g.of("QuantizeLinear"):
            assert g.weights[q.input[1]].shape == () and g.weights[q.input[2]].dtype == np.int8 and not g.weights[q.input[2]].any()
    convs = [n for n in Graph(cnn.onnx).of("Conv")]
    assert len(quantizable_nodes(cnn.onnx, "int8")) == len(convs) + 1 and len(quantizable_nodes(cnn.onnx, "fp8")) == 1  # fp8: the Gemm head only


def test_fp8_gemm_is_e4m3_qdq_with_per_tensor_scales_and_max_calibration(bert):
    """Q(X, s_x, zp e4m3) -> DQ -> MatMul(., DQ(W e4m3 initializer, s_w)) -> Add(bias), scalar
    scales, on the unfused graph; each activation scale is amax / 448 over the calibration, rounded up to
    a power of two (so that the kernels writing float8 activations multiply by an exact 1 / s)."""
    model = exported("bert", fuse=False).onnx
    g = Graph(place_qdq(model, "fp8", bert.calibration, set()))
    matmuls = [g.nodes[n] for n in quantizable_nodes(model, "fp8") if g.nodes[n].op_type == "MatMul"]
    assert len(matmuls) == 12
    for node in matmuls:
        act, weight = g.dq_of(node.input[0]), g.dq_of(node.input[1])
        q = g.producer[act.input[0]]
        assert g.weights[q.input[1]].shape == () and g.types[q.input[2]] == TensorProto.FLOAT8E4M3FN and float(g.weights[q.input[2]]) == 0.0
        assert g.types[weight.input[0]] == TensorProto.FLOAT8E4M3FN and g.weights[weight.input[1]].shape == ()
        (add,) = g.consumers[node.output[0]]
        assert add.op_type == "Add" and any(i in g.weights and g.types[i] == TensorProto.FLOAT for i in add.input)
    sources = sorted({g.producer[g.dq_of(n.input[0]).input[0]].input[0] for n in matmuls})
    session = ort_backend.session(with_outputs(model, sources), optimize=False)
    runs = [ort_backend.run(session, feed) for feed in bert.calibration.feeds()]
    for name in sources:
        q = next(q for q in g.of("QuantizeLinear") if q.input[0] == name)
        amax = max(float(np.abs(r[name]).max()) for r in runs)
        scale, wanted = float(g.weights[q.input[1]]), amax / E4M3_MAX
        assert math.frexp(scale)[0] == 0.5, f"{name}: scale {scale} is not a power of two"
        assert scale / 2 < wanted * (1 + 1e-5) and wanted <= scale * (1 + 1e-5), f"{name}: scale {scale} is not the power of two above amax / 448 = {wanted}"


def test_exclude_keeps_those_gemms_in_float(bert):
    model = bert.onnx
    gemms = quantizable_nodes(model, "int8")
    kept = set(gemms[:3])
    g = Graph(place_qdq(model, "int8", bert.calibration, kept))
    for name in gemms:
        dequantized = [g.dq_of(i) is not None for i in g.nodes[name].input[:2]]
        assert dequantized == ([False, False] if name in kept else [True, True]), name
    assert len(g.of("QuantizeLinear")) == len(gemms) - 3
    untouched = place_qdq(model, "int8", bert.calibration, set(gemms))
    assert not Graph(untouched).of("QuantizeLinear") and len(untouched.graph.node) == len(model.graph.node)
    attention = next(n.name for n in model.graph.node if n.op_type in ("MatMul", "FusedMHA") and n.name not in gemms)
    assert len(Graph(place_qdq(model, "int8", bert.calibration, {attention})).of("QuantizeLinear")) == 13  # not quantized anyway
    with pytest.raises(ValueError, match="does not have: no_such_node"):
        place_qdq(model, "int8", bert.calibration, {"no_such_node"})


@pytest.mark.parametrize("precision", ["int8", "fp8"])
def test_calibration_is_reused_for_the_same_samples_only(bert, precision):
    """The gate quantizes one model again and again: the second call reuses the first's ranges
    (same scales for the GEMMs both quantize), other samples are calibrated afresh."""
    model = bert.onnx

    def activation_scales(quantized: onnx.ModelProto) -> dict[str, float]:
        g = Graph(quantized)
        return {c.name: float(g.weights[q.input[1]]) for q in g.of("QuantizeLinear") for dq in g.consumers[q.output[0]] for c in g.consumers[dq.output[0]]}

    first = activation_scales(place_qdq(model, precision, bert.calibration, set()))
    dropped = quantizable_nodes(model, precision)[0]
    again = activation_scales(place_qdq(model, precision, bert.calibration, {dropped}))
    assert again == {k: v for k, v in first.items() if k != dropped}
    fewer = dataclasses.replace(bert.calibration, samples=bert.calibration.samples[:1])
    other = activation_scales(place_qdq(model, precision, fewer, set()))
    assert other.keys() == first.keys() and other != first


def test_refusals(bert):
    old = bert.onnx
    next(o for o in old.opset_import if o.domain in ("", "ai.onnx")).version = 18
    with pytest.raises(ValueError, match="fp8 Q/DQ needs opset 19"):
        place_qdq(old, "fp8", bert.calibration, set())
    with pytest.raises(ValueError, match="unknown quantized precision 'int4'"):
        quantizable_nodes(bert.onnx, "int4")


@pytest.mark.parametrize("precision", ["int8", "fp8"])
@pytest.mark.parametrize(("name", "graph"), [("bert", "fp32"), ("resnet18", "fp32"), ("bert", "fp16")])
def test_quantized_graph_matches_pytorch_fp32(name, graph, precision):
    """Fresh random inputs (seeds the calibration never saw) through ORT CPU, optimisations off:
    float8 Q/DQ run there from opset 19, so fp8 is checked as it is, not simulated. An fp16
    graph gets its scales in fp16 (ONNX Runtime's quantizer writes float32 ones)."""
    model = exported(name, precision=graph)
    quantized = place_qdq(model.onnx, precision, model.calibration, set())
    g = Graph(quantized)
    scale_type = TensorProto.FLOAT16 if graph == "fp16" else TensorProto.FLOAT
    assert {g.types[n.input[1]] for n in g.of("QuantizeLinear") + g.of("DequantizeLinear")} == {scale_type}
    session = ort_backend.session(quantized, optimize=False)
    rel_budget, cos_budget = TOLERANCE[precision]
    for seed in (1001, 1002):
        inputs = make_inputs(specs_of(model.example), model.module, seed, pad_masks=seed > 1001)
        got = ort_backend.run(session, {k: v.numpy() for k, v in inputs.items()})
        with torch.inference_mode():
            expected = flatten_outputs(model.module(**inputs))
        for output, want in expected.items():
            ref, out = want.numpy(), got[output].astype(np.float32)
            rel = float(np.abs(out - ref).max() / np.abs(ref).max())
            assert rel <= rel_budget and cosine(out, ref) >= cos_budget, f"{output}: relative error {rel:.2e}, cosine {cosine(out, ref):.6f}"
            assert rel > 1e-5, f"{output} is exact: nothing was quantized"


def _tied_head() -> onnx.ModelProto:
    """A tied LM head as the exporter leaves it: the table [V, D] gathered by the ids and, transposed at run time, the head's weight."""
    rng = np.random.default_rng(3)
    table = numpy_helper.from_array(rng.standard_normal((40, 16)).astype(np.float16), "table")
    nodes = [helper.make_node("Gather", ["table", "ids"], ["h"]), helper.make_node("Transpose", ["table"], ["table_t"], perm=[1, 0]),
             helper.make_node("MatMul", ["h", "table_t"], ["logits"], name="head")]
    graph = helper.make_graph(nodes, "tied", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 5])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT16, [2, 5, 40])], [table])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)


def test_a_tied_head_weight_is_stored_transposed_and_quantizable():
    """untransposed_weights: the head reads its own [D, V] initializer (the Gather keeps the table),
    so `quantizable_nodes` finds it; the outputs are the same numbers, ORT optimisations off."""
    model = _tied_head()
    assert quantizable_nodes(model, "fp8") == []
    stored, copies = untransposed_weights(model)
    assert quantizable_nodes(stored, "fp8") == ["head"] and [n.op_type for n in stored.graph.node] == ["Gather", "MatMul"]
    assert copies == {stored.graph.node[1].input[1]: "table"}
    assert [n.op_type for n in model.graph.node] == ["Gather", "Transpose", "MatMul"]  # the input model is left as it was
    ids = {"ids": np.random.default_rng(4).integers(0, 40, (2, 5))}
    want = ort_backend.run(ort_backend.session(model, optimize=False), ids)["logits"]
    np.testing.assert_array_equal(ort_backend.run(ort_backend.session(stored, optimize=False), ids)["logits"], want)
