"""`deployfuse export` end to end on real models: every MODEL form, dynamic axes, the report.

Each exported file is checked again here, independently of deployfuse's own verification:
ORT with graph optimisations off against the original PyTorch module on fresh random inputs.
"""

from __future__ import annotations

import json

import onnx
import pytest
import torch
import zoo
from conftest import assert_onnx_matches_torch

import deployfuse
from deployfuse.inputs import DynamicAxis, make_inputs, resized, specs_of


@pytest.mark.parametrize("name", ["bert", "gpt2", "vit", "resnet18"])
def test_zoo_model_exports_and_matches_pytorch_at_two_shapes(name, tmp_path):
    entry = zoo.ZOO[name]
    module, example = entry.build()
    out = tmp_path / f"{name}.onnx"
    result = deployfuse.export(module, out, example_inputs=example, dynamic=entry.dynamic, fuse=False)

    assert out.is_file() and result.report.exporter == "dynamo"
    assert onnx.load(out, load_external_data=False).ir_version <= 10, "ONNX Runtime 1.2x reads IR <= 10"
    if name == "resnet18":  # every BN folded into its conv before export
        assert result.report.fold["counts"]["conv-bn"] == 20
        assert "BatchNormalization" not in result.report.op_histogram
    assert len(result.report.verification["shapes"]) == 2, "a dynamic export is verified at a second shape"
    assert len(result.report.verify) == 2 * result.report.verification["draws_per_shape"]
    for shape in (specs_of(example), resized(specs_of(example), entry.dynamic, grow=2)):
        assert_onnx_matches_torch(out, module, make_inputs(shape, module))


@pytest.mark.parametrize("name", ["bert", "llama"])
def test_torchscript_exporter_on_transformers(name, tmp_path):
    entry = zoo.ZOO[name]
    module, example = entry.build()
    example["attention_mask"] = torch.ones_like(example["input_ids"])  # transformers' TorchScript path needs one
    dynamic = [*entry.dynamic, DynamicAxis("attention_mask", 0, "batch"), DynamicAxis("attention_mask", 1, "seq")] if name == "llama" else entry.dynamic
    out = tmp_path / f"{name}.onnx"
    result = deployfuse.export(module, out, example_inputs=example, dynamic=dynamic, exporter="torchscript")
    assert result.report.exporter == "torchscript" and len(result.report.verification["shapes"]) == 2
    assert_onnx_matches_torch(out, module, make_inputs(resized(specs_of(example), dynamic, grow=2), module))


def test_factory_form_with_example_inputs_and_report(cli, tmp_path):
    out, report = tmp_path / "bert.onnx", tmp_path / "bert.json"
    code, stdout, _ = cli("export", "examples.tiny_bert:build", "-o", out, "--report", report, "--no-fuse",
                          "--dynamic", "input_ids:1:seq", "--dynamic", "attention_mask:1:seq")
    assert code == 0, stdout
    data = json.loads(report.read_text())
    assert data["form"] == "factory" and data["exporter"] == "dynamo"
    assert [s["name"] for s in data["steps"]] == ["load", "fold", "export", "clean", "fuse", "verify", "save"]
    assert all(s["seconds"] >= 0 for s in data["steps"]) and data["op_histogram"]["MatMul"] > 0
    assert {o["name"] for o in data["verify"][0]["outputs"]} == {"last_hidden_state", "pooler_output"}
    assert "last_hidden_state" in stdout and "wrote" in stdout

    from examples.tiny_bert import build

    module, example = build()
    assert_onnx_matches_torch(out, module, make_inputs(resized(specs_of(example), [DynamicAxis("input_ids", 1, "seq"), DynamicAxis("attention_mask", 1, "seq")]), module))


def _resnet(tmp_path):
    module, example = zoo.resnet18()
    return module, example["x"]


def test_torchscript_archive(cli, tmp_path):
    module, x = _resnet(tmp_path)
    path = tmp_path / "r.ts"
    torch.jit.save(torch.jit.trace(module, x), path)
    out = tmp_path / "r.onnx"
    code, stdout, err = cli("export", path, "-o", out, "--input", "x:1x3x64x64", "--dynamic", "x:0:batch", "--no-fuse")
    assert code == 0, err
    assert "torchscript" in stdout
    assert_onnx_matches_torch(out, module, {"x": torch.randn(3, 3, 64, 64)})


