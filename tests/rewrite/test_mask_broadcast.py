"""mask_broadcast: a FusedMHA Mask broadcast over the query axis becomes the row it came from.

A tiny BertModel's dynamo export (transformers, random weights) builds its additive mask as
Where(And(all-True [1, 1, S, 1], padding [B, 1, 1, S]), 0, min): [B, 1, S, S]. In the fp8 ort-cuda
export and the fp16 FusedMHA form (packed_qkv skipped) every FusedMHA must read a [B, 1, 1, S] Mask
(the Hopper kernel's row path) with the And gone, and the outputs must equal those of the same export
without the family on fresh inputs with padded rows (ONNX Runtime CPU, optimisations off, function
bodies). On hand-built graphs an Expand with another reader stays for that reader, and a
per-query operand (a causal [1, 1, S, S] constant, GPT-2's form) refuses the rewrite; GPT-2's
own export is left alone.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import transformers
from _export import feeds
from _forms import Form, exported
from onnx import helper, numpy_helper
from test_split_qkv import _fused

import deployfuse
from deployfuse.backends.ort import run, session
from deployfuse.inputs import DynamicAxis
from deployfuse.ops import attach_functions
from deployfuse.rewrite.fuser import fuse
from deployfuse.rewrite.rules import mask_broadcast

F32 = onnx.TensorProto.FLOAT


def _padded_feed(model: onnx.ModelProto, seed: int, batch: int, seq: int) -> dict[str, np.ndarray]:
    """Fresh [batch, seq] token ids and an attention mask whose rows keep a random number (>= 1) of leading tokens."""
    rng = np.random.default_rng(seed)
    feed: dict[str, np.ndarray] = {}
    for value in model.graph.input:
        if "mask" in value.name:
            lengths = rng.integers(1, seq + 1, batch)
            lengths[0] = seq // 2  # at least one padded row
            feed[value.name] = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int64)
        else:
            feed[value.name] = rng.integers(0, 100, (batch, seq))
    return feed


def _shapes(model: onnx.ModelProto) -> dict[str, list[int | str]]:
    """Every value's inferred shape (symbolic dims by name)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    return {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in (*inferred.graph.value_info, *inferred.graph.input)}


def _mask_shapes(model: onnx.ModelProto) -> list[list[int | str]]:
    """The inferred shape of every FusedMHA's Mask."""
    shapes = _shapes(model)
    return [shapes[n.input[3]] for n in model.graph.node if n.op_type == "FusedMHA"]


def _query_wide(model: onnx.ModelProto) -> set[str]:
    """The ops on the FusedMHA Masks' producer chains making a 4-D value wider than 1 on the query axis."""
    producers, shapes = {o: n for n in model.graph.node for o in n.output}, _shapes(model)
    wide: set[str] = set()
    todo = [n.input[3] for n in model.graph.node if n.op_type == "FusedMHA"]
    while todo:
        name = todo.pop()
        node, shape = producers.get(name), shapes.get(name, [])
        if node is not None:
            if len(shape) == 4 and shape[2] != 1:
                wide.add(node.op_type)
            todo.extend(node.input)
    return wide


def _assert_same(with_rule: onnx.ModelProto, without: onnx.ModelProto, batch: int, seq: int) -> None:
    """Bit-equal outputs on two fresh padded feeds (ONNX Runtime CPU, optimisations off, the function bodies)."""
    for seed in range(2):
        feed = _padded_feed(without, seed, batch, seq)
        want = run(session(without, optimize=False), feed)
        got = run(session(with_rule, optimize=False), feed)
        assert set(got) == set(want)
        for name, value in want.items():
            np.testing.assert_array_equal(got[name], value, err_msg=name)


def _assert_row_masks(model: onnx.ModelProto, batch: int, seq: int, layers: int) -> None:
    assert _mask_shapes(model) == [[batch, 1, 1, seq]] * layers
    assert not _query_wide(model), _query_wide(model)
    masks = {n.input[3] for n in model.graph.node if n.op_type == "FusedMHA"}
    assert len(masks) == 1, "the layers' rebuilt masks are merged into one"


