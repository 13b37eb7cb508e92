"""A tied LM head in `deployfuse export --precision int8 --target ort-cpu`: GPT2LMHeadModel multiplies
by its token embedding transposed at run time, a GEMM with no weight initializer that ONNX Runtime's
quantizer passed over (the model's largest: GPT-2's is 30 % of its multiply-adds). Stored
transposed (`qdq.untransposed_weights`) it is an int8 GEMM like the others; one the gate keeps in
fp32 reads the table through a Transpose again (`qdq.retransposed_weights`), one float copy."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import transformers
from onnx import TensorProto

import deployfuse
from deployfuse.backends.ort import run, session
from deployfuse.quantize import ort_int8
from deployfuse.quantize.qdq import retransposed_weights, untransposed_weights
from tests.quantize.test_int8_export import _fp32_error

BUDGET = (0.999, 2e-2)  # the default --accuracy-budget: cos=0.999,rel=2e-2
CONFIG = transformers.GPT2Config(vocab_size=512, n_embd=64, n_layer=2, n_head=4, n_positions=64, use_cache=False, bos_token_id=0, eos_token_id=0)
INTEGER_GEMMS = ("MatMulInteger", "DynamicQuantizeMatMul")


def _gpt2_lm() -> torch.nn.Module:
    """2 layers with the LM head tied to wte; non-zero biases and norm scales, as trained."""
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(CONFIG).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(".bias"):
                parameter.normal_(0.0, 0.02)
            elif name.endswith(".weight") and parameter.dim() == 1:
                parameter.normal_(1.0, 0.05)
    assert model.lm_head.weight is model.transformer.wte.weight
    return model


def _ids(seed: int) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.randint(0, CONFIG.vocab_size, (2, 16), generator=torch.Generator().manual_seed(seed))}


def _float_tables(model: onnx.ModelProto) -> list[str]:
    """The float initializers holding the [V, D] table, either way round."""
    size = CONFIG.vocab_size * CONFIG.n_embd
    return [t.name for t in model.graph.initializer if t.data_type == TensorProto.FLOAT and int(np.prod(t.dims)) == size]


def _table(fp32: onnx.ModelProto) -> str:
    """The table the fp32 export's head transposes at run time (the Gather reads it too)."""
    transposes = {n.output[0]: n.input[0] for n in fp32.graph.node if n.op_type == "Transpose"}
    return next(transposes[n.input[1]] for n in fp32.graph.node if n.op_type == "MatMul" and n.input[1] in transposes)


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt2_lm")
    model = _gpt2_lm()
    deployfuse.export(model, folder / "fp32.onnx", example_inputs=_ids(1), verify=False)
    result = deployfuse.export(model, folder / "int8.onnx", example_inputs=_ids(1), precision="int8", seed=0)
    return model, onnx.load(folder / "fp32.onnx"), result


def test_the_tied_head_is_an_int8_gemm_and_the_logits_stay_within_budget(exports):
    model, fp32, result = exports
    producer = {o: n for n in fp32.graph.node for o in n.output}
    assert [producer[n.input[1]].op_type for n in fp32.graph.node if n.op_type == "MatMul" and n.input[1] in producer] == ["Transpose"]  # the tied head, as exported
    int8 = onnx.load(result.onnx_path)
    gemms = 4 * CONFIG.n_layer + 1  # c_attn, attn.c_proj, c_fc, mlp.c_proj per block, and the head
    integer = [n for n in int8.graph.node if n.op_type in INTEGER_GEMMS]
    assert len(integer) == gemms and not [n for n in int8.graph.node if n.op_type in ("MatMul", "Gemm")]
    head_weights = {t.name: tuple(t.dims) for t in int8.graph.initializer if t.data_type == TensorProto.INT8}
    assert (CONFIG.n_embd, CONFIG.vocab_size) in [head_weights.get(n.input[1]) for n in integer]
    assert _float_tables(int8) == [_table(fp32)]  # the Gather's table, and the head's int8 copy beside it
    assert result.gate is not None and result.gate.passed and result.gate.quantized_layers == gemms and not result.gate.fp32_layers
    for seed in (7, 8):
        cos, rel = _fp32_error(model, result.onnx_path, _ids(seed))
        assert cos >= BUDGET[0] and 1e-5 < rel <= BUDGET[1], (seed, cos, rel)


def test_a_head_kept_in_fp32_reads_the_one_table_again(exports):
    """The dynamic quantizer with the head excluded (what the gate does to a head over budget):
    after `retransposed_weights` the artefact holds the table once and gives the same numbers."""
    _, fp32, _ = exports
    model, copies = untransposed_weights(ort_int8.gemms_as_matmuls(fp32))
    head = next(n.name for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in copies)
    quantize = ort_int8.quantizer(model)
    quantized = quantize({head})
    integer = sum(n.op_type in INTEGER_GEMMS for n in quantized.graph.node)
    assert len(_float_tables(quantized)) == 2 and integer == sum(n.op_type in INTEGER_GEMMS for n in quantize(set()).graph.node) - 1
    feed = {k: v.numpy() for k, v in _ids(9).items()}
    want = run(session(quantized), feed)
    retransposed = retransposed_weights(quantized, copies)
    assert _float_tables(retransposed) == [copies[next(iter(copies))]]
    transpose = next(n for n in retransposed.graph.node if n.op_type == "Transpose")
    assert transpose.input[0] == _table(fp32) and any(n.name == head and n.input[1] == transpose.output[0] for n in retransposed.graph.node)
    got = run(session(retransposed), feed)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)
