"""`--accuracy-budget ...,batch=N`: the gate also runs its samples N at a time as one batch, so a
quantized model whose error depends on the batch (dynamic int8: one activation scale over the whole
batch) is judged as it will run, each sample's rows against its own reference; where the samples
cannot form one batch, or without batch=, nothing is added."""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from deployfuse.quantize import ort_int8
from deployfuse.quantize.calibration import Calibration
from deployfuse.quantize.gate import Budget, measure


def _linear(batch: int | str) -> tuple[onnx.ModelProto, np.ndarray]:
    """y = x · W, x [batch, 64], W a random [64, 32], as an fp32 ONNX model."""
    weight = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32) / 8
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="proj")], "linear",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 32])], [numpy_helper.from_array(weight, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), weight


def _calibration(weight: np.ndarray, seed: int) -> tuple[Calibration, dict[str, list[dict[str, torch.Tensor]]]]:
    """Two calibration and two held-out rows of fresh random values, one of each 1000x larger
    than the other, and their fp32 outputs."""
    rng = np.random.default_rng(seed)
    rows = [rng.standard_normal((1, 64)).astype(np.float32) * scale for scale in (1e-3, 1.0, 1e-3, 1.0)]
    samples = [{"x": torch.from_numpy(r)} for r in rows]
    refs = [{"y": torch.from_numpy(r @ weight)} for r in rows]
    return Calibration(samples[:2], samples[2:], "test rows"), {"calibration": refs[:2], "held-out": refs[2:]}


def test_dynamic_int8_is_judged_in_one_batch_as_it_runs():
    """Alone, each row gets its own activation scale and is close; in one batch the small rows
    are quantized on the large rows' scale and lose most of their digits."""
    model, weight = _linear("batch")
    quantized = ort_int8.quantizer(model)(set())
    assert any(n.op_type.startswith("DynamicQuantize") or n.op_type == "MatMulInteger" for n in quantized.graph.node)
    calibration, references = _calibration(weight, seed=1)
    budget = Budget.parse("cos=0.999,rel=2e-2,batch=4")
    assert {e.samples for e in measure(quantized, calibration, references)} == {"calibration", "held-out"}  # no batch=: one at a time
    errors = {e.samples: e for e in measure(quantized, calibration, references, batch=budget.batch)}
    assert set(errors) == {"calibration", "held-out", "batched"}
    assert not budget.exceeded(errors["calibration"]) and not budget.exceeded(errors["held-out"])
    assert budget.exceeded(errors["batched"]), errors["batched"]
    assert errors["batched"].rel > 10 * max(errors["calibration"].rel, errors["held-out"].rel)


def test_the_float_model_in_one_batch_is_the_float_model():
    """The batched rows are each sample's own outputs: an unquantized model measures ~0 there."""
    model, weight = _linear("batch")
    calibration, references = _calibration(weight, seed=2)
    batched = next(e for e in measure(model, calibration, references, batch=3) if e.samples == "batched")
    assert batched.rel < 1e-5 and batched.cos > 1 - 1e-6


def test_a_last_sample_left_alone_is_no_failed_batch(caplog):
    """Four samples at batch=3: the first three run as one batch; the fourth, alone, is its own
    one-at-a-time run, not a batch that failed to form (no warning)."""
    model, weight = _linear("batch")
    calibration, references = _calibration(weight, seed=4)
    with caplog.at_level("WARNING", logger="deployfuse.quantize.gate"):
        samples = {e.samples for e in measure(model, calibration, references, batch=3)}
    assert samples == {"calibration", "held-out", "batched"} and not caplog.records, caplog.records


def test_no_batch_where_the_model_fixes_its_batch_axis(caplog):
    model, weight = _linear(1)
    calibration, references = _calibration(weight, seed=3)
    with caplog.at_level("WARNING", logger="deployfuse.quantize.gate"):
        assert {e.samples for e in measure(model, calibration, references, batch=4)} == {"calibration", "held-out"}
    assert "cannot run as one batch" in caplog.text  # the user asked for batch=4: say why it is not judged


def test_the_gate_says_once_that_its_samples_cannot_form_a_batch(caplog):
    """A gate that measures several times (here: every layer int8 over a budget no int8 meets,
    then the layer back in fp32) warns about an unbatchable batch= once, and stops trying."""
    from deployfuse.quantize.gate import run_gate

    model, weight = _linear(1)
    calibration, references = _calibration(weight, seed=4)
    with caplog.at_level("WARNING", logger="deployfuse.quantize.gate"):
        _, result = run_gate(ort_int8.quantizer(model), ort_int8.layers(model), calibration, references, Budget.parse("rel=1e-6,batch=4"))
    assert result.passed and [a["passed"] for a in result.attempts if a["model"] == "artefact"] == [False, True]
    assert caplog.text.count("cannot run as one batch") == 1


def test_the_budget_carries_its_batch():
    budget = Budget.parse("rel=2e-2, batch=8")
    assert budget.batch == 8 and Budget.parse(budget.text()) == budget == Budget.from_dict(budget.to_dict())
    assert "batch" not in Budget.parse("cos=0.999").text()


def test_an_int8_export_judged_at_a_batch_records_it(tmp_path):
    """Through `deployfuse.export`: the budget's batch reaches every measurement (the report's
    errors have "batched" rows) and the artefact records it for `deployfuse compare`."""
    import json

    import deployfuse
    from deployfuse import metadata
    from deployfuse.examples.tiny_bert import build
    from deployfuse.inputs import DynamicAxis

    model, example = build()
    deployfuse.export(model, tmp_path / "bert.onnx", example_inputs=example, dynamic=[DynamicAxis(name, 0, "batch") for name in example],
                      precision="int8", accuracy_budget="cos=0.99,rel=0.1,batch=6", report_path=tmp_path / "report.json", seed=0)
    gate = json.loads((tmp_path / "report.json").read_text())["quantization"]["gate"]
    assert gate["budget"]["batch"] == 6 and gate["passed"]
    assert {e["samples"] for e in gate["errors"]} == {"calibration", "held-out", "batched"}
    assert metadata.read(onnx.load(tmp_path / "bert.onnx", load_external_data=False), metadata.ACCURACY_BUDGET)["batch"] == 6  # type: ignore[index]
