"""rules.fp8_embed: GPT-2's token and position lookups and their Add taken into the first SkipLayerNormFp8 (Ids, a broadcast
Skip). A tiny GPT-2's fp8 ort-cuda export (dynamic batch) has nothing before that norm but the ids' reshape, and computes on
fresh ids at another batch what the same artefact with the Gathers and the Add put back computes (ONNX Runtime CPU, function
bodies and the CPU kernels). Tiny BERT and RoBERTa exports: the graph the rule received, and the rule's result on it,
compute the same on fresh ids (BERT's constant token types folded into the Skip, a token_type_ids input or RoBERTa's
positions kept as the Skip's lookup, a dynamic sequence axis refused)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
import torch
import transformers
from onnx import helper

import deployfuse
from deployfuse.backends.ort import run, session
from deployfuse.inputs import DynamicAxis
from deployfuse.ops import ort_custom_ops_library
from deployfuse.rewrite.rules import fp8_embed

VOCAB = 500


@pytest.fixture(scope="module")
def library():
    return ort_custom_ops_library()


@pytest.fixture(scope="module")
def artefact(tmp_path_factory) -> onnx.ModelProto:
    torch.manual_seed(0)
    model = transformers.GPT2Model(transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64)).eval()
    ids = torch.randint(0, VOCAB, (2, 16))
    result = deployfuse.export(
        model,
        tmp_path_factory.mktemp("gpt2") / "model.onnx",
        example_inputs={"input_ids": ids},
        dynamic=[DynamicAxis("input_ids", 0, "batch")],
        target="ort-cuda",
        precision="fp8",
        accuracy_budget="cos=0.99,rel=0.2",
        seed=0,
        verify_draws=1,
    )
    return onnx.load(result.onnx_path)


def _unfused(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with each SkipLayerNormFp8's lookups put back: Gather(table, Ids) + Skip as its X, as before the rule."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = []
    for node in out.graph.node:
        if node.op_type == "SkipLayerNormFp8" and len(node.input) > 6 and node.input[6]:
            words, x = f"{node.name}_words", f"{node.name}_x"
            nodes += [helper.make_node("Gather", [node.input[0], node.input[6]], [words], axis=0), helper.make_node("Add", [words, node.input[5]], [x])]
            node.input[:] = [x, *node.input[1:5]]
        nodes.append(node)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    deployfuse.ops.attach_functions(out)  # the norms' variant without Skip and Ids
    return out


def _native(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.functions[:]
    return out


def _close(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    """Nearly equal: the fused norm sums the two rows in float32 where the Add rounded them to float16 first, so a float8
    value of YQ may flip where Y sits near a midpoint, which the layers after it carry."""
    assert set(got) == set(want)
    for name, value in want.items():
        ref, out = value.astype(np.float64), got[name].astype(np.float64)
        assert out.shape == ref.shape, name
        rel = np.linalg.norm(out - ref) / np.linalg.norm(ref)
        assert rel < 1e-2 and np.abs(out - ref).max() < 0.05 * np.abs(ref).max(), (name, rel)


def test_gpt2_fp8_export_looks_up_the_embeddings_in_the_norm(artefact, library):
    nodes = list(artefact.graph.node)
    first = next(i for i, n in enumerate(nodes) if n.op_type == "SkipLayerNormFp8")
    assert not {"Gather", "Add"} & {n.op_type for n in nodes[:first]}, [n.op_type for n in nodes[: first + 1]]
    norm = nodes[first]
    assert len(norm.input) == 7 and norm.input[5] and norm.input[6] and norm.output[2], "Skip, Ids, and Sum: the first residual"
    feed = {"input_ids": np.random.default_rng().integers(0, VOCAB, (3, 16))}
    unfused = _unfused(artefact)
    assert sum(n.op_type == "Gather" for n in unfused.graph.node) == 1 + sum(n.op_type == "Gather" for n in nodes)
    _close(run(session(artefact, optimize=False), feed), run(session(unfused, optimize=False), feed))
    native = run(session(_native(artefact), optimize=False, custom_ops_library=library), feed)
    _close(native, run(session(_native(unfused), optimize=False, custom_ops_library=library), feed))
    changed = run(session(artefact, optimize=False), {"input_ids": (feed["input_ids"] + 1) % VOCAB})
    assert not all(np.allclose(changed[k], v, atol=1e-2) for k, v in native.items()), "the ids reach the outputs"


def _embeddings(
    rng: np.random.Generator, *, positions: str = "gather", bias: float = 0.0, residual: str = "output", late_scale: bool = False, skip: bool = False
) -> onnx.ModelProto:
    """ids [B, 4] -> Gather(W [10, 16]) + P [1, 4, 16] -> SkipLayerNormFp8 (Y, YQ); positions: "gather" (a lookup of a constant
    [6, 16] table by constant positions), "range" (by Range(0, 4, 1)), "constant", "full" (a constant [2, 4, 16]: broadcasts
    over no leading axis, the batch being dynamic) or "rank4" (a constant [1, 1, 4, 16]: the Add one axis more than the
    lookup); residual: "output" (the Add is also a graph output), or "read" (a Neg before the norm reads it, and the norm
    writes Sum); late_scale: the norm's YScale a Constant node between the Add and the norm; skip: the norm adds a constant
    Skip [4, 16] too."""
    table = rng.standard_normal((10, 16)).astype(np.float32)
    inits = [
        onnx.numpy_helper.from_array(table, "w"),
        onnx.numpy_helper.from_array(rng.standard_normal((6, 16)).astype(np.float32), "wp"),
        *(onnx.numpy_helper.from_array(np.full(16, v, np.float32), n) for n, v in (("g", 1.0), ("b", 0.0), ("bias", bias))),
        *([] if late_scale else [onnx.numpy_helper.from_array(np.array(0.01, np.float32), "s")]),
    ]
    nodes = [helper.make_node("Gather", ["w", "ids"], ["e"], axis=0)]
    if positions in ("gather", "range"):
        if positions == "gather":
            inits.append(onnx.numpy_helper.from_array(np.arange(4, dtype=np.int64)[None], "pos"))
        else:
            inits += [onnx.numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("r0", 0), ("r1", 4), ("r2", 1))]
            nodes.append(helper.make_node("Range", ["r0", "r1", "r2"], ["pos"]))
        nodes.append(helper.make_node("Gather", ["wp", "pos"], ["p"], axis=0))
    else:
        shape = {"constant": (1, 4, 16), "full": (2, 4, 16), "rank4": (1, 1, 4, 16)}[positions]
        inits.append(onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), "p"))
    nodes.append(helper.make_node("Add", ["e", "p"], ["x"]))
    if residual == "read":
        nodes.append(helper.make_node("Neg", ["x"], ["nx"]))
    if late_scale:
        nodes.append(helper.make_node("Constant", [], ["s"], value=onnx.numpy_helper.from_array(np.array(0.01, np.float32))))
    total = "total" if residual == "read" else ""
    if skip:
        inits.append(onnx.numpy_helper.from_array(rng.standard_normal((4, 16)).astype(np.float32), "skip"))
    norm_inputs = ["x", "g", "b", "bias", "s", *(["skip"] if skip else [])]
    nodes.append(helper.make_node("SkipLayerNormFp8", norm_inputs, ["y", "yq", total], domain="deployfuse", epsilon=1e-5))
    outputs = [helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, ["B", 4, 16]) for name in ("y", *(("nx", "total") if total else ("x",)))]
    graph = helper.make_graph(nodes, "embed", [helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, ["B", 4])], outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("deployfuse", 1)], ir_version=10)
    deployfuse.ops.attach_functions(model)
    return model


@pytest.mark.parametrize("positions,residual", [("gather", "output"), ("range", "output"), ("constant", "output"), ("gather", "read")])
def test_rule_keeps_what_the_graph_computes(positions, residual):
    """Y and the residual (the norm's Sum now, in the Add's place) as the Gathers and the Add computed them (ids in [-V, V):
    Gather's range)."""
    rng = np.random.default_rng()
    model = _embeddings(rng, positions=positions, residual=residual)
    feed = {"ids": rng.integers(-10, 10, (3, 4))}
    want = run(session(model, optimize=False), feed)
    fused, count, refused = fp8_embed.fuse(_copy(model), "ort-cuda")
    assert count == 1 and not refused and [n.op_type for n in fused.graph.node] == ["SkipLayerNormFp8"] + ["Neg"] * (residual == "read")
    assert positions == "constant" or "wp" not in {t.name for t in fused.graph.initializer}, "the folded position table is dropped"
    deployfuse.ops.attach_functions(fused)  # the variant with Skip and Ids (fp8_gemm.lower attaches them after the rules)
    got = run(session(fused, optimize=False), feed)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-5, err_msg=name)


