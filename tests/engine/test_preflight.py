"""Pre-flight: every node native, plugin or function body; offenders listed with the fix.

Also pins a TensorRT parser behaviour deployfuse works around: the parser ignores the ONNX
function `overload` field, so overloads get their own names before parsing.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from deployfuse.engine import build_engine
from deployfuse.engine.preflight import check_nodes, split_overloads
from deployfuse.errors import UsageError


def _bias_act_model(overloads: list[tuple[str, str]], wanted: str) -> onnx.ModelProto:
    """One deployfuse.BiasAct node asking for overload `wanted`; functions listed in `overloads` order."""
    functions = []
    for overload, op in overloads:
        f = helper.make_function("deployfuse", "BiasAct", ["x", "b"], ["y"], [helper.make_node("Add", ["x", "b"], ["t"]), helper.make_node(op, ["t"], ["y"])],
                                 [helper.make_opsetid("", 20)])
        f.overload = overload
        functions.append(f)
    node = helper.make_node("BiasAct", ["x", "b"], ["y"], domain="deployfuse", name="bias_act_0")
    node.overload = wanted
    bias = onnx.numpy_helper.from_array(np.linspace(-1, 1, 8, dtype=np.float32), "b")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], [bias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("deployfuse", 1)], functions=functions, ir_version=10)
    onnx.checker.check_model(model)
    return model


def _trt_activations(model: onnx.ModelProto) -> list[str]:
    from deployfuse.engine.builders import activate

    trt = activate("tensorrt-rtx")
    logger = trt.Logger(trt.Logger.ERROR)
    network = trt.Builder(logger).create_network(0)
    parser = trt.OnnxParser(network, logger)
    assert parser.parse(model.SerializeToString())
    layers = [network.get_layer(i) for i in range(network.num_layers)]
    out = []
    for layer in layers:
        if layer.type == trt.LayerType.ACTIVATION:
            layer.__class__ = trt.IActivationLayer
            out.append(layer.type.name)
    return out


@pytest.mark.parametrize("order", [0, 1])
def test_overloads_get_their_own_names(order):
    overloads = [("relu", "Relu"), ("sigmoid", "Sigmoid")][:: 1 if order == 0 else -1]
    model = _bias_act_model(overloads, "sigmoid")
    x = np.random.default_rng().standard_normal((3, 8), dtype=np.float32)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    before = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert split_overloads(model, plugins=set())
    after = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(after, before, rtol=1e-6)  # the rename keeps the math
    assert _trt_activations(model) == ["SIGMOID"]  # and TensorRT now inlines the right body


def test_a_plugin_keeps_the_op_name():
    model = _bias_act_model([("relu", "Relu"), ("sigmoid", "Sigmoid")], "sigmoid")
    split_overloads(model, plugins={("BiasAct", "deployfuse")})
    assert model.graph.node[0].op_type == "BiasAct"
    assert check_nodes(model, lambda op: True, {("BiasAct", "deployfuse")}).plugin == {"deployfuse.BiasAct": 1}


def test_ort_contrib_ops_are_offenders(bert_onnx, tmp_path, cli):
    """A BERT fused for ONNX Runtime (onnxscript's ort_fusions) cannot become an engine."""
    import onnx_ir as ir
    from onnxscript.rewriter import ort_fusions

    fused, _ = ort_fusions.optimize_for_ort(ir.load(bert_onnx))
    path = tmp_path / "bert_ort.onnx"
    ir.save(fused, path)
    code, _, err = cli("build", path, "-o", tmp_path / "e.plan", "--profile", "input_ids:1x8:2x16:4x32", "--compute-capability", "8.9", "-q")
    assert code == 2
    assert "com.microsoft.SkipLayerNormalization x" in err and "export with --target tensorrt" in err
    assert not (tmp_path / "e.plan").exists()


def test_unknown_custom_op_names_node_and_fix(tmp_path):
    model = _bias_act_model([("relu", "Relu")], "relu")
    del model.functions[:]
    model.graph.node[0].overload = ""
    onnx.save(model, tmp_path / "m.onnx")
    with pytest.raises(UsageError, match=r"deployfuse.BiasAct x1 \(bias_act_0\): no plugin named 'BiasAct'.*--plugins LIB"):
        build_engine(tmp_path / "m.onnx", tmp_path / "m.plan", compute_capability="8.9", profiles=(), deployfuse_plugins=False)
    assert not (tmp_path / "m.plan").exists()


def test_function_bodies_build_without_plugins(tmp_path):
    model = _bias_act_model([("relu", "Relu"), ("sigmoid", "Sigmoid")], "sigmoid")
    onnx.save(model, tmp_path / "m.onnx")
    from deployfuse.engine import ShapeProfile

    result = build_engine(tmp_path / "m.onnx", tmp_path / "m.plan", compute_capability="8.9", profiles=[ShapeProfile.parse("x:1x8:4x8:16x8")], deployfuse_plugins=False)
    assert result.preflight.function == {"deployfuse.BiasAct__sigmoid": 1}
    assert result.size_bytes == (tmp_path / "m.plan").stat().st_size > 0
