"""Packed QKV: every self-attention layer of the zoo's BERT and ViT (both exporters) and Whisper
encoder, for ort-cpu and ort-cuda, becomes one com.microsoft.Attention in place of
MultiHeadAttention and the projection MatMuls / bias Adds / query scale, with the numbers of the
unfused graph (ORT optimisations off) on fresh inputs at two shapes; so do projections run on
the flattened tokens (Reshape -> Gemm -> Reshape) and GPT-2's already packed Conv1D
(Reshape -> Gemm -> Reshape -> Split); a BERT decoder's cross-attention stays
MultiHeadAttention, and a packed Gemm that is not x·W + b per token is refused with the reason."""

from __future__ import annotations

import functools
import warnings
import zlib

import numpy as np
import onnx
import onnx_ir as ir
import pytest
import torch
from _export import EXPORTERS, _trained_like, check_case, exported, feeds, fused, op_counts
from test_attention import assert_same_outputs
from zoo import ZOO

from deployfuse.export import clean
from deployfuse.rewrite import family_names, fuse, guard
from deployfuse.rewrite.rules import _projection, gemm_act, packed_qkv

ORT_TARGETS = ("ort-cpu", "ort-cuda")


@functools.cache
def fused_without(name: str, exporter: str, target: str, *skipped: str) -> onnx.ModelProto:
    """The same export fused by every family but `skipped`."""
    model = exported(name, exporter)
    out, _ = fuse(model, target, feeds(name, model, seed=1), families=[f for f in family_names() if f not in skipped])
    return out


def check_packed(name: str, exporter: str, target: str, removed: dict[str, int]) -> None:
    """Every layer packed: one Attention, no MultiHeadAttention, `removed` ops per layer gone,
    the fused node tagged, and the numbers of the unfused graph at two shapes."""
    layers = ZOO[name].layers
    model, counts, rolled = fused(name, exporter, target)
    assert not rolled, rolled
    assert counts["packed_qkv"] == layers, counts
    # counted without gemm_act on both sides (ort-cuda): it would take the linear layers packing leaves, and the projections unpacked
    counted = fused_without(name, exporter, target, "gemm_act") if gemm_act.rules(target) else model
    have, before = op_counts(counted), op_counts(fused_without(name, exporter, target, "packed_qkv", "split_qkv", "packed_mha", "gemm_act"))
    assert have.get("com.microsoft::Attention", 0) == layers and "com.microsoft::MultiHeadAttention" not in have, have
    assert {op: before.get(op, 0) - have.get(op, 0) for op in removed} == {op: n * layers for op, n in removed.items()}, (before, have)
    tags = {p.value for n in model.graph.node if n.op_type == "Attention" for p in n.metadata_props if p.key == "deployfuse.rule"}
    assert tags == {"packed_qkv"}
    assert_same_outputs(exported(name, exporter), model, seed=zlib.crc32(repr((name, exporter, target)).encode()) % 1000)


@pytest.mark.parametrize("target", ORT_TARGETS)
@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", ["bert", "vit"])
def test_self_attention_packs_into_attention(name: str, exporter: str, target: str) -> None:
    check_packed(name, exporter, target, {"MatMul": 3, "Add": 3})  # Q, K, V projections and their biases


@pytest.mark.parametrize("target", ORT_TARGETS)
@pytest.mark.parametrize("exporter", EXPORTERS)
def test_whisper_scaled_query_and_bias_free_key_pack(exporter: str, target: str) -> None:
    """Whisper: Q = (x·Wq + bq)·s, K = x·Wk (no bias), V = x·Wv + bv; from TorchScript each
    reaches the attention through a head split by `view(B, -1, H, hd)` and a merge back."""
    check_packed("whisper_encoder", exporter, target, {"MatMul": 3, "Add": 2, "Mul": 1})


