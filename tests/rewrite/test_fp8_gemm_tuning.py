"""--autotune on an fp8 ort-cuda export: each Fp8GemmAct node's problem (M tokens, N, K, output dtype,
activation, fast accumulation) found at the export's shapes in the final artefact, `algo` written
only where a candidate beat the heuristic, and without a CUDA device the export still succeeds and
says the nodes were not tuned."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
import torch
import transformers
from onnx import helper

import deployfuse
from deployfuse.backends.ort import run, session
from deployfuse.rewrite.gemm_tuning import AlgoChoice, Fp8GemmProblem, gemm_problems, store_algos

BATCH, SEQ = 3, 10  # M = 30 tokens: not a multiple of 16, as no padding of the problem would leave it


def _bert() -> transformers.BertModel:
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=500, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512,
                                     max_position_embeddings=64)
    return transformers.BertModel(config).eval()


@pytest.fixture(scope="module")
def fp8_tuned(tmp_path_factory):
    """(the fp8 ort-cuda artefact exported with autotune=True, the export's result, the BERT, its example feed)."""
    model = _bert()
    ids = torch.randint(0, model.config.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    example = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    path = tmp_path_factory.mktemp("fp8_tuning") / "bert.onnx"
    result = deployfuse.export(model, path, example_inputs=example, target="ort-cuda", precision="fp8", autotune=True, seed=0)
    return onnx.load(path), result, model, {k: v.numpy() for k, v in example.items()}


def _algo(node: onnx.NodeProto) -> int | None:
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == "algo"), None)


def test_fp8_export_with_autotune_succeeds_and_says_whether_it_tuned(fp8_tuned):
    artefact, result, _, _ = fp8_tuned
    steps = {s.name: s for s in result.report.steps}
    assert steps["quantize"].status == "ok" and "Fp8GemmAct" in steps["quantize"].detail
    ops = [n.op_type for n in artefact.graph.node]
    assert ops.count("Fp8GemmAct") > 0
    if ops.count("Fp8Mlp"):
        assert f"{ops.count('Fp8Mlp')} Fp8Mlp keep the heuristic's choice" in steps["quantize"].detail
    assert "algorithms" not in steps["fuse"].detail  # tuned once, in the final artefact (after the gate), not before quantization
    if not torch.cuda.is_available():
        assert "Fp8GemmAct algorithms not tuned: no CUDA device" in steps["quantize"].detail, steps["quantize"].detail
        assert all(_algo(n) is None for n in artefact.graph.node), "an untuned export writes no algo"
    else:
        assert "Fp8GemmAct algorithms tuned on" in steps["quantize"].detail or "not built" in steps["quantize"].detail


def test_each_fp8_gemm_problem_is_the_shape_the_node_runs_at(fp8_tuned):
    """M, N, K against the X and Y shapes ONNX Runtime computes for each node, and against the BERT's own sizes."""
    artefact, _, model, feed = fp8_tuned
    nodes = [n for n in artefact.graph.node if n.op_type == "Fp8GemmAct"]
    problems = gemm_problems(artefact, feed)
    assert set(problems) == {n.output[0] for n in nodes}
    probe = onnx.ModelProto()
    probe.CopyFrom(artefact)
    del probe.graph.output[:]
    probe.graph.output.extend(helper.make_empty_tensor_value_info(name) for n in nodes for name in (n.input[0], n.output[0]))
    shapes = {k: v.shape for k, v in run(session(probe, optimize=False), feed).items()}
    hidden, tokens = model.config.hidden_size, BATCH * SEQ
    sizes = {(tokens, hidden, 3 * hidden), (tokens, hidden, hidden), (tokens, hidden, model.config.intermediate_size),
             (tokens, model.config.intermediate_size, hidden), (BATCH, hidden, hidden)}  # QKV, out, FC1, FC2, pooler
    for node in nodes:
        p, x, y = problems[node.output[0]], shapes[node.input[0]], shapes[node.output[0]]
        assert isinstance(p, Fp8GemmProblem)
        assert (p.m, p.k, p.n) == (math.prod(x[:-1]), x[-1], y[-1]) and p.m == math.prod(y[:-1]), node.name
        assert (p.m, p.k, p.n) in sizes, (node.name, p)
        assert (p.dtype, p.fast_accum) == (onnx.TensorProto.FLOAT16, 1)
        assert p.activation == (helper.get_attribute_value(next(a for a in node.attribute if a.name == "activation")).decode()
                                if any(a.name == "activation" for a in node.attribute) else "none")
    assert {(p.m, p.k, p.n) for p in problems.values()} >= {(tokens, hidden, 3 * hidden)}  # split_qkv: Q, K and V are one fp8 GEMM


def test_algo_is_written_only_where_a_choice_was_made_and_never_changes_the_outputs(fp8_tuned):
    artefact, _, _, feed = fp8_tuned
    names = [n.output[0] for n in artefact.graph.node if n.op_type == "Fp8GemmAct"]
    chosen = {name: AlgoChoice(2 if i % 2 else -1, 1.0, 0.9 if i % 2 else 1.0, 4) for i, name in enumerate(names)}
    tuned = onnx.ModelProto()
    tuned.CopyFrom(artefact)
    assert store_algos(tuned, chosen) == len(names) // 2
    for before, after in zip(artefact.graph.node, tuned.graph.node, strict=True):
        if before.output[0] in chosen and chosen[before.output[0]].algo >= 0:
            assert _algo(after) == 2 and [a for a in after.attribute if a.name != "algo"] == [a for a in before.attribute if a.name != "algo"]
        else:
            assert after == before
    want, got = run(session(artefact, optimize=False), feed), run(session(tuned, optimize=False), feed)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key])  # the function bodies (and the CPU kernel) ignore algo

