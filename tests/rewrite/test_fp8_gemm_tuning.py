"""--autotune on an fp8 ort-cuda export: each Fp8GemmAct node's problem (M tokens, N, K, output dtype,
activation, fast accumulation) and each Fp8Mlp node's (M, K, N1, N2, ...) found at the export's shapes
in the final artefact, `algo` (Fp8Mlp: `algo1`, `algo2`) written only where a candidate beat the
heuristic, never changing an output, and without a CUDA device the export still succeeds and says the
nodes were not tuned. The search over Fp8Mlp's pairs (`best_setting`) is checked on a timing table."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
import pytest
import torch
import transformers
from _export import _trained_like
from onnx import helper

import deployfuse
from deployfuse import metadata
from deployfuse.backends.ort import run, session
from deployfuse.ops.schema import DOMAIN
from deployfuse.rewrite import gemm_tuning
from deployfuse.rewrite.gemm_tuning import AlgoChoice, Fp8GemmProblem, Fp8MlpProblem, best_setting, gemm_problems, store_algos

BATCH, SEQ = 3, 10  # M = 30 tokens: not a multiple of 16, as no padding of the problem would leave it


def _bert() -> transformers.BertModel:
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=500, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512,
                                     max_position_embeddings=64)
    model = transformers.BertModel(config).eval()
    _trained_like(model)  # non-zero biases, as trained: a bias of zeros is none (rules.fp8_gemm)
    return model


@pytest.fixture(scope="module")
def fp8_tuned(tmp_path_factory):
    """(the fp8 ort-cuda artefact exported with autotune=True, the export's result, the BERT, its example feed)."""
    model = _bert()
    ids = torch.randint(0, model.config.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    example = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    path = tmp_path_factory.mktemp("fp8_tuning") / "bert.onnx"
    result = deployfuse.export(model, path, example_inputs=example, target="ort-cuda", precision="fp8", autotune=True, seed=0)
    return onnx.load(path), result, model, {k: v.numpy() for k, v in example.items()}


def _attr(node: onnx.NodeProto, name: str = "algo", default: Any = None) -> Any:
    value = next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)
    return value.decode() if isinstance(value, bytes) else value


def _shapes(artefact: onnx.ModelProto, names: list[str], feed: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    """The shapes ONNX Runtime computes for these values (function bodies, no optimisation)."""
    probe = onnx.ModelProto()
    probe.CopyFrom(artefact)
    del probe.graph.output[:]
    probe.graph.output.extend(helper.make_empty_tensor_value_info(name) for name in dict.fromkeys(names))
    return {k: v.shape for k, v in run(session(probe, optimize=False), feed).items()}


def test_fp8_export_with_autotune_succeeds_and_says_whether_it_tuned(fp8_tuned):
    artefact, result, _, _ = fp8_tuned
    steps = {s.name: s for s in result.report.steps}
    assert steps["quantize"].status == "ok" and "Fp8GemmAct" in steps["quantize"].detail
    ops = [n.op_type for n in artefact.graph.node]
    assert ops.count("Fp8GemmAct") > 0 and ops.count("Fp8Mlp") > 0
    names = "Fp8GemmAct and Fp8Mlp algorithms"  # the tuning covers both ops
    assert "algorithms" not in steps["fuse"].detail  # tuned once, in the final artefact (after the gate), not before quantization
    speed = result.report.quantization["fp16_for_speed"]  # quantize.speed_precision: the GEMMs kept in fp16 for speed, beside the gate's
    assert speed["summary"] in steps["quantize"].detail and metadata.read(artefact, metadata.QUANTIZATION)["fp16_for_speed_layers"] == speed["layers"]
    assert {n.name for n in artefact.graph.node if n.op_type == "GemmAct"} >= set(speed["layers"]) == set(speed["ms"])
    if not torch.cuda.is_available():
        assert f"{names} not tuned: no CUDA device" in steps["quantize"].detail, steps["quantize"].detail
        assert all(_attr(n, a) is None for n in artefact.graph.node for a in ("algo", "algo1", "algo2")), "an untuned export writes no algo"
        producers = {o: n.op_type for n in artefact.graph.node for o in n.output}  # the norms and attentions write every X in float8
        assert all(producers.get(n.input[0]) in ("SkipLayerNormFp8", "FusedMHA") for n in artefact.graph.node if n.op_type == "Fp8GemmAct")
        assert "fp8_attention_out kept: " in steps["quantize"].detail, steps["quantize"].detail  # its A/B ran (and could not time)
        fp8 = sum(n.op_type == "Fp8GemmAct" for n in artefact.graph.node)
        why = f"Fp8GemmAct precision not timed against fp16: all {fp8} read a float8 X, no quantize pass to save"
        assert speed == {"layers": [], "ms": {}, "summary": why}
    else:
        assert f"{names} tuned on" in steps["quantize"].detail or "not built" in steps["quantize"].detail


def test_each_fp8_gemm_problem_is_the_shape_the_node_runs_at(fp8_tuned):
    """M, N, K against the X and Y shapes ONNX Runtime computes for each node, and against the BERT's own sizes; the problem
    has a bias where the node's Bias has values (QKV's), none where it is empty (the output projections': the norm took it)."""
    artefact, _, model, feed = fp8_tuned
    nodes = [n for n in artefact.graph.node if n.op_type == "Fp8GemmAct"]
    problems = gemm_problems(artefact, feed)
    dims = {t.name: list(t.dims) for t in artefact.graph.initializer}
    assert {name for name, p in problems.items() if isinstance(p, Fp8GemmProblem)} == {n.output[0] for n in nodes}
    shapes = _shapes(artefact, [name for n in nodes for name in (n.input[0], n.output[0])], feed)
    hidden, tokens = model.config.hidden_size, BATCH * SEQ
    sizes = {(tokens, hidden, 3 * hidden), (tokens, hidden, hidden), (tokens, hidden, model.config.intermediate_size),
             (tokens, model.config.intermediate_size, hidden), (BATCH, hidden, hidden)}  # QKV, out, FC1, FC2, pooler
    for node in nodes:
        p, x, y = problems[node.output[0]], shapes[node.input[0]], shapes[node.output[0]]
        assert isinstance(p, Fp8GemmProblem)
        assert (p.m, p.k, p.n) == (math.prod(x[:-1]), x[-1], y[-1]) and p.m == math.prod(y[:-1]), node.name
        assert (p.m, p.k, p.n) in sizes, (node.name, p)
        assert (p.dtype, p.fast_accum) == (onnx.TensorProto.FLOAT16, 1)
        assert p.bias == int(math.prod(dims[node.input[4]]) > 0) and (p.bias or (p.k, p.n) == (hidden, hidden)), node.name
        assert p.activation == (helper.get_attribute_value(next(a for a in node.attribute if a.name == "activation")).decode()
                                if any(a.name == "activation" for a in node.attribute) else "none")
    assert {(p.m, p.k, p.n) for p in problems.values() if isinstance(p, Fp8GemmProblem)} >= {(tokens, hidden, 3 * hidden)}  # split_qkv: one GEMM
    assert {p.bias for p in problems.values() if isinstance(p, Fp8GemmProblem)} == {0, 1}


def test_each_fp8_mlp_problem_is_the_shape_the_node_runs_at(fp8_tuned):
    """Each layer's Fp8Mlp: M, K from X's shape and N2 from Y's as ONNX Runtime computes them, N1 = W1's rows = W2's columns,
    and all four the BERT's own sizes; FC1's activation and the accumulation as the node's attributes say; FC1 with its bias,
    FC2 without (the norm after it took it: B2 empty)."""
    artefact, _, model, feed = fp8_tuned
    nodes = [n for n in artefact.graph.node if n.op_type == "Fp8Mlp"]
    assert len(nodes) == model.config.num_hidden_layers
    problems = gemm_problems(artefact, feed)
    assert {name for name, p in problems.items() if isinstance(p, Fp8MlpProblem)} == {n.output[0] for n in nodes}
    shapes = _shapes(artefact, [name for n in nodes for name in (n.input[0], n.output[0])], feed)
    dims = {t.name: list(t.dims) for t in artefact.graph.initializer}
    for node in nodes:
        p, x, y = problems[node.output[0]], shapes[node.input[0]], shapes[node.output[0]]
        assert isinstance(p, Fp8MlpProblem)
        assert (p.m, p.k, p.n2) == (math.prod(x[:-1]), x[-1], y[-1]) and p.m == math.prod(y[:-1]), node.name
        assert [p.n1, p.k] == dims[node.input[2]] and [p.n2, p.n1] == dims[node.input[6]], node.name
        assert (p.m, p.k, p.n1, p.n2) == (BATCH * SEQ, model.config.hidden_size, model.config.intermediate_size, model.config.hidden_size)
        assert (p.dtype, p.fast_accum, p.activation) == (onnx.TensorProto.FLOAT16, _attr(node, "fast_accum", 1), _attr(node, "activation", "none"))
        assert (p.b1, p.b2) == (1, 0) and (dims[node.input[4]], dims[node.input[8]]) == ([p.n1], [0]), node.name


def test_algo_is_written_only_where_a_choice_was_made_and_never_changes_the_outputs(fp8_tuned):
    """Fp8GemmAct: `algo` on every other node; Fp8Mlp: only `algo1` on one, only `algo2` on the other, then both on the first
    (replacing its algo1, not adding a second); the other attributes and nodes untouched, the outputs (ORT CPU, function
    bodies) bit for bit the untuned artefact's."""
    artefact, _, _, feed = fp8_tuned
    gemms = [n.output[0] for n in artefact.graph.node if n.op_type == "Fp8GemmAct"]
    mlps = [n.output[0] for n in artefact.graph.node if n.op_type == "Fp8Mlp"]
    chosen = {name: AlgoChoice({"algo": 2} if i % 2 else {}, 1.0, 0.9 if i % 2 else 1.0, (4,)) for i, name in enumerate(gemms)}
    chosen |= {mlps[0]: AlgoChoice({"algo1": 2}, 1.0, 0.9, (4, 5)), mlps[1]: AlgoChoice({"algo2": 1}, 1.0, 0.9, (4, 5))}
    tuned = onnx.ModelProto()
    tuned.CopyFrom(artefact)
    assert store_algos(tuned, chosen) == len(gemms) // 2 + 2
    assert store_algos(tuned, {mlps[0]: AlgoChoice({"algo1": 3, "algo2": 0}, 1.0, 0.8, (4, 5))}) == 1
    want_algos = {name: c.algos for name, c in chosen.items()} | {mlps[0]: {"algo1": 3, "algo2": 0}}
    for before, after in zip(artefact.graph.node, tuned.graph.node, strict=True):
        algos = want_algos.get(before.output[0], {})
        if not algos:
            assert after == before
            continue
        assert [a for a in after.attribute if a.name not in algos] == list(before.attribute), before.name
        assert sorted(a.name for a in after.attribute if a.name in algos) == sorted(algos), "each attribute once"
        assert {name: _attr(after, name) for name in algos} == algos
    want, got = run(session(artefact, optimize=False), feed), run(session(tuned, optimize=False), feed)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key])  # the function bodies ignore algo, algo1, algo2
    assert {f.name for f in tuned.functions if f.domain == DOMAIN} >= {"Fp8GemmAct", "Fp8Mlp"}  # the bodies, not a kernel, ran