@functools.cache
def opt_export() -> onnx.ModelProto:
    """A 2-layer OPTModel (pre-norm decoder, causal), dynamo-exported with dynamic batch and sequence: Q = (x·Wq + bq)·s, and
    every head split is `view(B, -1, H, hd)`, the sequence inferred (-1) and the batch given."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.OPTConfig(vocab_size=500, hidden_size=64, num_hidden_layers=2, ffn_dim=128, num_attention_heads=4,
                                 max_position_embeddings=64, word_embed_proj_dim=64, use_cache=False)
    module = transformers.OPTModel(cfg).eval()
    _trained_like(module)
    ids = torch.randint(0, 500, (2, 16))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    auto = {0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(module, (), kwargs=inputs, dynamo=True, dynamic_shapes={n: auto for n in inputs}, opset_version=18,
                                    optimize=True, verbose=False)
    return clean(program.model_proto)


@pytest.mark.parametrize("target", ORT_TARGETS)
def test_opt_heads_split_with_an_inferred_sequence_pack(target: str) -> None:
    """OPT splits heads by `view(B, -1, H, hd)`: S = B·S·H·hd / (B·H·hd) is proven once B, H and hd are, so the attention takes
    the projections themselves and each layer packs, its query scale folded in; the numbers of the unfused graph at two
    shapes, a padded batch among them. (The TorchScript export is not packed: its Q and K projections also feed Shape
    nodes, so they have other consumers; the dynamo exporter, tried first, writes none.)"""
    model = opt_export()
    rng = np.random.default_rng(zlib.crc32(target.encode()))
    feeds_ = []
    for batch, seq in ((2, 16), (3, 9)):
        mask = np.ones((batch, seq), np.int64)
        mask[0, seq // 2:] = 0
        feeds_.append({"input_ids": rng.integers(0, 500, (batch, seq)), "attention_mask": mask})
    out, report = fuse(model, target, feeds_[:1])
    counts, have = report.counts(), op_counts(out)
    assert not [f.family for f in report.families if f.rolled_back]
    assert counts["attention"] == 2 and counts["packed_qkv"] == 2, counts
    assert have.get("com.microsoft::Attention", 0) == 2 and "com.microsoft::MultiHeadAttention" not in have, have
    assert have.get("Mul", 0) <= 1 and have.get("Transpose", 0) == 0, have  # the query scales folded (a Mul may remain in the positions)
    guard.check(out, guard.run_outputs(model, feeds_, ["CPUExecutionProvider"]), feeds_, ["CPUExecutionProvider"])


@functools.cache
def bert_decoder() -> onnx.ModelProto:
    """The zoo's BERT as a decoder with cross-attention: self-attention on the tokens (causal),
    cross-attention with queries from the tokens and keys / values from `encoder_hidden_states`."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                                  max_position_embeddings=128, is_decoder=True, add_cross_attention=True, use_cache=False)
    module = transformers.BertModel(cfg, add_pooling_layer=False).eval()
    _trained_like(module)
    inputs = {"input_ids": torch.randint(0, 512, (2, 16)), "encoder_hidden_states": torch.randn(2, 8, 64)}
    auto = torch.export.Dim.AUTO
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(module, (), kwargs=inputs, dynamo=True, dynamic_shapes={"input_ids": {0: auto, 1: auto}, "encoder_hidden_states": {0: auto, 1: auto}},
                                    opset_version=18, optimize=True, verbose=False)
    return clean(program.model_proto)


def decoder_feeds(seed: int) -> list[dict[str, np.ndarray]]:
    """(batch, tokens, encoder length) = (2, 16, 8) and (3, 11, 5)."""
    rng = np.random.default_rng(seed)
    return [{"input_ids": rng.integers(0, 512, (b, s)), "encoder_hidden_states": rng.standard_normal((b, e, 64)).astype(np.float32)} for b, s, e in ((2, 16, 8), (3, 11, 5))]


def test_cross_attention_is_not_packed() -> None:
    model = bert_decoder()
    out, report = fuse(model, "ort-cpu", decoder_feeds(seed=1))
    counts, have = report.counts(), op_counts(out)
    assert not [f.family for f in report.families if f.rolled_back]
    assert counts["attention"] == 4 and counts["packed_qkv"] == 2, counts  # 2 layers x (self + cross)
    assert have.get("com.microsoft::Attention", 0) == 2 and have.get("com.microsoft::MultiHeadAttention", 0) == 2, have
    feeds_ = decoder_feeds(seed=5)
    guard.check(out, guard.run_outputs(model, feeds_, ["CPUExecutionProvider"]), feeds_, ["CPUExecutionProvider"])


def test_nothing_for_tensorrt() -> None:
    assert packed_qkv.rules("tensorrt") == []


@pytest.mark.parametrize("target", ORT_TARGETS)
def test_projections_on_flattened_tokens_pack(target: str) -> None:
    """Each projection as Reshape(x, [B·S, Din]) -> Gemm | MatMul -> Reshape(·, [B, S, H, hd])
    (addmm, a bias-free mm, a 2-D linear with transB): one Attention on x, nothing else left."""
    check_case("gemm_projections", "dynamo", target, {"attention": 1, "packed_qkv": 1},
               {"com.microsoft::Attention": 1, "Gemm": 0, "MatMul": 0, "Reshape": 0, "Transpose": 0})


