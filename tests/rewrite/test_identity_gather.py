"""identity_gather: a GatherND reading its data at index grids becomes the data unsqueezed.

A tiny BertModel's fp8 ort-cuda export (dynamic batch and sequence, and static) reads its [B, S]
attention mask with a GatherND at Range / constant-arange grids in front of every FusedMHA Mask;
with the family no GatherND, Range or Expand is left in the Masks' cones, the Masks stay
[B, 1, 1, S], and the outputs equal those of the same export without the family, bit for bit, on
fresh padded inputs at another batch and sequence (ONNX Runtime CPU, optimisations off). On a
hand-built grid GatherND the rule rewrites the identity read and itself refuses its near misses:
swapped coordinates (a transpose), a Range from 1, batch_dims 1, indices shallower than the data.
A tiny RoBERTa still exports and verifies with it.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
import torch
import transformers
from onnx import helper, numpy_helper
from onnxscript.rewriter import pattern
from test_mask_broadcast import _assert_same, _mask_shapes

import deployfuse
from deployfuse.backends.ort import run, session
from deployfuse.inputs import DynamicAxis
from deployfuse.rewrite.fuser import fuse
from deployfuse.rewrite.rules import identity_gather

FAMILY = identity_gather.FAMILY
INDEX_OPS = {"GatherND", "Range", "Expand"}


def _mask_cone_ops(model: onnx.ModelProto) -> set[str]:
    """The op types computing the FusedMHA Masks."""
    producers = {o: n for n in model.graph.node for o in n.output}
    seen: set[str] = set()
    todo = [n.input[3] for n in model.graph.node if n.op_type == "FusedMHA"]
    while todo:
        name = todo.pop()
        if name in producers and name not in seen:
            seen.add(name)
            todo.extend(producers[name].input)
    return {producers[name].op_type for name in seen}


def _exports(tmp_path, dynamic: bool) -> dict[str, onnx.ModelProto]:
    """The tiny BERT's fp8 ort-cuda export with and without the family."""
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, max_position_embeddings=32)
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, config.vocab_size, (2, 16))
    example = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    axes = [DynamicAxis(n, axis, name) for n in example for axis, name in ((0, "batch"), (1, "seq"))] if dynamic else []
    artefacts = {}
    for name, skipped in (("with", ()), ("without", (FAMILY,))):
        result = deployfuse.export(model, tmp_path / f"{name}.onnx", example_inputs=example, dynamic=axes, target="ort-cuda", precision="fp8", seed=0,
                                   verify=False, skip_fusions=skipped)
        artefacts[name] = onnx.load(result.onnx_path)
        if not skipped:
            assert result.fusion is not None
            (family,) = [f for f in result.fusion.families if f.family == FAMILY]
            assert family.matches == {FAMILY: 1} and not family.rolled_back, family
    return artefacts


@pytest.mark.parametrize("dynamic", [True, False], ids=["dynamic", "static"])
def test_bert_fp8_mask_reads_the_padding_mask_unsqueezed(tmp_path, dynamic: bool) -> None:
    artefacts = _exports(tmp_path, dynamic)
    batch, seq = ("batch", "seq") if dynamic else (2, 16)
    assert INDEX_OPS & _mask_cone_ops(artefacts["without"]) == (INDEX_OPS if dynamic else {"GatherND"})
    assert not INDEX_OPS & _mask_cone_ops(artefacts["with"]), _mask_cone_ops(artefacts["with"])
    assert _mask_shapes(artefacts["with"]) == [[batch, 1, 1, seq]] * 2
    _assert_same(artefacts["with"], artefacts["without"], *((3, 12) if dynamic else (2, 16)))


def _grid_gather(order: tuple[int, int] = (0, 1), start: int = 0, batch_dims: int = 0, depth: int = 2, middle: bool = True) -> onnx.ModelProto:
    """y = GatherND(x [n, n], indices [n, 1, n, depth]) with batch_dims: indices[..., i] the `order[i]`-th of the row index
    Range(start, n, 1) at [n, 1, 1] and the column index Range(0, n, 1) at [1, 1, n], Expanded to their common shape;
    `depth` 1 keeps only the column index; without the `middle` axis the grids are [n, 1] and [1, n]."""
    ints = {"zero": 0, "first": start, "one": 1}
    inits = [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in ints.items()]
    rows, cols = ([1, 2], [0, 1]) if middle else ([1], [0])
    inits += [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in (("rows", rows), ("cols", cols), ("last", [-1]))]
    nodes = [helper.make_node("Shape", ["x"], ["s0"], start=0, end=1), helper.make_node("Squeeze", ["s0"], ["n0"]),
             helper.make_node("Range", ["first", "n0", "one"], ["r0"]), helper.make_node("Unsqueeze", ["r0", "rows"], ["g0"]),
             helper.make_node("Shape", ["x"], ["s1"], start=1, end=2), helper.make_node("Squeeze", ["s1"], ["n1"]),
             helper.make_node("Range", ["zero", "n1", "one"], ["r1"]), helper.make_node("Unsqueeze", ["r1", "cols"], ["g1"]),
             helper.make_node("Max", ["g0", "g1"], ["m"]), helper.make_node("Shape", ["m"], ["shape"])]
    for i in range(2):
        nodes += [helper.make_node("Expand", [f"g{i}", "shape"], [f"e{i}"]), helper.make_node("Unsqueeze", [f"e{i}", "last"], [f"u{i}"])]
    components = [f"u{i}" for i in order][-depth:]
    nodes += [helper.make_node("Concat", components, ["indices"], axis=-1), helper.make_node("GatherND", ["x", "indices"], ["y"], batch_dims=batch_dims)]
    graph = helper.make_graph(nodes, "grid_gather", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", "n"])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], inits)
    return onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10))