class _Timings:
    """A timing table for `best_setting`: the settings each call asked for, and ms = the heuristic's 1.0 less each GEMM's saving
    (FC1's candidate 2: 0.10, FC2's candidate 1: 0.05, every other candidate 0.01 slower), `joint` for the two bests together."""

    def __init__(self, joint: float) -> None:
        self.calls: list[list[tuple[int, ...]]] = []
        self.joint = joint

    def ms(self, s: tuple[int, ...]) -> float:
        if s == (2, 1):
            return self.joint
        return 1.0 + sum({(0, 2): -0.10, (1, 1): -0.05}.get((i, a), 0.01) for i, a in enumerate(s) if a >= 0)

    def __call__(self, settings: list[tuple[int, ...]]) -> list[float]:
        self.calls.append(list(settings))
        return [self.ms(s) for s in settings]


@pytest.mark.parametrize("joint", [0.84, 0.95])
def test_fp8_mlp_search_times_each_gemm_alone_then_their_bests_together(joint):
    """Counts (4, 3): stage 1 = the heuristic pair and each GEMM's candidates 1.. with the other at -1 (1 + 3 + 2 settings,
    not 12); stage 2 = the heuristic pair, each best alone and the pair of bests, in one call; the fastest of stage 2 wins
    (the pair when it is faster, FC1's best alone when the two interfere)."""
    timings = _Timings(joint)
    best, heuristic_ms, best_ms = best_setting((4, 3), timings)
    assert timings.calls == [[(-1, -1), (1, -1), (2, -1), (3, -1), (-1, 1), (-1, 2)], [(-1, -1), (2, -1), (-1, 1), (2, 1)]]
    assert best == ((2, 1) if joint < 0.9 else (2, -1))
    assert (heuristic_ms, best_ms) == (1.0, min(joint, 0.9))