def test_rule_stands_after_an_input_of_the_norm_computed_after_the_add():
    """The norm's YScale a Constant between the Add and the norm: the fused norm stands after it (nothing reads the sum before)."""
    rng = np.random.default_rng()
    model = _embeddings(rng, late_scale=True)
    feed = {"ids": rng.integers(-10, 10, (3, 4))}
    want = run(session(model, optimize=False), feed)
    fused, count, refused = fp8_embed.fuse(_copy(model), "ort-cuda")
    assert count == 1 and not refused and [n.op_type for n in fused.graph.node] == ["Constant", "SkipLayerNormFp8"]
    deployfuse.ops.attach_functions(fused)
    got = run(session(fused, optimize=False), feed)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize(
    "change,why",
    [
        (dict(bias=0.5), "Bias is not zeros"),
        (dict(positions="full"), "leading axes"),
        (dict(positions="rank4"), "leading axes"),
        (dict(late_scale=True, residual="read"), "read before"),
        (dict(skip=True), "adds a Skip"),
    ],
)
def test_near_misses_are_refused_with_their_reason(change, why):
    model = _embeddings(np.random.default_rng(0), **change)
    fused, count, refused = fp8_embed.fuse(_copy(model), "ort-cuda")
    assert count == 0 and len(refused) == 1 and why in refused[0], refused
    assert [n.op_type for n in fused.graph.node] == [n.op_type for n in model.graph.node]


