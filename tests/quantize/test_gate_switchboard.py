"""The gate's switchboard: one ONNX Runtime session that runs any choice of layers in dynamic int8
gives the numbers of the artefact ONNX Runtime's quantizer makes for that choice, so the gate can
rank and search on it instead of quantizing once per choice."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

import deployfuse
from deployfuse.backends.ort import run, session
from deployfuse.examples.tiny_bert import build
from deployfuse.export import flatten_outputs
from deployfuse.inputs import make_inputs, specs_of
from deployfuse.quantize import ort_int8
from deployfuse.quantize.calibration import random_calibration
from deployfuse.quantize.gate import Budget, GateFailed, measure, run_gate, sensitivity_ranking
from deployfuse.quantize.ort_int8 import SKIPPED_FAMILIES
from deployfuse.quantize.rounding import int8_per_column, rounded_weights
from deployfuse.rewrite.fuser import family_names, fuse


@pytest.fixture(scope="module")
def fused_bert(tmp_path_factory):
    """Tiny BERT fused for ort-cpu as an int8 export fuses it, with fresh inputs and PyTorch's outputs."""
    model, example = build()
    path = tmp_path_factory.mktemp("switchboard") / "bert.onnx"
    deployfuse.export(model, path, example_inputs=example, fuse=False, verify=False)
    feed = {k: v.numpy() for k, v in example.items()}
    fused, _ = fuse(onnx.load(path), "ort-cpu", [feed], families=[f for f in family_names() if f not in SKIPPED_FAMILIES])
    return model, example, fused