def _flat_projection(back: list[int]) -> ir.Value:
    """x [2, 8, 32] -> Reshape [16, 32] -> Gemm(W, b) -> Reshape `back`, shapes inferred."""
    rng = np.random.default_rng(0)
    inits = [onnx.numpy_helper.from_array(a, n) for n, a in (("flat", np.array([16, 32])), ("back", np.array(back)),
                                                               ("w", rng.standard_normal((32, 32)).astype(np.float32)), ("b", rng.standard_normal(32).astype(np.float32)))]
    nodes = [onnx.helper.make_node("Reshape", ["x", "flat"], ["x2"]), onnx.helper.make_node("Gemm", ["x2", "w", "b"], ["y"]),
             onnx.helper.make_node("Reshape", ["y", "back"], ["out"]), onnx.helper.make_node("Identity", ["out"], ["z"])]
    graph = onnx.helper.make_graph(nodes, "g", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 8, 32])],
                                   [onnx.helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, None)], inits)
    model = onnx.shape_inference.infer_shapes(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)]))
    return next(v for n in ir.serde.deserialize_model(model).graph for v in n.outputs if v.name == "out")


def test_flattened_projection_needs_the_tokens_back_in_order() -> None:
    """Reshape back to x's [B, S, D] is x·W + b per token; to [S, B, D] it mixes tokens of different batches."""
    found = _projection.projection(_flat_projection([2, 8, 32]))
    assert not isinstance(found, str) and found.x.name == "x" and found.weight.shape == (32, 32) and found.bias.shape == (32,)
    assert _projection.projection(_flat_projection([8, 2, 32])) == "the flattened projection is not provably Reshape(x [B, S, Din], [B·S, Din]) back to x's B, S"


@pytest.mark.parametrize("target", ORT_TARGETS)
def test_gpt2_conv1d_packs_into_attention(target: str) -> None:
    """GPT-2's c_attn: Reshape(x, [B·S, D]) -> Gemm(W [D, 3D], b) -> Reshape([B, S, 3D]) -> Split in
    three: W is already [Wq | Wk | Wv], so each layer is Attention(x, W, b, ∅, ∅, mask)."""
    check_packed("gpt2", "dynamo", target, {"Split": 1, "Gemm": 1, "Reshape": 2})
    check_case("gpt2", "dynamo", target, {"attention": 2, "packed_qkv": 2},
               {"com.microsoft::Attention": 2, "com.microsoft::MultiHeadAttention": 0, "Split": 0})


def _conv1d_block(variant: str) -> onnx.ModelProto:
    """x [2, 8, 32] -> Reshape [16, 32] -> Gemm -> Reshape [2, 8, 96] -> Split(3) -> MultiHeadAttention
    (4 heads), the Gemm as `variant` writes it: "plain" (W [32, 96], b [96]), "folded" (W stored
    transposed, alpha 0.5, beta 2), "trans_a" (A given transposed, transA=1: the same numbers),
    "full_c" (C [16, 96], a bias per token)."""
    rng = np.random.default_rng(0)
    weight, bias = rng.standard_normal((32, 96)).astype(np.float32) / 6, rng.standard_normal(96).astype(np.float32)
    attrs: dict = {}
    a, tensors = "x2", {"flat": np.array([16, 32]), "back": np.array([2, 8, 96])}
    nodes = [onnx.helper.make_node("Reshape", ["x", "flat"], ["x2"])]
    if variant == "folded":
        weight, bias, attrs = weight.T * 2, bias / 2, {"transB": 1, "alpha": 0.5, "beta": 2.0}
    elif variant == "trans_a":
        nodes.append(onnx.helper.make_node("Transpose", ["x2"], ["x2t"], perm=[1, 0]))
        a, attrs = "x2t", {"transA": 1}
    elif variant == "full_c":
        bias = rng.standard_normal((16, 96)).astype(np.float32)
    tensors.update(w=np.ascontiguousarray(weight), b=bias)
    nodes += [onnx.helper.make_node("Gemm", [a, "w", "b"], ["y"], **attrs), onnx.helper.make_node("Reshape", ["y", "back"], ["qkv"]),
              onnx.helper.make_node("Split", ["qkv"], ["q", "k", "v"], axis=2, num_outputs=3),
              onnx.helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["out"], domain="com.microsoft", num_heads=4)]
    graph = onnx.helper.make_graph(nodes, "conv1d", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 8, 32])],
                                   [onnx.helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, [2, 8, 32])],
                                   [onnx.numpy_helper.from_array(v, n) for n, v in tensors.items()])
    opsets = [onnx.helper.make_opsetid("", 18), onnx.helper.make_opsetid("com.microsoft", 1)]
    return onnx.shape_inference.infer_shapes(onnx.helper.make_model(graph, opset_imports=opsets, ir_version=10))