def test_exported_program_carries_its_example_inputs(cli, tmp_path):
    module, x = _resnet(tmp_path)
    path = tmp_path / "r.pt2"
    torch.export.save(torch.export.export(module, (x,)), path)
    out = tmp_path / "r.onnx"
    code, _, err = cli("export", path, "-o", out, "--no-fuse")
    assert code == 0, err
    assert_onnx_matches_torch(out, module, {"x": torch.randn(2, 3, 64, 64)})


def test_pickled_module_needs_trust_pickle(cli, tmp_path):
    module, x = _resnet(tmp_path)
    path, inputs = tmp_path / "r.pt", tmp_path / "in.pt"
    torch.save(module, path)
    torch.save((x,), inputs)
    out = tmp_path / "r.onnx"
    code, _, err = cli("export", path, "-o", out, "--example-inputs", inputs)
    assert code == 2 and "--trust-pickle" in err and not out.exists()
    code, _, err = cli("export", path, "-o", out, "--example-inputs", inputs, "--trust-pickle", "--no-fuse")
    assert code == 0, err
    assert_onnx_matches_torch(out, module, {"x": torch.randn(2, 3, 64, 64)})


def test_batch_of_one_stays_dynamic(tmp_path):
    module, example = zoo.gpt2()
    ids = example["input_ids"][:1]
    out = tmp_path / "g.onnx"
    deployfuse.export(module, out, example_inputs={"input_ids": ids}, dynamic=zoo.ZOO["gpt2"].dynamic, fuse=False)
    assert_onnx_matches_torch(out, module, {"input_ids": torch.randint(0, 512, (4, 9))})


class _Noisy(torch.nn.Module):
    """Adds fresh noise on every call: no export can reproduce it, so verification must fail."""

    def forward(self, x):
        return x + torch.rand_like(x)


def test_accuracy_failure_exits_1_and_writes_no_model(cli, tmp_path):
    path, out, report = tmp_path / "noisy.pt", tmp_path / "noisy.onnx", tmp_path / "noisy.json"
    torch.save(_Noisy(), path)
    code, _, err = cli("export", path, "-o", out, "--input", "x:4x8", "--trust-pickle", "--report", report)
    assert code == 1, err
    assert "differs from PyTorch" in err and not out.exists()
    assert json.loads(report.read_text())["error"]


def test_large_models_use_external_data(tmp_path):
    from deployfuse.pipeline import save_model

    module = torch.nn.Linear(64, 32)
    x = torch.randn(2, 64)
    out = tmp_path / "lin.onnx"
    deployfuse.export(module, out, example_inputs=(x,), fuse=False)
    save_model(onnx.load(out), tmp_path / "ext.onnx", external_data_threshold=1024)
    assert (tmp_path / "ext.onnx.data").stat().st_size >= 64 * 32 * 4
    assert_onnx_matches_torch(tmp_path / "ext.onnx", module, {"input": torch.randn(2, 64)})


def test_ort_cuda_artefact_carries_its_provider_options(tmp_path):
    from deployfuse.backends.ort import artefact_provider_options

    # ResNet-like (8 Conv2d of 64 channels): NHWC without measurement only there (pipeline.cuda_provider_options)
    module = torch.nn.Sequential(*[m for _ in range(8) for m in (torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.ReLU())])
    x = torch.randn(1, 64, 8, 8)
    out = tmp_path / "conv.onnx"
    deployfuse.export(module, out, example_inputs=(x,), target="ort-cuda", precision="fp16", cuda_graph=True, verify=False)
    assert artefact_provider_options(out) == {"prefer_nhwc": "1", "enable_cuda_graph": "1"}
    deployfuse.export(module, out, example_inputs=(x,), target="ort-cuda")
    assert artefact_provider_options(out) == {"prefer_nhwc": "1"}, "no CUDA graph unless asked"
    deployfuse.export(module[:2], out, example_inputs=(x,), target="ort-cuda")
    assert artefact_provider_options(out) == {}, "one convolution (a patch embedding) is not worth NHWC's transposes"
    deployfuse.export(torch.nn.Linear(4, 4), out, example_inputs=(torch.randn(2, 4),), target="ort-cuda")
    assert artefact_provider_options(out) == {}, "no convolutions, nothing to ask for"
    deployfuse.export(torch.nn.Linear(4, 4), out, example_inputs=(torch.randn(2, 4),), target="ort-cuda", tf32=False)
    assert artefact_provider_options(out) == {"use_tf32": "0"}