def test_search_stops_after_one_stage_where_at_most_one_gemm_improves():
    """One GEMM (Fp8GemmAct's algo): every candidate once, as before Fp8Mlp; two GEMMs where only FC1 has a faster candidate:
    no second stage (the pair would be FC1's best alone, already timed beside the heuristic's)."""
    timings = _Timings(0.5)
    assert best_setting((4,), timings) == ((2,), 1.0, 0.9)
    assert timings.calls == [[(-1,), (1,), (2,), (3,)]]
    timings = _Timings(0.5)
    assert best_setting((3, 1), timings) == ((2, -1), 1.0, 0.9)
    assert timings.calls == [[(-1, -1), (1, -1), (2, -1)]]


def test_a_problem_that_cannot_be_timed_keeps_its_nodes_at_the_heuristics_choice(fp8_tuned, monkeypatch, tmp_path):
    """Tuning is optional: where cuBLASLt has no algorithm for a problem (or a candidate fails), `time_candidates` raises;
    that problem's nodes keep their attributes and say why, the others are still tuned, and nothing is raised. (No GPU here:
    the timing is stood in for; what is tested is what tuning does with its outcome.)"""
    artefact, _, _, feed = fp8_tuned

    def timed(library, problem, rounds=5, calls=20):
        if isinstance(problem, Fp8MlpProblem):
            raise RuntimeError(f"cuBLASLt has no algorithm for {problem} (code -801)")
        return AlgoChoice({"algo": 1}, 1.0, 0.9, (3,))

    monkeypatch.setattr(gemm_tuning, "time_candidates", timed)
    tuned = onnx.ModelProto()
    tuned.CopyFrom(artefact)
    choices = gemm_tuning.tune_gemm_algos(tuned, feed, tmp_path / "unused.so")
    kinds = {n.output[0]: n.op_type for n in tuned.graph.node}
    assert {kinds[name] for name, c in choices.items() if c.error} == {"Fp8Mlp"}
    assert all("no algorithm" in c.error and not c.algos for name, c in choices.items() if kinds[name] == "Fp8Mlp")
    for before, after in zip(artefact.graph.node, tuned.graph.node, strict=True):
        if before.op_type == "Fp8Mlp":
            assert after == before
        elif before.op_type == "Fp8GemmAct":
            assert _attr(after, "algo", -1) == 1