def _outputs(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> np.ndarray:
    return next(iter(run(session(model), feed).values()))


@pytest.mark.parametrize("rounding", ["nearest", "gptq"])
def test_switchboard_runs_any_choice_as_the_quantized_artefact_does(fused_bert, rounding):
    model, example, fused = fused_bert
    layers = list(ort_int8.layers(fused))
    weights = None
    if rounding == "gptq":  # the artefact gets these integers in place of ONNX Runtime's, and so does the switchboard
        weights = rounded_weights(fused, ort_int8.layers(fused), random_calibration(example, model, seed=5).feeds())
        nearest = {name: int8_per_column(numpy_helper.to_array(w))[0] for name, w in ((t.name, t) for t in fused.graph.initializer) if name in weights}
        assert all((weights[name][0] != q).any() for name, q in nearest.items())
    board = ort_int8.switchboard(fused, weights)
    assert board is not None
    assert sorted(board.switches) == sorted(layers) and len(layers) >= 6
    quantize = ort_int8.quantizer(fused, weights)
    feed = {k: v.numpy() for k, v in make_inputs(specs_of(example), model, seed=11, pad_masks=True).items()}
    with torch.no_grad():
        reference = next(iter(flatten_outputs(model(**{k: torch.from_numpy(v) for k, v in feed.items()})).values())).numpy()
    fp32 = _outputs(fused, feed)
    for quantized in (set(layers), set(layers[1::2]), {layers[-1]}, set()):
        want = _outputs(quantize(set(layers) - quantized), feed)
        got = _outputs(board.model, {**feed, **board.feed(quantized)})
        scale = np.abs(reference).max()
        assert np.abs(got - want).max() <= 1e-5 * scale, sorted(quantized)  # the artefact's numbers, not merely close to fp32
        if quantized:
            assert np.abs(got - fp32).max() >= 1e-4 * scale  # int8 where switched on
        else:
            np.testing.assert_array_equal(want, fp32)  # every layer kept in fp32 is the fp32 graph, not "quantize all"


def _refused(fp32_layers: set[str]) -> onnx.ModelProto:
    raise AssertionError(f"quantized for real with {len(fp32_layers)} layers in fp32: every layer has a switch")


def test_switchboard_ranks_layers_as_quantizing_each_alone_does(fused_bert):
    model, example, fused = fused_bert
    calibration = random_calibration(example, model, seed=5)
    with torch.no_grad():
        references = {"calibration": [flatten_outputs(model(**sample)) for sample in calibration.samples[:2]]}
    layers = ort_int8.layers(fused)
    board = ort_int8.switchboard(fused)
    assert board is not None
    by_quantizer = dict(sensitivity_ranking(ort_int8.quantizer(fused), layers, calibration, references, Budget()))
    by_board = dict(sensitivity_ranking(_refused, layers, calibration, references, Budget(), board))
    assert by_board.keys() == by_quantizer.keys()
    for name, score in by_quantizer.items():
        assert by_board[name] == pytest.approx(score, rel=1e-3, abs=1e-6), name
    assert len(set(np.round(list(by_board.values()), 3))) > 1  # the layers differ: the ranking is not a tie


class ConvThenMlp(torch.nn.Module):
    """A Conv (no switch: ConvInteger) feeding two MatMuls (switched)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(8, 32, 3, padding=1)
        self.up, self.down = torch.nn.Linear(32, 64), torch.nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(self.conv(x).transpose(1, 2))))


@pytest.fixture(scope="module")
def conv_then_mlp(tmp_path_factory):
    """ConvThenMlp's plain export, random calibration, and PyTorch's outputs on every sample."""
    torch.manual_seed(0)
    model, example = ConvThenMlp().eval(), {"x": torch.randn(2, 8, 24)}
    path = tmp_path_factory.mktemp("conv_then_mlp") / "m.onnx"
    deployfuse.export(model, path, example_inputs=example, fuse=False, verify=False)
    calibration = random_calibration(example, model, seed=3)
    with torch.no_grad():
        references = {samples: [flatten_outputs(model(**sample)) for sample in draws]
                      for samples, draws in (("calibration", calibration.samples), ("held-out", calibration.held_out))}
    return onnx.load(path), calibration, references


def test_layers_without_a_switch_are_ranked_on_the_artefact(conv_then_mlp):
    graph, calibration, references = conv_then_mlp
    layers = ort_int8.layers(graph)
    board = ort_int8.switchboard(graph)
    assert board is not None
    assert sorted(n.op_type for n in layers.values()) == ["Conv", "MatMul", "MatMul"]
    assert sorted(layers[name].op_type for name in board.switches) == ["MatMul", "MatMul"]
    quantize = ort_int8.quantizer(graph)
    by_quantizer = dict(sensitivity_ranking(quantize, layers, calibration, references, Budget()))
    quantized_for_real: list[set[str]] = []

    def counted(fp32_layers: set[str]) -> onnx.ModelProto:
        quantized_for_real.append(fp32_layers)
        return quantize(fp32_layers)

    by_board = dict(sensitivity_ranking(counted, layers, calibration, references, Budget(), board))
    for name, score in by_quantizer.items():
        assert by_board[name] == pytest.approx(score, rel=1e-3, abs=1e-6), (layers[name].op_type, by_board[name], score)
    conv = next(name for name, node in layers.items() if node.op_type == "Conv")
    assert by_board[conv] > 0  # measured quantized on the artefact, not read off the switchboard (where it is fp32)
    assert quantized_for_real == [set(layers) - {conv}]  # the MatMuls were read off the switchboard


def test_an_artefact_over_what_the_switchboard_found_gets_one_layer_more_at_a_time(conv_then_mlp):
    """The switchboard runs the Conv in fp32, so the count its search finds can leave the artefact
    (Conv in int8) over budget: the gate then adds layers one at a time, as it does without one."""
    graph, calibration, references = conv_then_mlp
    layers, quantize, board = ort_int8.layers(graph), ort_int8.quantizer(graph), ort_int8.switchboard(graph)
    assert board is not None
    order = [name for name, _ in sensitivity_ranking(quantize, layers, calibration, references, Budget())]
    on_artefact = [max(e.rel for e in measure(quantize(set(order[:count])), calibration, references)) for count in range(3)]
    on_board = max(e.rel for e in board.measure(set(layers) - {order[0]}, calibration, references))
    budget = Budget(cos=0.0, rel=(on_board + on_artefact[1]) / 2)  # the switchboard within with 1 layer back, the artefact not
    assert on_board < budget.rel < on_artefact[1] and on_artefact[2] <= budget.rel < on_artefact[0], (on_artefact, on_board)
    for switchboard, searched in ((lambda: board, [("switchboard", 1, True)]), (None, [])):
        _, result = run_gate(quantize, layers, calibration, references, budget, switchboard)
        assert [(a["model"], a["fp32_layers"], a["passed"]) for a in result.attempts] == [("artefact", 0, False), *searched, ("artefact", 1, False), ("artefact", 2, True)]
        assert result.passed and [layer.node for layer in result.fp32_layers] == order[:2]


def test_without_a_switchboard_the_count_is_searched_on_the_artefacts(fused_bert):
    """No switchboard (static int8 has none): the gate still doubles the count of layers back,
    on the quantized artefacts themselves, so learning that the bound is not enough takes
    1, 2, 4 layers back, not 1, 2, 3, 4 (BERT-base fp8 before its switchboard: 6 artefacts instead of 18)."""
    model, example, fused = fused_bert
    layers, quantize = ort_int8.layers(fused), ort_int8.quantizer(fused)
    assert 8 <= len(layers) < 20  # the bound is then 4
    calibration = random_calibration(example, model, seed=3)
    with torch.no_grad():
        references = {samples: [flatten_outputs(model(**sample)) for sample in draws]
                      for samples, draws in (("calibration", calibration.samples), ("held-out", calibration.held_out))}
    with pytest.raises(GateFailed, match="even with 4 of") as failed:
        run_gate(quantize, layers, calibration, references, Budget(cos=0.0, rel=1e-12))  # no graph gets this close
    assert [(a["model"], a["fp32_layers"]) for a in failed.value.result.attempts] == [("artefact", n) for n in (0, 1, 2, 4)]