def test_fp32_attention_artefacts_ask_for_memory_efficient_attention():
    """ORT uses its fp32 memory-efficient attention only from 256 tokens unless sdpa_kernel is set."""
    from onnx import TensorProto, helper

    from deployfuse.pipeline import cuda_provider_options

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])
    attention = helper.make_model(helper.make_graph([helper.make_node("MultiHeadAttention", ["x", "x", "x"], ["y"], domain="com.microsoft", num_heads=2)],
                                                    "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16])]))
    assert cuda_provider_options(attention, cuda_graph=False, precision="fp32") == {"sdpa_kernel": "2"}
    assert cuda_provider_options(attention, cuda_graph=False, precision="fp16") == {}, "fp16 keeps ORT's flash / cuDNN choice"
    plain = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16])]))
    assert cuda_provider_options(plain, cuda_graph=False, precision="fp32") == {}


def test_no_tf32_needs_the_cuda_target(cli, tmp_path):
    path = tmp_path / "m.pt"
    torch.save(torch.nn.Linear(4, 4), path)
    code, _, err = cli("export", path, "-o", tmp_path / "m.onnx", "--trust-pickle", "--input", "input:2x4", "--no-tf32")
    assert code == 2 and "--target ort-cuda" in err and not (tmp_path / "m.onnx").exists()


def test_cuda_graph_refuses_dynamic_shapes(cli, tmp_path):
    path = tmp_path / "m.pt"
    torch.save(torch.nn.Linear(4, 4), path)
    code, _, err = cli("export", path, "-o", tmp_path / "m.onnx", "--trust-pickle", "--input", "input:2x4",
                       "--target", "ort-cuda", "--cuda-graph", "--dynamic", "input:0:batch")
    assert code == 2 and "static shapes" in err