def test_fp8_export_hands_fused_mha_the_padding_row(tmp_path) -> None:
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, max_position_embeddings=32)
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, config.vocab_size, (2, 16))
    example = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    artefacts = {}
    for name, skipped in (("with", ()), ("without", (mask_broadcast.FAMILY,))):
        result = deployfuse.export(model, tmp_path / f"{name}.onnx", example_inputs=example, target="ort-cuda", precision="fp8", seed=0,
                                   verify=False, skip_fusions=skipped)
        artefacts[name] = onnx.load(result.onnx_path)
        if not skipped:
            assert result.fusion is not None
            (family,) = [f for f in result.fusion.families if f.family == mask_broadcast.FAMILY]
            assert family.matches == {mask_broadcast.FAMILY: 2, f"{mask_broadcast.FAMILY}_batch": 0} and not family.rolled_back, family
    assert _mask_shapes(artefacts["without"]) == [[2, 1, 16, 16]] * 2 and "And" in _query_wide(artefacts["without"])
    _assert_row_masks(artefacts["with"], 2, 16, 2)
    _assert_same(artefacts["with"], artefacts["without"], 2, 16)


def test_fp16_fused_mha_form() -> None:
    """The fp16 artefact with packed_qkv skipped (bench/gpu_quant.py's FusedMHA form)."""
    model = exported("bert", Form(precision="fp16")).model
    with_rule, report = _fused("bert", model, ("packed_qkv",))
    without, _ = _fused("bert", model, ("packed_qkv", mask_broadcast.FAMILY))
    assert report.counts()[mask_broadcast.FAMILY] == 2, report.counts()
    batch, seq = (d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim)
    assert _mask_shapes(without) == [[batch, 1, seq, seq]] * 2 and "And" in _query_wide(without)
    _assert_row_masks(with_rule, batch, seq, 2)
    _assert_same(with_rule, without, 3, 12)  # dynamic batch and sequence


def test_gpt2_causal_mask_is_left_alone() -> None:
    """GPT-2's mask is And(And(True, k_idx <= q_idx), Equal(q's and k's packed-sequence ids)): genuinely per query row.
    Only the families that make its FusedMHA run (its Conv1D is a packed QKV already)."""
    model = exported("gpt2", Form(precision="fp16")).model
    families = ["attention", "packed_mha", mask_broadcast.FAMILY]
    fused, report = fuse(model, "ort-cuda", feeds("gpt2", model, count=1, seed=1), families=families, debug=True)
    assert report.counts()[mask_broadcast.FAMILY] == 0 and report.counts()["packed_mha"] == 2, report.counts()
    assert not any(f.rolled_back for f in report.families) and _mask_shapes(fused) == [["batch", 1, "seq", "seq"]] * 2
    (family,) = [f for f in report.families if f.family == mask_broadcast.FAMILY]
    assert any("without its broadcasts" in r for r in family.near_misses[mask_broadcast.FAMILY]), family.near_misses


def _model(nodes: list[onnx.NodeProto], mask_input: onnx.ValueInfoProto, inits: list[onnx.TensorProto], shared: bool) -> onnx.ModelProto:
    """q, k, v [2, 7, 16] and the mask's input -> `nodes` -> FusedMHA(q, k, v, "mask") -> y (and "wide" with `shared`)."""
    nodes = [*nodes, helper.make_node("FusedMHA", ["q", "k", "v", "mask"], ["y"], domain="deployfuse", num_heads=2)]
    inputs = [helper.make_tensor_value_info(n, F32, [2, 7, 16]) for n in "qkv"] + [mask_input]
    outputs = [helper.make_tensor_value_info(o, F32, None) for o in ("y", *(["wide"] if shared else []))]
    graph = helper.make_graph(nodes, "masked", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("deployfuse", 1)], ir_version=10)
    attach_functions(model)
    return onnx.shape_inference.infer_shapes(model)  # the rule reads the shapes, as the exports carry them


def _expand_mul(extra: np.ndarray, shared: bool = False) -> onnx.ModelProto:
    """pad [2, 1, 1, 7] -> Expand to [2, 1, 7, 7] ("wide") -> Mul by `extra` -> the Mask."""
    inits = [numpy_helper.from_array(np.array([2, 1, 7, 7], np.int64), "shape"), numpy_helper.from_array(extra, "extra")]
    nodes = [helper.make_node("Expand", ["pad", "shape"], ["wide"]), helper.make_node("Mul", ["wide", "extra"], ["mask"])]
    return _model(nodes, helper.make_tensor_value_info("pad", F32, [2, 1, 1, 7]), inits, shared)