@pytest.mark.parametrize(("variant", "reason"), [
    ("plain", None),
    ("folded", None),
    ("trans_a", "the packed Q|K|V projection: Gemm has transA=1 (the tokens would be its columns)"),
    ("full_c", "the packed Q|K|V projection: Gemm's C [16, 96] is not a row [D] or [1, D] (D = 96)"),
])
def test_packed_gemm_forms(variant: str, reason: str | None) -> None:
    """alpha, beta and transB fold into the packed weight and bias; transA and a C that is not one
    row are refused, and a --debug run says so."""
    model = _conv1d_block(variant)
    rng = np.random.default_rng(3)
    feeds_ = [{"x": rng.standard_normal((2, 8, 32)).astype(np.float32)} for _ in range(2)]
    out, report = fuse(model, "ort-cpu", feeds_, debug=True, families=["packed_qkv"])
    (family,) = report.families
    assert not family.rolled_back, family.reason
    have = op_counts(out)
    if reason is None:
        assert family.matches == {"packed_qkv": 1} and have == {"com.microsoft::Attention": 1}, (family.matches, have)
        guard.check(out, guard.run_outputs(model, feeds_, ["CPUExecutionProvider"]), feeds_, ["CPUExecutionProvider"])
    else:
        assert family.matches == {"packed_qkv": 0} and have["com.microsoft::MultiHeadAttention"] == 1
        assert family.near_misses == {"packed_qkv": [reason]}


def test_layers_sharing_their_weights_share_one_packed_weight() -> None:
    """ALBERT's layers share Wq, Wk, Wv, which the exporter may store once (its biases then come per layer, as here): two
    attention layers reading the same weights pack into one [Wq | Wk | Wv], not a second initializer of that name (which
    broke the graph: the guard rolled the family back), with the numbers of the unfused graph."""
    h = onnx.helper
    rng = np.random.default_rng()
    inits = [onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.3, name)
             for name, shape in (("wq", (16, 16)), ("wk", (16, 16)), ("wv", (16, 16)), *((f"b{p}{layer}", (16,)) for p in "qkv" for layer in (0, 1)))]
    nodes = []
    for layer, x in enumerate(("x", "y0")):
        for part in "qkv":
            nodes += [h.make_node("MatMul", [x, f"w{part}"], [f"{part}{layer}_mm"]), h.make_node("Add", [f"{part}{layer}_mm", f"b{part}{layer}"], [f"{part}{layer}"])]
        nodes.append(h.make_node("MultiHeadAttention", [f"q{layer}", f"k{layer}", f"v{layer}"], [f"y{layer}"], domain="com.microsoft", num_heads=2))
    graph = h.make_graph(nodes, "shared", [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 5, 16])],
                         [h.make_tensor_value_info("y1", onnx.TensorProto.FLOAT, [2, 5, 16])], inits,
                         value_info=[h.make_tensor_value_info("y0", onnx.TensorProto.FLOAT, [2, 5, 16])])  # the contrib op has no shape inference
    model = onnx.shape_inference.infer_shapes(h.make_model(graph, opset_imports=[h.make_opsetid("", 18), h.make_opsetid("com.microsoft", 1)]))
    feeds_ = [{"x": rng.standard_normal((2, 5, 16)).astype(np.float32)} for _ in range(2)]
    out, report = fuse(model, "ort-cpu", feeds_[:1], families=["packed_qkv"])
    (family,) = report.families
    assert not family.rolled_back and family.matches == {"packed_qkv": 2}, (family.reason, family.matches)
    assert op_counts(out) == {"com.microsoft::Attention": 2}
    assert len([t for t in out.graph.initializer if t.name.endswith("packed_qkv_weight")]) == 1, [t.name for t in out.graph.initializer]
    guard.check(out, guard.run_outputs(model, feeds_, ["CPUExecutionProvider"]), feeds_, ["CPUExecutionProvider"])