def _draws(n: int) -> list[dict[str, np.ndarray]]:
    return [{"x": np.random.default_rng(seed).standard_normal((n, n)).astype(np.float32)} for seed in range(2)]


@pytest.mark.parametrize("middle", [True, False], ids=["unsqueeze", "identity"])
def test_grid_gather_becomes_the_data_unsqueezed(middle: bool) -> None:
    model = _grid_gather(middle=middle)
    out, report = fuse(model, "ort-cuda", _draws(7), families=[FAMILY])
    assert report.counts()[FAMILY] == 1 and not report.families[0].rolled_back, report.families
    assert [n.op_type for n in out.graph.node if n.op_type != "Constant"] == ["Unsqueeze" if middle else "Identity"]
    for feed in _draws(5):  # another n than the guard's
        got, want = run(session(out, optimize=False), feed)["y"], run(session(model, optimize=False), feed)["y"]
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got, feed["x"][:, None] if middle else feed["x"])


@pytest.mark.parametrize(("model", "reason"), [
    (_grid_gather(order=(1, 0)), "is permuted"),
    (_grid_gather(start=1), "does not start at a constant 0"),
    (_grid_gather(batch_dims=1, depth=1), "batch_dims is not 0"),
    (_grid_gather(depth=1), "indices 1 deep into data of rank 2"),
], ids=["swapped", "range-from-1", "batch-dims", "shallow"])
def test_near_misses_refused_by_the_rule(model: onnx.ModelProto, reason: str) -> None:
    out, report = fuse(model, "ort-cuda", _draws(7), families=[FAMILY], debug=True)
    (family,) = report.families
    assert family.matches == {FAMILY: 0} and not family.rolled_back, family
    assert "GatherND" in {n.op_type for n in out.graph.node}
    assert any(reason in r for r in family.near_misses.get(FAMILY, [])), family.near_misses


def test_roberta_fp8_exports_and_verifies(tmp_path) -> None:
    torch.manual_seed(0)
    config = transformers.RobertaConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                                        max_position_embeddings=40)
    ids = torch.randint(3, config.vocab_size, (2, 16))
    example = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    result = deployfuse.export(transformers.RobertaModel(config).eval(), tmp_path / "roberta.onnx", example_inputs=example, target="ort-cuda",
                               precision="fp8", dynamic=[DynamicAxis(n, 0, "batch") for n in example], seed=0, accuracy_budget="cos=0.99,rel=0.2",
                               verify_draws=1)
    assert result.gate is not None and result.gate.passed and result.fusion is not None, result.gate
    (family,) = [f for f in result.fusion.families if f.family == FAMILY]
    assert family.matches == {FAMILY: 1} and not family.rolled_back, family
    assert not INDEX_OPS & _mask_cone_ops(onnx.load(result.onnx_path))


@pytest.mark.parametrize(("index", "matches"), [(0, 1), (-1, 1), (1, 0)], ids=["first", "last", "past-the-shape"])
def test_range_length_read_from_one_element_of_a_shape(index: int, matches: int) -> None:
    """GatherND(x [n], Unsqueeze(Range(0, Gather(Shape(x), index), 1))): the identity for index 0 or -1 (x's only dim); an index
    past the shape is refused by the rule, not raised out of it."""
    inits = [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in (("zero", 0), ("one", 1), ("index", index), ("last", [-1]))]
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "index"], ["n"], axis=0),
             helper.make_node("Range", ["zero", "n", "one"], ["r"]), helper.make_node("Unsqueeze", ["r", "last"], ["indices"]),
             helper.make_node("GatherND", ["x", "indices"], ["y"])]
    graph = helper.make_graph(nodes, "length", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n"])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], inits)
    model = ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10))
    assert pattern.RewriteRuleSet(identity_gather.rules("ort-cuda")).apply_to_model(model) == matches
    assert ("GatherND" in {n.op_type for n in model.graph}) is not bool(matches)