def _and_where(constant: np.ndarray) -> onnx.ModelProto:
    """Where(And(`constant`, keep [2, 1, 1, 7]), 0, -10000) -> the Mask: HF's dynamo spelling."""
    inits = [numpy_helper.from_array(constant, "constant"), numpy_helper.from_array(np.array(0, np.float32), "zero"),
             numpy_helper.from_array(np.array(-1e4, np.float32), "low")]
    nodes = [helper.make_node("And", ["constant", "keep"], ["both"]), helper.make_node("Where", ["both", "zero", "low"], ["mask"])]
    return _model(nodes, helper.make_tensor_value_info("keep", onnx.TensorProto.BOOL, [2, 1, 1, 7]), inits, False)


def _feeds(model: onnx.ModelProto) -> list[dict[str, np.ndarray]]:
    """Two fresh feeds; the first 5 (then all 7) keys of the two rows kept."""
    kept = np.arange(7) < np.array([5, 7]).reshape(2, 1, 1, 1)
    mask = {"pad": np.where(kept, 0, -1e4).astype(np.float32)} if model.graph.input[3].name == "pad" else {"keep": kept}
    return [{n: np.random.default_rng(i).standard_normal((2, 7, 16)).astype(np.float32) for n in "qkv"} | mask for i in range(2)]


@pytest.mark.parametrize("model", [_expand_mul(np.array(2.0, np.float32)), _expand_mul(np.array(2.0, np.float32), shared=True),
                                   _and_where(np.ones((1, 1, 7, 1), bool))], ids=["expand", "expand-read-elsewhere", "and-all-true"])
def test_broadcast_is_dropped_and_an_expand_read_elsewhere_stays(model: onnx.ModelProto) -> None:
    shared = len(model.graph.output) > 1
    feeds = _feeds(model)
    out, report = fuse(model, "ort-cuda", feeds, families=[mask_broadcast.FAMILY])
    assert report.counts()[mask_broadcast.FAMILY] == 1 and not report.families[0].rolled_back, report.families
    assert _mask_shapes(out) == [[2, 1, 1, 7]] and not _query_wide(out)
    assert [n.op_type for n in out.graph.node].count("Expand") == int(shared), "an Expand stays only for its other reader"
    for feed in feeds:
        want, got = run(session(model, optimize=False), feed), run(session(out, optimize=False), feed)
        for name, value in want.items():
            np.testing.assert_array_equal(got[name], value, err_msg=name)


@pytest.mark.parametrize("model", [_expand_mul(np.tril(np.ones((1, 1, 7, 7), np.float32))), _and_where(np.tril(np.ones((1, 1, 7, 7), bool))),
                                   _and_where(np.ones((1, 1, 7, 1), bool) & (np.arange(7) > 0).reshape(1, 1, 7, 1))],
                         ids=["mul-causal", "and-causal", "and-not-all-true"])
def test_per_query_operand_refuses(model: onnx.ModelProto) -> None:
    out, report = fuse(model, "ort-cuda", _feeds(model), families=[mask_broadcast.FAMILY], debug=True)
    assert report.counts()[mask_broadcast.FAMILY] == 0 and _mask_shapes(out) == [[2, 1, 7, 7]]
    (family,) = report.families
    assert not family.rolled_back and family.matches == {mask_broadcast.FAMILY: 0, f"{mask_broadcast.FAMILY}_batch": 0}, "the rules refuse it (not the guard)"
    assert any("without its broadcasts the Mask is [2, 1, 7, 7]" in r for r in family.near_misses.get(mask_broadcast.FAMILY, [])), family.near_misses


def test_only_ort_cuda_lowers_it() -> None:
    assert mask_broadcast.rules("ort-cuda") and not mask_broadcast.rules("ort-cpu") and not mask_broadcast.rules("tensorrt")


