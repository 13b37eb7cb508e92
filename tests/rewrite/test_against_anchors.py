"""deployfuse fuses every zoo model at least as far as the tools a user could pick instead.

On the same export, deployfuse's ORT targets are held against onnxscript's `optimize_for_ort`
and the ORT transformers optimizer (for the architectures it knows). An anchor whose output ORT
will not load sets no bar; onnxscript's GPT-2 graph loads once bench/anchors.py's repair gives its
output projections their 2-D input back, as the benchmark does. Per kind of fused op, deployfuse
must have at least as many; and at most as many nodes left. One exception, measured: on ort-cpu
pre-norm residual adds stay unfused (skip_layernorm.py says why), so there each skip
fusion an anchor has and deployfuse lacks allows one node more.
"""

from __future__ import annotations

import collections
import sys
import tempfile
from pathlib import Path

import onnx
import pytest
from _export import build, exported, fused

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from anchors import flatten_attention_into_gemm  # noqa: E402

KINDS = {
    "attention": {"Attention", "MultiHeadAttention", "GroupQueryAttention", "PackedAttention", "PackedMultiHeadAttention"},
    # EmbedLayerNormalization: the embeddings' lookups and their LayerNorm (embed_layer_norm, ort-cuda)
    "norm": {"LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "RMSNormalization",
             "EmbedLayerNormalization"},
    "skip": {"SkipLayerNormalization", "SkipSimplifiedLayerNormalization"},
    "gelu": {"Gelu", "FastGelu", "BiasGelu", "QuickGelu"},
    "rotary": {"RotaryEmbedding"},
}
ORT_OPTIMIZER_TYPES = {"bert": "bert", "gpt2": "gpt2", "vit": "vit"}
CASES = [(m, e) for m in ("bert", "gpt2", "vit", "llama", "whisper_encoder", "resnet18", "convnext") for e in ("dynamo", "torchscript")
         if (m, e) not in {("gpt2", "torchscript"), ("llama", "torchscript")}]  # TorchScript cannot export these two


def fusion_depth(model: onnx.ModelProto) -> dict[str, int]:
    """Fused ops per kind, and the nodes left (Constants aside)."""
    ops = collections.Counter(n.op_type for n in model.graph.node)
    # a GELU computed in a GEMM's epilogue (deployfuse.GemmAct) is a fused GELU too
    ops["Gelu"] += sum(any(a.name == "activation" and a.s.startswith(b"gelu") for a in n.attribute) for n in model.graph.node if n.op_type == "GemmAct")
    depth = {kind: sum(ops[o] for o in names) for kind, names in KINDS.items()}
    depth["nodes"] = sum(count for op, count in ops.items() if op != "Constant")
    return depth


def _loads_in_ort(model: onnx.ModelProto) -> bool:
    import onnxruntime as ort

    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:
        return False
    return True


def _onnxscript(model: onnx.ModelProto) -> onnx.ModelProto:
    import onnx_ir as ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # the IR shares the proto's messages, and optimize_for_ort changes them
    ir_model = ir.serde.deserialize_model(copy)
    optimize_for_ort(ir_model)
    flatten_attention_into_gemm(ir_model)  # what a user of onnxscript's GPT-2 graph must do for ORT to load it
    return ir.serde.serialize_model(ir_model)


def _ort_optimizer(name: str, model: onnx.ModelProto) -> onnx.ModelProto:
    from onnxruntime.transformers.optimizer import optimize_model

    config = build(name)[0].config
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.onnx"
        onnx.save(model, str(path))
        optimized = optimize_model(str(path), model_type=ORT_OPTIMIZER_TYPES[name], num_heads=config.num_attention_heads,
                                   hidden_size=config.hidden_size, opt_level=0)
    return optimized.model


def anchors(name: str, exporter: str) -> dict[str, onnx.ModelProto]:
    """The anchors' outputs that ORT loads, by anchor name."""
    plain = exported(name, exporter)
    made = {"onnxscript": lambda: _onnxscript(plain)}
    if name in ORT_OPTIMIZER_TYPES:
        made["ort-optimizer"] = lambda: _ort_optimizer(name, plain)
    out = {}
    for anchor, make in made.items():
        try:
            model = make()
        except Exception:  # an anchor that crashes sets no bar
            continue
        if _loads_in_ort(model):
            out[anchor] = model
    return out


@pytest.mark.parametrize(("name", "exporter"), CASES)
def test_fused_at_least_as_far_as_the_anchors(name, exporter):
    bars = {anchor: fusion_depth(model) for anchor, model in anchors(name, exporter).items()}
    assert bars, "no anchor produced a loadable model"
    for target in ("ort-cpu", "ort-cuda"):
        ours = fusion_depth(fused(name, exporter, target)[0])
        for anchor, theirs in bars.items():
            for kind in KINDS:
                if kind == "skip" and target == "ort-cpu":
                    continue
                assert ours[kind] >= theirs[kind], f"{target}: {kind} {ours[kind]} < {anchor}'s {theirs[kind]} ({ours} vs {theirs})"
            allowance = max(theirs["skip"] - ours["skip"], 0) if target == "ort-cpu" else 0
            assert ours["nodes"] <= theirs["nodes"] + allowance, f"{target}: {ours['nodes']} nodes left, {anchor} leaves {theirs['nodes']} ({ours} vs {theirs})"
