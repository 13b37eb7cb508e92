"""embed_layer_norm: BERT-style word + position (+ segment) lookups and their LayerNorm become one
com.microsoft.EmbedLayerNormalization on ort-cuda, computing what the graph before the rule
computes (ORT CPU, optimisations off) on fresh inputs: token ids over the whole vocabulary, random
token types, attention masks with padding, at shapes other than the export's.

Real transformers models from small configs with random weights, exported as `deployfuse export`
does (the exporter, then its cleanups): BERT with token_type_ids as an input (positions Sliced
from the position_ids buffer), the zoo's BERT without them (its all-zero token_type_ids buffer
folded into the position rows) with dynamic and static shapes (the static export constant-folds
the position lookup) and the TorchScript exporter (the forms the form matrix shares, cached),
DistilBERT (no segment embedding). RoBERTa's positions, computed from the input ids with a
padding offset, and a BERT position_ids buffer that is not 0..N-1 are passed as position_ids;
GPT-2's embedding sum, also the residual stream, keeps its graph. fp32 only on CPU: ONNX Runtime's CPU kernel of the op is float32 (its fp16 kernel is the
CUDA one, run on the H200, not here).
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import numpy as np
import onnx
import pytest
import torch
import transformers
from _export import _trained_like
from _forms import BASE, Form, exported

from deployfuse.backends.ort import run, session
from deployfuse.export import clean, flatten_outputs, to_onnx
from deployfuse.inputs import DynamicAxis
from deployfuse.loading import load_model
from deployfuse.pipeline import DEFAULT_OPSET
from deployfuse.rewrite import RULE_TAG, fuse
from deployfuse.rewrite.report import FamilyResult
from deployfuse.rewrite.rules import embed_layer_norm

VOCAB, POSITIONS, TYPES = 96, 40, 2
SMALL: dict[str, Any] = {"vocab_size": VOCAB, "max_position_embeddings": POSITIONS, "num_hidden_layers": 1, "num_attention_heads": 2}


def _bert() -> transformers.PreTrainedModel:
    return transformers.BertModel(transformers.BertConfig(hidden_size=32, intermediate_size=64, type_vocab_size=TYPES, **SMALL))


def _distilbert() -> transformers.PreTrainedModel:
    return transformers.DistilBertModel(transformers.DistilBertConfig(vocab_size=VOCAB, max_position_embeddings=POSITIONS, dim=32, hidden_dim=64,
                                                                      n_layers=1, n_heads=2))


def _roberta() -> transformers.PreTrainedModel:
    return transformers.RobertaModel(transformers.RobertaConfig(hidden_size=32, intermediate_size=64, type_vocab_size=1, pad_token_id=1, **SMALL))


def _feeds(model: onnx.ModelProto, batch: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    """Token ids over the whole vocabulary (the word table's rows), random token types, masks padded
    at the end of each row but the first."""
    rng = np.random.default_rng(seed)
    lengths = np.concatenate([[seq], rng.integers(1, seq + 1, batch - 1)])
    vocab = max(t.dims[0] for t in model.graph.initializer if len(t.dims) == 2)
    values = {"input_ids": rng.integers(0, vocab, (batch, seq)), "token_type_ids": rng.integers(0, TYPES, (batch, seq)),
              "attention_mask": (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int64)}
    return {i.name: values[i.name] for i in model.graph.input}


@functools.cache
def _export(build: str, names: tuple[str, ...]) -> onnx.ModelProto:
    """The model `build` makes (random weights) exported and cleaned as `deployfuse export` does,
    with inputs `names` at [2, 12], batch and sequence dynamic."""
    torch.manual_seed(0)
    model = {"bert": _bert, "distilbert": _distilbert, "roberta": _roberta}[build]()
    _trained_like(model)
    loaded = load_model(model.eval())
    rng = np.random.default_rng(0)
    example = {n: torch.from_numpy(rng.integers(0, TYPES, (2, 12))) for n in names}
    axes = [DynamicAxis(n, a, label) for n in names for a, label in ((0, "batch"), (1, "seq"))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outputs = list(flatten_outputs(loaded(example)))
        exported, _ = to_onnx(loaded, example, axes, outputs, DEFAULT_OPSET, ("dynamo",))
    return clean(exported)


def _fused(model: onnx.ModelProto, target: str = "ort-cuda") -> tuple[onnx.ModelProto, FamilyResult]:
    """`model` with the embed_layer_norm family alone applied (guarded on one padded batch), and its result."""
    dims = [d.dim_value or 12 for d in model.graph.input[0].type.tensor_type.shape.dim]  # a static export's own shape
    out, report = fuse(model, target, [_feeds(model, dims[0], dims[1], seed=1)], debug=True, families=["embed_layer_norm"])
    (family,) = report.families
    assert not family.rolled_back, family.reason
    return out, family


def _assert_same(original: onnx.ModelProto, rewritten: onnx.ModelProto, shapes: tuple[tuple[int, int], ...]) -> None:
    """Both graphs on fresh inputs at each (batch, seq), ORT graph optimisations off."""
    want_session, got_session = session(original, optimize=False, threads=1), session(rewritten, optimize=False, threads=1)
    for batch, seq in shapes:
        feed = _feeds(original, batch, seq, seed=100 + batch * seq)
        want, got = run(want_session, feed), run(got_session, feed)
        for name, ref in want.items():
            assert got[name].shape == ref.shape
            scale = float(np.abs(ref).max())
            error = float(np.abs(got[name].astype(np.float64) - ref).max())
            assert error <= 1e-5 * scale, f"[{batch}, {seq}] {name}: max abs error {error:.3e} (scale {scale:.3e})"


def _embed_node(model: onnx.ModelProto) -> onnx.NodeProto:
    (node,) = [n for n in model.graph.node if n.op_type == "EmbedLayerNormalization"]
    assert node.domain == "com.microsoft" and {p.key: p.value for p in node.metadata_props}.get(RULE_TAG) == "embed_layer_norm"
    return node


def _produced_by(model: onnx.ModelProto, value: str) -> str:
    return next((n.op_type for n in model.graph.node if value in n.output), value)


def _ops(model: onnx.ModelProto, *op_types: str) -> int:
    return sum(n.op_type in op_types for n in model.graph.node)


def test_bert_embeddings_become_one_node() -> None:
    """BERT given token_type_ids: one node reads both id inputs (cast to int32), the word, position
    and segment tables and the norm's γ, β and ε; no position_ids (the buffer is 0..N-1); its
    mask_index output is named (the CUDA kernel writes it) and read by nothing; the three lookups,
    two Adds and the norm go."""
    model = _export("bert", ("input_ids", "attention_mask", "token_type_ids"))
    out, family = _fused(model)
    assert family.matches == {"embed_layer_norm": 1}, family
    node = _embed_node(out)
    assert len(node.input) == 7 and node.input[1], list(node.input)  # mask and position_ids absent
    assert [_produced_by(out, node.input[i]) for i in (0, 1)] == ["Cast", "Cast"]
    tables = {t.name: onnx.numpy_helper.to_array(t) for t in out.graph.initializer}
    assert [tables[node.input[i]].shape for i in (2, 3, 4)] == [(VOCAB, 32), (POSITIONS, 32), (TYPES, 32)]
    (epsilon,) = [a.f for a in node.attribute if a.name == "epsilon"]
    assert epsilon == pytest.approx(1e-12)
    assert len(node.output) == 2 and node.output[1] and not any(node.output[1] in n.input for n in out.graph.node)
    assert not [n for n in out.graph.node if n.op_type == "Gather" and n.input[0] in node.input], "a table is still gathered"
    assert _ops(out, "LayerNormalization") == _ops(model, "LayerNormalization") - 1 and _ops(out, "Add") == _ops(model, "Add") - 2
    _assert_same(model, out, ((3, 9), (1, POSITIONS)))


@pytest.mark.parametrize("form", [BASE, Form(shapes="static"), Form(exporter="torchscript")], ids=lambda f: f.name)
def test_zoo_bert_folds_the_zero_segment_row(form: Form) -> None:
    """The zoo's BERT, called without token_type_ids, reads its all-zero buffer: the segment table's
    row 0 is added to the position rows (all of them; a static export's folded [0, S) rows), and
    the node has no segment input; the zero ids' GatherElements goes with the lookup. TorchScript's
    dynamic export leaves the zero ids' shape unknown (it could broadcast wider than the word ids):
    they stay the segment ids, whose shape the kernel checks."""
    model = exported("bert", form).model
    out, family = _fused(model)
    assert family.matches == {"embed_layer_norm": 1}, family
    node = _embed_node(out)
    folded = form.exporter == "dynamo" or form.shapes == "static"
    assert [bool(name) for name in node.input] == [True, not folded, True, True, not folded, True, True], list(node.input)
    (positions,) = [t.dims for t in out.graph.initializer if t.name == node.input[3]]
    assert list(positions) == [16 if form.shapes == "static" else 128, 64]
    assert (_ops(out, "GatherElements") == 0) == folded
    _assert_same(model, out, ((2, 16),) if form.shapes == "static" else ((3, 9), (1, 128)))


def test_distilbert_has_no_segment_input() -> None:
    """DistilBERT (word + position only) fuses without segment ids or table."""
    model = _export("distilbert", ("input_ids", "attention_mask"))
    out, family = _fused(model)
    assert family.matches == {"embed_layer_norm": 1}, family
    node = _embed_node(out)
    assert [bool(name) for name in node.input] == [True, False, True, True, False, True, True], list(node.input)
    _assert_same(model, out, ((3, 9), (1, 5)))


def test_positions_not_proven_arange_are_passed_as_position_ids() -> None:
    """RoBERTa's positions come from the input ids (padding offset), and a BERT position buffer whose
    first entry is not 0 is not 0..N-1: both fuse with those ids as position_ids (cast to int32;
    RoBERTa's all-zero token types folded into the position rows), and compute what the graph did."""
    roberta = _export("roberta", ("input_ids", "attention_mask"))
    out, family = _fused(roberta)
    assert family.matches == {"embed_layer_norm": 1}, family
    node = _embed_node(out)
    assert [bool(name) for name in node.input] == [True, False, True, True, False, True, True, False, True], list(node.input)
    (cast,) = [n for n in out.graph.node if node.input[8] in n.output]
    assert cast.op_type == "Cast" and cast.input[0] not in {i.name for i in out.graph.input}  # the ids RoBERTa computes
    _assert_same(roberta, out, ((3, 9), (1, 5)))
    shifted = onnx.ModelProto()
    shifted.CopyFrom(_export("bert", ("input_ids", "attention_mask", "token_type_ids")))
    (buffer,) = [t for t in shifted.graph.initializer if t.name.endswith("position_ids")]
    values = onnx.numpy_helper.to_array(buffer).copy()
    values[0, 0] = 1  # still valid positions, no longer arange
    buffer.CopyFrom(onnx.numpy_helper.from_array(values, buffer.name))
    out, family = _fused(shifted)
    assert family.matches == {"embed_layer_norm": 1}, family
    node = _embed_node(out)
    assert len(node.input) == 9 and not node.input[7], list(node.input)
    (cast,) = [n for n in out.graph.node if node.input[8] in n.output]
    assert cast.op_type == "Cast" and _produced_by(out, cast.input[0]) == "Slice"  # the buffer's [0, S), [1, S] broadcast over the batch
    _assert_same(shifted, out, ((3, 9), (1, POSITIONS)))


def test_a_sum_read_elsewhere_is_refused() -> None:
    """GPT-2's token + position embeddings feed ln_1 and the residual stream: the sum stays, and so does the norm."""
    out, family = _fused(exported("gpt2", BASE).model)
    assert family.matches == {"embed_layer_norm": 0} and _ops(out, "EmbedLayerNormalization") == 0, family
    assert "the embedding sum is read by another node too" in family.near_misses["embed_layer_norm"], family.near_misses


def test_only_ort_cuda_lowers_it() -> None:
    """ort-cpu keeps its Gathers (CPU lookups are cheap), TensorRT parses no com.microsoft op."""
    assert embed_layer_norm.rules("ort-cuda")
    assert not embed_layer_norm.rules("ort-cpu") and not embed_layer_norm.rules("tensorrt")


def test_an_export_applies_it_only_with_cuda_graph(tmp_path):
    """ORT's kernel synchronises the stream on every uncaptured call (rules.CUDA_GRAPH_ONLY): `deployfuse export` fuses
    the embeddings only for --cuda-graph, and that artefact computes what the plain one does."""
    import deployfuse

    torch.manual_seed(0)
    model = _bert().eval()
    ids = torch.randint(0, VOCAB, (2, 12))
    example = {"input_ids": ids, "token_type_ids": torch.randint(0, TYPES, (2, 12)), "attention_mask": torch.ones_like(ids)}
    outputs, seed = {}, int(torch.randint(0, 1 << 30, ()))
    for graph in (False, True):
        result = deployfuse.export(model, tmp_path / f"graph{graph}.onnx", example_inputs=example, target="ort-cuda", static=True,
                                   cuda_graph=graph, verify=False)
        artefact = onnx.load(result.onnx_path)
        assert sum(n.op_type == "EmbedLayerNormalization" for n in artefact.graph.node) == graph
        outputs[graph] = run(session(artefact, optimize=False), _feeds(artefact, 2, 12, seed))
    assert outputs[True].keys() == outputs[False].keys()
    for name, value in outputs[False].items():
        np.testing.assert_allclose(outputs[True][name], value, rtol=1e-4, atol=1e-4, err_msg=name)