def test_gpt2_causal_mask_built_at_the_batch_size_becomes_one_constant_row(tmp_path) -> None:
    """GPT-2 exported with a dynamic batch and a static sequence (bench/gpu_quant.py's fp8 artefact): HF expands the
    position ids to the batch and builds its causal and packed-sequence mask from them (Expand, Slice, CumSum,
    GatherND, Equal, And...: [B, 1, S, S], every batch row the same). mask_batch hands every FusedMHA its one
    batch row as a constant; the outputs stay bit-equal to the graph without the family at another batch."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=100, n_embd=64, n_layer=2, n_head=4, n_positions=32, use_cache=False)
    ids = torch.randint(0, config.vocab_size, (2, 16))
    path = tmp_path / "gpt2.onnx"
    deployfuse.export(transformers.GPT2Model(config).eval().half(), path, example_inputs={"input_ids": ids}, dynamic=[DynamicAxis("input_ids", 0, "batch")],
                      target="ort-cuda", precision="fp16", fuse=False, verify=False)
    model = onnx.load(path)
    draws = [{"input_ids": np.random.default_rng(seed).integers(0, config.vocab_size, (3, 16))} for seed in range(2)]
    families = ["attention", "packed_mha"]
    without, _ = fuse(model, "ort-cuda", draws[:1], families=families)
    fused, report = fuse(model, "ort-cuda", draws[:1], families=[*families, mask_broadcast.FAMILY])
    (family,) = [f for f in report.families if f.family == mask_broadcast.FAMILY]
    assert family.matches.get(f"{mask_broadcast.FAMILY}_batch") == 2 and not family.rolled_back, family
    assert {"GatherND", "CumSum", "Expand"} <= {n.op_type for n in without.graph.node}
    assert not {"GatherND", "CumSum", "Expand", "And", "Where"} & {n.op_type for n in fused.graph.node}
    initializers = {i.name: i for i in fused.graph.initializer}
    masks = {n.input[3] for n in fused.graph.node if n.op_type == "FusedMHA"}
    assert len(masks) == 1 and list(initializers[masks.pop()].dims) == [1, 1, 16, 16]
    for feed in draws:
        want, got = run(session(without, optimize=False), feed), run(session(fused, optimize=False), feed)
        for name, value in want.items():
            np.testing.assert_array_equal(got[name], value, err_msg=name)


def _batch_mask(rows: list[onnx.NodeProto]) -> onnx.ModelProto:
    """q, k, v [B, 7, 16]; `rows` make "mask" [B, 1, 7, 7] from B = Shape(q)[0] ("batch", [1]) and "tril" [1, 1, 7, 7]."""
    inits = [numpy_helper.from_array(np.tril(np.ones((1, 1, 7, 7), np.float32)), "tril"), numpy_helper.from_array(np.array([1, 7, 7], np.int64), "rest")]
    nodes = [helper.make_node("Shape", ["q"], ["batch"], end=1), *rows, helper.make_node("FusedMHA", ["q", "k", "v", "mask"], ["y"], domain="deployfuse", num_heads=2)]
    graph = helper.make_graph(nodes, "masked", [helper.make_tensor_value_info(n, F32, ["B", 7, 16]) for n in "qkv"], [helper.make_tensor_value_info("y", F32, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("deployfuse", 1)], ir_version=10)
    attach_functions(model)
    return onnx.shape_inference.infer_shapes(model, data_prop=True)


def test_batch_rows_only_when_provably_equal() -> None:
    """An Expand of a constant over the batch becomes its row; a mask reading the batch index as data (rows differ) is
    left alone by the rule itself."""
    expanded = _batch_mask([helper.make_node("Concat", ["batch", "rest"], ["shape"], axis=0), helper.make_node("Expand", ["tril", "shape"], ["mask"])])
    zero, one = numpy_helper.from_array(np.array(0, np.int64), "zero"), numpy_helper.from_array(np.array(1, np.int64), "one")
    by_index = _batch_mask([helper.make_node("Squeeze", ["batch"], ["b"]), helper.make_node("Range", ["zero", "b", "one"], ["index"]),
                            helper.make_node("Cast", ["index"], ["indexf"], to=F32),
                            helper.make_node("Unsqueeze", ["indexf", "axes"], ["column"]), helper.make_node("Mul", ["column", "tril"], ["mask"])])
    by_index.graph.initializer.extend([zero, one, numpy_helper.from_array(np.array([1, 2, 3], np.int64), "axes")])
    by_index = onnx.shape_inference.infer_shapes(by_index, data_prop=True)
    draws = [{n: np.random.default_rng(i).standard_normal((3, 7, 16)).astype(np.float32) for n in "qkv"} for i in range(2)]
    for model, rewritten in ((expanded, 1), (by_index, 0)):
        out, report = fuse(model, "ort-cuda", draws, families=[mask_broadcast.FAMILY], debug=True)
        (family,) = report.families
        assert family.matches.get(f"{mask_broadcast.FAMILY}_batch") == rewritten and not family.rolled_back, family
        masks = [n.input[3] for n in out.graph.node if n.op_type == "FusedMHA"]
        assert (masks[0] in {i.name for i in out.graph.initializer}) == bool(rewritten), "the Mask is its batch row, as a constant"
        for feed in draws:
            np.testing.assert_array_equal(run(session(out, optimize=False), feed)["y"], run(session(model, optimize=False), feed)["y"])