def test_an_input_of_the_norm_computed_from_the_sum_is_refused():
    """YScale = ReduceMax(the Add's output), the node the fused norm would stand after: fused, it would read the norm's own Sum
    (a cycle), so the rule refuses."""
    model = _embeddings(np.random.default_rng(0), late_scale=True)  # the Add also a graph output, read by no other node
    scale = next(n for n in model.graph.node if n.output[0] == "s")
    scale.CopyFrom(helper.make_node("ReduceMax", ["x"], ["s"], keepdims=0))
    fused, count, refused = fp8_embed.fuse(_copy(model), "ort-cuda")
    assert count == 0 and len(refused) == 1 and "read before" in refused[0], refused
    assert [n.op_type for n in fused.graph.node] == [n.op_type for n in model.graph.node]


def test_two_norms_placed_after_one_node_fuse_once():
    """Two embedding norms whose YScale is one Constant computed after both sums would both stand after it: the first is fused,
    the second refused (fusing both put two rewrites in that node's place, and one was lost), and the graph computes what it did."""
    rng = np.random.default_rng()
    model = _embeddings(rng, late_scale=True)
    g = model.graph
    g.initializer.append(onnx.numpy_helper.from_array(rng.standard_normal((1, 4, 16)).astype(np.float32), "p2"))
    at = next(i for i, n in enumerate(g.node) if n.op_type == "Constant")
    g.node.insert(at, helper.make_node("Add", ["e2", "p2"], ["x2"]))
    g.node.insert(at, helper.make_node("Gather", ["w", "ids2"], ["e2"], axis=0))
    g.node.append(helper.make_node("SkipLayerNormFp8", ["x2", "g", "b", "bias", "s"], ["y2", "yq2", ""], domain="deployfuse", epsilon=1e-5))
    g.input.append(helper.make_tensor_value_info("ids2", onnx.TensorProto.INT64, ["B", 4]))
    g.output.extend(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, ["B", 4, 16]) for name in ("y2", "x2"))
    deployfuse.ops.attach_functions(model)
    feed = {"ids": rng.integers(-10, 10, (3, 4)), "ids2": rng.integers(-10, 10, (3, 4))}
    want = run(session(model, optimize=False), feed)
    fused, count, refused = fp8_embed.fuse(_copy(model), "ort-cuda")
    assert count == 1 and len(refused) == 1 and "fused before it" in refused[0], refused
    deployfuse.ops.attach_functions(fused)
    got = run(session(fused, optimize=False), feed)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-5, err_msg=name)


def test_other_targets_keep_the_lookups():
    model = _embeddings(np.random.default_rng(0))
    assert fp8_embed.fuse(_copy(model), "tensorrt")[1] == 0


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _captured(tmp_path, module: torch.nn.Module, inputs: dict[str, torch.Tensor], dynamic: list[DynamicAxis]) -> tuple[onnx.ModelProto, onnx.ModelProto, list[str]]:
    """(the fp8 ort-cuda artefact, the graph `fp8_embed.fuse` last received in its export with its function bodies, what
    that call refused)."""
    real = fp8_embed.fuse
    received: list[onnx.ModelProto] = []
    refusals: list[list[str]] = []

    def spy(model, target):
        received.append(_copy(model))
        out = real(model, target)
        refusals.append(out[2])
        return out

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fp8_embed, "fuse", spy)
        result = deployfuse.export(
            module, tmp_path / "model.onnx", example_inputs=inputs, dynamic=dynamic, target="ort-cuda", precision="fp8", accuracy_budget="cos=0.99,rel=0.2", seed=0, verify_draws=1
        )
    deployfuse.ops.attach_functions(received[-1])
    return onnx.load(result.onnx_path), received[-1], refusals[-1]


