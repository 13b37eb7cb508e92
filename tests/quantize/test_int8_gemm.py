"""Gemms in `deployfuse export --precision int8 --target ort-cpu`: GPT-2's Conv1D layers (torch
addmm, exported as Gemm) become int8 GEMMs like any MatMul (`ort_int8.gemms_as_matmuls`), the
rewrite is exact, and a Gemm it cannot take stays fp32 without failing the export."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import transformers
from onnx import TensorProto, helper, numpy_helper
from transformers.pytorch_utils import Conv1D

import deployfuse
from deployfuse.backends.ort import run, session
from deployfuse.quantize import ort_int8
from tests.quantize.test_int8_export import _fp32_error

BUDGET = (0.999, 2e-2)  # the default --accuracy-budget: cos=0.999,rel=2e-2


def _gpt2() -> torch.nn.Module:
    """2 layers from GPT2Config, random weights with non-zero biases (a zero one is dropped from the Gemm)."""
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=512, n_embd=64, n_layer=2, n_head=4, n_positions=128, use_cache=False, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2Model(cfg).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(".bias"):
                parameter.normal_(0.0, 0.02)
    return model


def _ids(seed: int) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(seed))}


@pytest.fixture(scope="module")
def gpt2_exports(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt2")
    model = _gpt2()
    deployfuse.export(model, folder / "fp32.onnx", example_inputs=_ids(1), fuse=False, verify=False)
    result = deployfuse.export(model, folder / "int8.onnx", example_inputs=_ids(1), precision="int8", seed=0)
    return model, onnx.load(folder / "fp32.onnx"), result


def test_every_conv1d_of_gpt2_is_an_int8_gemm(gpt2_exports):
    model, fp32, result = gpt2_exports
    conv1d = [name for name, module in model.named_modules() if isinstance(module, Conv1D)]
    gemm_weights = sorted(n.input[1] for n in fp32.graph.node if n.op_type == "Gemm")
    assert gemm_weights == sorted(f"{name}.weight" for name in conv1d) and len(conv1d) == 8
    int8 = onnx.load(result.onnx_path)
    assert not [n.name for n in int8.graph.node if n.op_type == "Gemm"]
    int8_weights = {t.name for t in int8.graph.initializer if t.data_type == TensorProto.INT8}
    integer_gemms = {n.input[1] for n in int8.graph.node if n.op_type in ("MatMulInteger", "DynamicQuantizeMatMul")}
    assert {f"{w}_quantized" for w in gemm_weights} <= int8_weights & integer_gemms
    assert result.gate is not None and result.gate.quantized_layers == len(conv1d) and not result.gate.fp32_layers


def test_int8_gpt2_stays_within_the_default_budget_on_fresh_inputs(gpt2_exports):
    model, _, result = gpt2_exports
    for seed in (7, 8):
        cos, rel = _fp32_error(model, result.onnx_path, _ids(seed))
        assert cos >= BUDGET[0] and rel <= BUDGET[1], (seed, cos, rel)
        assert rel > 1e-5  # int8, not an fp32 graph that happens to pass


def test_the_rewritten_gemms_are_switchable_by_their_names(gpt2_exports):
    _, fp32, _ = gpt2_exports
    board = ort_int8.switchboard(ort_int8.gemms_as_matmuls(fp32))
    assert board is not None
    assert sorted(board.switches) == sorted(n.name for n in fp32.graph.node if n.op_type == "Gemm")


def _gemm_model() -> onnx.ModelProto:
    """Gemms of every kind on x (4, 6): plain with a bias row, transB with a (1, N) bias (its
    weight also read by a Transpose), no bias, transA=1, a weight fed at run time, alpha != 1."""
    rng = np.random.default_rng(0)
    weights = {"w": rng.standard_normal((6, 5)), "wt": rng.standard_normal((5, 6)), "w2": rng.standard_normal((6, 6)),
               "wa": rng.standard_normal((4, 3)), "b": rng.standard_normal(5), "b2": rng.standard_normal((1, 5))}
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["plain"], name="plain"),
             helper.make_node("Gemm", ["x", "wt", "b2"], ["trans_b"], name="trans_b", transB=1),
             helper.make_node("Gemm", ["x", "w2"], ["no_bias"], name="no_bias"),
             helper.make_node("Transpose", ["wt"], ["wt_read"], name="reads_wt"),
             helper.make_node("Gemm", ["x", "wa"], ["trans_a"], name="trans_a", transA=1),
             helper.make_node("Gemm", ["x", "y", "b"], ["fed_weight"], name="fed_weight"),
             helper.make_node("Gemm", ["x", "w", "b"], ["scaled"], name="scaled", alpha=0.5)]
    outputs = {"plain": [4, 5], "trans_b": [4, 5], "no_bias": [4, 6], "wt_read": [6, 5], "trans_a": [6, 3], "fed_weight": [4, 5], "scaled": [4, 5]}
    graph = helper.make_graph(nodes, "gemms", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6]), helper.make_tensor_value_info("y", TensorProto.FLOAT, [6, 5])],
                              [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in outputs.items()],
                              [numpy_helper.from_array(value.astype(np.float32), name) for name, value in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def test_gemms_as_matmuls_rewrites_only_plain_weight_gemms_and_is_exact():
    model = _gemm_model()
    rewritten = ort_int8.gemms_as_matmuls(model)
    onnx.checker.check_model(rewritten)
    kinds = {n.name: n.op_type for n in rewritten.graph.node}
    assert {name: kinds[name] for name in ("plain", "trans_b", "no_bias", "trans_a", "fed_weight", "scaled")} == {
        "plain": "MatMul", "trans_b": "MatMul", "no_bias": "MatMul", "trans_a": "Gemm", "fed_weight": "Gemm", "scaled": "Gemm"}
    assert model.graph.node[0].op_type == "Gemm"  # the model given is left as it is
    rng = np.random.default_rng(1)
    feed = {"x": rng.standard_normal((4, 6)).astype(np.float32), "y": rng.standard_normal((6, 5)).astype(np.float32)}
    want = run(session(model, optimize=False), feed)
    got = run(session(rewritten, optimize=False), feed)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-6, atol=1e-6, err_msg=name)
    assert {t.name for t in rewritten.graph.initializer} == {"w", "wt", "wt_transposed", "w2", "wa", "b", "b2"}
    del model.graph.node[3], model.graph.output[3]  # without the Transpose, nothing reads wt as it was stored
    assert "wt" not in {t.name for t in ort_int8.gemms_as_matmuls(model).graph.initializer}


def test_a_graph_without_a_rewritable_gemm_is_unchanged():
    model = _gemm_model()
    del model.graph.node[:4]
    del model.graph.output[:4]
    assert ort_int8.gemms_as_matmuls(model).SerializeToString() == model.SerializeToString()


class _FedWeight(torch.nn.Module):
    """A Gemm whose weight is an input (cannot be int8 ahead of time) beside a Linear that can."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.randn(8) * 0.1)
        self.head = torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x, y) + self.head(x)


def test_a_gemm_with_a_fed_weight_stays_fp32_and_the_export_passes(tmp_path):
    torch.manual_seed(0)
    model = _FedWeight().eval()
    example = {"x": torch.randn(4, 16), "y": torch.randn(16, 8)}
    result = deployfuse.export(model, tmp_path / "fed.onnx", example_inputs=example, precision="int8", accuracy_budget="cos=0.99,rel=0.1", seed=0)
    graph = onnx.load(result.onnx_path)
    reading_y = [n.op_type for n in graph.graph.node if "y" in n.input]  # ORT's quantizer makes the fp32 Gemm a MatMul + Add
    assert reading_y in (["Gemm"], ["MatMul"])
    assert any(n.op_type in ("MatMulInteger", "DynamicQuantizeMatMul") and n.input[1] == "head.weight_transposed_quantized" for n in graph.graph.node)
    assert result.gate is not None and result.gate.passed and result.gate.quantized_layers == 1
    fresh = {"x": torch.randn(4, 16), "y": torch.randn(16, 8)}
    cos, rel = _fp32_error(model, result.onnx_path, fresh)
    assert cos >= 0.99 and 1e-5 < rel <= 0.1, (cos, rel)
