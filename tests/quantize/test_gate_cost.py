"""The gate weighs what each layer kept in float costs (issue 19): `layer_costs` counts a layer's
multiply-adds as PyTorch's flop counter does, `cheapest_fallbacks` keeps the passing choice of
least cost over its two searches, and on a tied-head language model that means a few cheap
layers in fp32 instead of the LM head."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
import torch
import transformers
from torch.utils.flop_counter import FlopCounterMode

import deployfuse
from deployfuse.export import flatten_outputs
from deployfuse.quantize import ort_int8
from deployfuse.quantize.calibration import random_calibration
from deployfuse.quantize.gate import Budget, cheapest_fallbacks, fallback_orders, layer_costs, measure, run_gate, table
from deployfuse.quantize.qdq import untransposed_weights


def _additive(sensitivity: dict[str, float], allowed: float):
    """A budget met when the sensitivities of the layers left quantized add up to at most
    `allowed` (the first-order model the search's order comes from), and the choices it was asked."""
    asked: list[tuple[str, frozenset[str]]] = []

    def within(search: str, kept: frozenset[str]) -> bool:
        asked.append((search, kept))
        return sum(s for name, s in sensitivity.items() if name not in kept) <= allowed

    return within, asked


def _ranking(sensitivity: dict[str, float]) -> list[tuple[str, float]]:
    return sorted(sensitivity.items(), key=lambda item: -item[1])


def _cheapest_by_brute_force(sensitivity: dict[str, float], costs: dict[str, float], allowed: float) -> float:
    names = list(sensitivity)
    return min(sum(costs[n] for n in kept) for r in range(len(names) + 1) for kept in itertools.combinations(names, r)
               if sum(sensitivity[n] for n in names if n not in kept) <= allowed)


def test_cheap_layers_go_back_instead_of_one_expensive_layer():
    sensitivity = {"head": 1.0, **{f"layer{i}": 0.25 for i in range(8)}}  # 3.0 in all, 2.0 of it must go
    costs = {"head": 7.0, **{f"layer{i}": 1.0 for i in range(8)}}
    within, asked = _additive(sensitivity, 1.0)
    found = cheapest_fallbacks(fallback_orders(_ranking(sensitivity), costs), costs, within, bound=6)
    assert [f.search for f in found] == ["sensitivity per cost", "sensitivity"]
    assert found[0].cost == _cheapest_by_brute_force(sensitivity, costs, 1.0) < found[1].cost
    assert "head" not in found[0].layers and found[1].layers[0] == "head"
    assert len(asked) == len(set(asked))  # no choice measured twice


def test_one_sensitive_layer_beats_the_per_cost_order_and_bounds_its_search():
    """The per-cost order's prefixes can all miss where one dear layer holds most of the error:
    the sensitivity order's choice wins, and the per-cost search measures nothing dearer."""
    sensitivity, costs = {"big": 1.0, "a": 0.125, "b": 0.125}, {"big": 10.0, "a": 1.0, "b": 1.0}
    within, asked = _additive(sensitivity, 0.25)
    orders = fallback_orders(_ranking(sensitivity), costs)
    assert [order for _, order in orders] == [["big", "a", "b"], ["a", "b", "big"]]
    found = cheapest_fallbacks(orders, costs, within, bound=4)
    assert [(f.search, f.layers, f.cost) for f in found] == [("sensitivity", ("big",), 10.0)]
    assert max(sum(costs[n] for n in kept) for search, kept in asked if search == "sensitivity per cost") < 10.0


def test_equal_costs_search_the_fewest_most_sensitive_layers_only():
    sensitivity = {f"layer{i}": 1.0 / (i + 1) for i in range(10)}
    costs = dict.fromkeys(sensitivity, 3.0)
    orders = fallback_orders(_ranking(sensitivity), costs)
    assert [search for search, _ in orders] == ["sensitivity"]
    within, _ = _additive(sensitivity, 1.0)
    found = cheapest_fallbacks(orders, costs, within, bound=8)
    fewest = next(k for k in range(11) if sum(sorted(sensitivity.values())[: 10 - k]) <= 1.0)
    assert len(found) == 1 and len(found[0].layers) == fewest


@pytest.mark.parametrize("seed", range(40))
def test_the_choice_passes_and_costs_at_most_one_layer_more_than_the_best(seed):
    """On random additive instances: the choice is within budget, no dearer than the sensitivity
    order's, and within the largest layer's cost of the cheapest set (the greedy bound of a
    covering knapsack: the per-cost prefix overshoots the fractional optimum by its last layer)."""
    rng = np.random.default_rng(seed)
    names = [f"layer{i}" for i in range(10)]
    sensitivity = dict(zip(names, rng.lognormal(0, 1, 10).tolist()))
    costs = dict(zip(names, rng.lognormal(0, 1.5, 10).tolist()))
    allowed = sum(sensitivity.values()) * rng.uniform(0.2, 0.8)
    within, _ = _additive(sensitivity, allowed)
    found = cheapest_fallbacks(fallback_orders(_ranking(sensitivity), costs), costs, within, bound=len(names))
    best = found[0]
    assert sum(s for n, s in sensitivity.items() if n not in best.layers) <= allowed
    assert best.cost == pytest.approx(sum(costs[n] for n in best.layers))
    assert best.cost <= next(f.cost for f in found if f.search == "sensitivity")
    assert best.cost <= _cheapest_by_brute_force(sensitivity, costs, allowed) + max(costs.values()) + 1e-9


class GroupedConvThenLinear(torch.nn.Module):
    """A strided, grouped 3x3 Conv (its positions fewer than its input's) feeding a Linear per position."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(8, 32, 3, stride=2, padding=1, groups=2)
        self.head = torch.nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv(x).flatten(2).transpose(1, 2))


def test_layer_costs_are_the_multiply_adds_torch_counts(tmp_path):
    """A Conv's cost per sample (its output positions declared), a Linear's per row: PyTorch's
    flop counter's figures over 2, per sample and per row."""
    torch.manual_seed(0)
    model, example = GroupedConvThenLinear().eval(), {"x": torch.randn(2, 8, 12, 10)}
    deployfuse.export(model, tmp_path / "m.onnx", example_inputs=example, fuse=False, verify=False)
    graph = onnx.load(tmp_path / "m.onnx")
    layers = ort_int8.layers(graph)
    costs = layer_costs(graph, layers)
    with FlopCounterMode(display=False) as counter:
        model(**example)
    flops = {name: sum(ops.values()) for name, ops in counter.get_flop_counts().items()}
    samples, rows = 2, 2 * 6 * 5
    by_op = sorted((layers[name].op_type, cost) for name, cost in costs.items())
    assert by_op == [("Conv", flops["GroupedConvThenLinear.conv"] / 2 / samples), ("MatMul", flops["GroupedConvThenLinear.head"] / 2 / rows)]


@pytest.fixture(scope="module")
def tied_lm(tmp_path_factory):
    """A tiny GPT2LMHeadModel whose tied head (64 x 4096) is most of its GEMM cost, as its int8
    export's gate sees it, with random calibration and PyTorch's outputs."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=4096, n_embd=64, n_layer=2, n_head=2, n_positions=64, use_cache=False, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config).eval()
    example = {"input_ids": torch.randint(0, config.vocab_size, (1, 16))}
    path = tmp_path_factory.mktemp("tied_lm") / "lm.onnx"
    deployfuse.export(model, path, example_inputs=example, fuse=False, verify=False)
    graph = ort_int8.gemms_as_matmuls(untransposed_weights(onnx.load(path))[0])
    calibration = random_calibration(example, model, seed=3)
    with torch.no_grad():
        references = {samples: [flatten_outputs(model(**sample)) for sample in draws]
                      for samples, draws in (("calibration", calibration.samples), ("held-out", calibration.held_out))}
    return graph, calibration, references


def test_a_tied_lm_keeps_less_gemm_cost_in_fp32_than_the_fewest_layers_do(tied_lm):
    graph, calibration, references = tied_lm
    layers, quantize = ort_int8.layers(graph), ort_int8.quantizer(graph)
    costs = layer_costs(graph, layers)
    head = max(costs, key=lambda name: costs[name])
    assert costs[head] > sum(costs.values()) / 2  # the vocabulary's GEMM outweighs the rest
    every_int8 = measure(quantize(set()), calibration, references)
    budget = Budget(cos=0.0, rel=0.8 * max(e.rel for e in every_int8))  # every layer in int8 is over it
    model, result = run_gate(quantize, layers, calibration, references, budget, lambda: ort_int8.switchboard(graph), costs=costs)
    assert result.passed and budget.score(measure(model, calibration, references)) <= 1
    kept = sum(costs[layer.node] for layer in result.fp32_layers)
    assert result.cost_share == pytest.approx(kept / sum(costs.values()), abs=1e-5)
    # the sensitivity order's search (the gate before issue 19) found fewer layers within budget, at a higher cost
    fewest = min((a for a in result.attempts if a.get("search") == "sensitivity" and a["passed"]), key=lambda a: a["fp32_layers"])
    assert result.search == "sensitivity per cost" and head not in {layer.node for layer in result.fp32_layers}
    assert result.cost_share < fewest["cost_share"] and len(result.fp32_layers) >= fewest["fp32_layers"], (result.attempts, result.fp32_layers)
    assert result.to_dict()["fp32_cost_share"] == result.cost_share
    assert f"GEMM cost kept in fp32: {100 * result.cost_share:.1f} %" in table(result)