def _with_first_norm(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with the first SkipLayerNormFp8's Y a graph output too (its type: the word table's)."""
    out = _copy(model)
    norm = next(n for n in out.graph.node if n.op_type == "SkipLayerNormFp8")
    table = next(t for t in out.graph.initializer if t.name.endswith("word_embeddings.weight"))
    out.graph.output.append(helper.make_tensor_value_info(norm.output[0], table.data_type, None))
    return out


def _bert_like(kind: str):
    torch.manual_seed(0)
    shape: dict[str, Any] = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, max_position_embeddings=64)
    if kind == "roberta":
        return transformers.RobertaModel(transformers.RobertaConfig(**shape), add_pooling_layer=False).eval()
    if kind == "distilbert":
        return transformers.DistilBertModel(transformers.DistilBertConfig(vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4, hidden_dim=128, max_position_embeddings=64)).eval()
    return transformers.BertModel(transformers.BertConfig(**shape), add_pooling_layer=False).eval()


def _feed(rng: np.random.Generator, names: list[str], batch: int, seq: int) -> dict[str, np.ndarray]:
    """Fresh ids (a padding token, 1, in every row: RoBERTa's positions skip it), random token types, a mask of ones."""
    ids = rng.integers(2, VOCAB, (batch, seq))
    ids[:, rng.integers(0, seq)] = 1
    values = {"input_ids": ids, "token_type_ids": rng.integers(0, 2, (batch, seq)), "attention_mask": np.ones((batch, seq), np.int64)}
    return {name: values[name] for name in names}


# (model, inputs besides input_ids and attention_mask, dynamic axes, what stands before the first norm: None where refused)
CASES = {
    "bert": ("bert", (), ("batch",), []),
    "bert-static": ("bert", (), (), []),
    "bert-token-types": ("bert", ("token_type_ids",), ("batch",), ["Gather", "Add"]),
    "bert-dynamic-sequence": ("bert", (), ("batch", "seq"), None),
    "distilbert": ("distilbert", (), ("batch",), []),
    "roberta": ("roberta", (), ("batch",), ["Equal", "Not", "Cast", "Cast", "CumSum", "Cast", "Mul", "Cast", "Add", "Gather", "Add"]),
}


@pytest.mark.parametrize("case", CASES)
def test_bert_like_fp8_export(case, tmp_path, library):
    """The first norm of each export looks up the words itself (Ids = input_ids, X the word table), the constant terms (the
    positions, BERT's token-type row 0 where no token_type_ids are given) one constant Skip, or that Skip plus what stays
    computed; the graph the rule received and its result compute the same Y of that norm and the same outputs on fresh
    ids at batch 3 (2: the static export; function bodies, and the CPU kernels). A dynamic sequence axis is refused (the positions are a Slice
    to S)."""
    kind, extra, axes, before_norm = CASES[case]
    names = ["input_ids", "attention_mask", *extra]
    example = {k: torch.from_numpy(v) for k, v in _feed(np.random.default_rng(0), names, 2, 16).items()}
    dynamic = [DynamicAxis(name, i, axis) for name in names for i, axis in enumerate(axes)]
    artefact, before, refused = _captured(tmp_path, _bert_like(kind), example, dynamic)
    nodes = list(artefact.graph.node)
    first = next(i for i, n in enumerate(nodes) if n.op_type == "SkipLayerNormFp8")
    norm = nodes[first]
    if before_norm is None:
        assert len(refused) == 1 and "dynamic sequence" in refused[0] and len(norm.input) <= 6, refused
        return
    assert not refused and [n.op_type for n in nodes[:first]] == before_norm, [n.op_type for n in nodes[: first + 1]]
    table = next(t for t in artefact.graph.initializer if t.name == norm.input[0])
    assert table.name.endswith("word_embeddings.weight") and norm.input[6] == "input_ids" and norm.input[5], norm.input
    fused, count, _ = fp8_embed.fuse(_copy(before), "ort-cuda")
    assert count == 1
    deployfuse.ops.attach_functions(fused)
    feed = _feed(np.random.default_rng(), names, 3, 16)
    if "static" in case:
        feed = {k: v[:2] for k, v in feed.items()}
    want = run(session(_with_first_norm(before), optimize=False), feed)
    _close(run(session(_with_first_norm(fused), optimize=False), feed), want)
    native = run(session(_native(_with_first_norm(fused)), optimize=False, custom_ops_library=library), feed)
    _close(native, run(session(_native(_with_first_norm(before)), optimize=False, custom_ops_library=library), feed))
    for name in ("input_ids", *extra):  # the words, and the token types where given, reach the outputs
        changed = run(session(_with_first_norm(fused), optimize=False), {**feed, name: (feed[name] + 1) % (VOCAB if name == "input_ids" else 2)})
        assert not all(np.allclose(changed[k], v, atol=1e-2) for k, v in want.items()), name