class _UsesDeployfuseOp(torch.nn.Module):
    """A user's model that calls a deployfuse op directly."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 32, bias=False)
        self.bias = torch.nn.Parameter(torch.randn(32))

    def forward(self, x):
        return torch.ops.deployfuse.bias_act(self.linear(x), self.bias, "silu")


def test_model_calling_a_deployfuse_op_exports_it_as_one_node(tmp_path):
    import deployfuse.ops.torch_ops  # noqa: F401  (registers torch.ops.deployfuse.*)

    module, out = _UsesDeployfuseOp().eval(), tmp_path / "op.onnx"
    result = deployfuse.export(module, out, example_inputs=(torch.randn(2, 5, 16),), dynamic=[DynamicAxis("x", 1, "seq")], fuse=False)
    model = onnx.load(out)
    assert [n.op_type for n in model.graph.node if n.domain == "deployfuse"] == ["BiasAct"]
    assert {f.name for f in model.functions} == {"BiasAct"}, "the function body travels with the node"
    assert len(result.report.verification["shapes"]) == 2
    assert_onnx_matches_torch(out, module, {"x": torch.randn(2, 7, 16)})


def test_autotune_times_every_matched_family(cli, tmp_path):
    module, example = zoo.bert()
    path, inputs, report = tmp_path / "bert.pt", tmp_path / "in.pt", tmp_path / "bert.json"
    torch.save(module, path)
    torch.save(example, inputs)
    code, stdout, err = cli("export", path, "-o", tmp_path / "bert.onnx", "--trust-pickle", "--example-inputs", inputs, "--autotune", "--report", report)
    assert code == 0, err
    families = [f for f in json.loads(report.read_text())["fusion"]["families"] if sum(f["matches"].values()) and not f["rolled_back"]]
    assert families and all("autotune" in f for f in families)
    assert "ms)" in stdout, "the fusion table shows each family's timing"


def test_skip_fusion_leaves_that_family_out(cli, tmp_path):
    module, example = zoo.bert()
    path, inputs, out, report = tmp_path / "bert.pt", tmp_path / "in.pt", tmp_path / "bert.onnx", tmp_path / "bert.json"
    torch.save(module, path)
    torch.save(example, inputs)
    code, _, err = cli("export", path, "-o", out, "--trust-pickle", "--example-inputs", inputs, "--skip-fusion", "attention,skip_layernorm", "--report", report)
    assert code == 0, err
    fusion = json.loads(report.read_text())["fusion"]
    ran = {f["family"] for f in fusion["families"]}
    assert ran and not ran & {"attention", "skip_layernorm"}, ran
    assert fusion["skipped_by_request"] == ["attention", "skip_layernorm"], "the report says what was left out on purpose"
    ops = {n.op_type for n in onnx.load(out).graph.node}
    assert not ops & {"Attention", "MultiHeadAttention", "SkipLayerNormalization"}, ops
    assert "LayerNormalization" in ops, "the families not skipped still fuse"
    assert_onnx_matches_torch(out, module, example)

    code, _, err = cli("export", path, "-o", tmp_path / "no.onnx", "--trust-pickle", "--example-inputs", inputs, "--skip-fusion", "atention")
    assert code == 2 and "unknown fusion family atention" in err and "attention" in err, err
    assert not (tmp_path / "no.onnx").exists()


class _TinyEpsLayerNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(8, eps=1e-12)  # BERT's epsilon

    def forward(self, x):
        return self.norm(x)


@pytest.mark.parametrize("target", ["ort-cpu", "tensorrt"])
def test_a_tiny_layernorm_epsilon_survives_cleanup_and_fusion(tmp_path, target):
    """TorchScript at opset 16 writes LayerNorm decomposed, `+ 1e-12` included; dropping it as an
    addition of zero would turn a constant row into 0 / 0."""
    module = _TinyEpsLayerNorm().eval()
    out = tmp_path / "ln.onnx"
    deployfuse.export(module, out, example_inputs=(torch.randn(2, 4, 8),), exporter="torchscript", opset=16, target=target)
    x = torch.randn(2, 4, 8)
    x[0, 1] = 3.0  # zero variance
    assert_onnx_matches_torch(out, module, {"x": x})
    eps = [a.f for n in onnx.load(out).graph.node if n.op_type == "LayerNormalization" for a in n.attribute if a.name == "epsilon"]
    adds = [n for n in onnx.load(out).graph.node if n.op_type == "Add"]
    assert eps == [pytest.approx(1e-12)] or len(adds) == 2, (eps, [n.op_type for n in onnx.load(out).graph.node])


class _SdpaBlock(torch.nn.Module):
    """Self-attention through F.scaled_dot_product_attention, no explicit scale."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (torch.nn.Linear(64, 64) for _ in range(4))

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = (proj(x).view(b, n, 4, 16).transpose(1, 2) for proj in (self.q, self.k, self.v))
        return self.o(torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, 64))


def test_torchscript_sdpa_with_dynamic_shapes_fuses(tmp_path):
    """TorchScript computes SDPA's default scale from Shape(q)[-1] at run time; with a dynamic
    batch and sequence only that one dim is static, and the cleanup must fold it for the
    attention rule to read the scale."""
    module = _SdpaBlock().eval()
    out = tmp_path / "sdpa.onnx"
    dynamic = [DynamicAxis("x", 0, "batch"), DynamicAxis("x", 1, "seq")]
    result = deployfuse.export(module, out, example_inputs=(torch.randn(2, 8, 64),), dynamic=dynamic, exporter="torchscript")
    assert result.report.op_histogram.get("com.microsoft.Attention") == 1, result.report.op_histogram
    assert_onnx_matches_torch(out, module, {"x": torch.randn(3, 5, 64)})


def test_the_exporters_failed_folds_stay_off_the_terminal(tmp_path, caplog):
    """The dynamo exporter's optimizer and the cleanup log 'Evaluation failed: cannot reshape ...' at WARNING for each
    value they cannot fold (tiny BERT with a dynamic batch: five of them); the node just stays, so the export keeps those
    lines off the user's terminal. Other loggers' warnings still pass."""
    import logging

    from deployfuse.export.cleanup import FOLDING_LOGGER

    with caplog.at_level(logging.WARNING):
        result = deployfuse.export("examples.tiny_bert:build", tmp_path / "bert.onnx", dynamic=["input_ids:0:batch"], fuse=False, verify=False)
    assert result.onnx_path.exists()
    assert not [r.getMessage() for r in caplog.records if r.name == FOLDING_LOGGER]
    assert logging.getLogger(FOLDING_LOGGER).level == logging.NOTSET  # restored after the export
