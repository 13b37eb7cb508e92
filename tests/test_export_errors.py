"""Bad input to `deployfuse export`: one line on stderr, exit code 2, nothing written."""

from __future__ import annotations

import sys

import onnx
import pytest
import torch
import zoo

import deployfuse
from deployfuse.inputs import InputSpec


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    module, example = zoo.resnet18()
    torch.jit.save(torch.jit.trace(module, example["x"]), folder / "resnet.ts")
    torch.save(module.state_dict(), folder / "weights.pt")
    torch.save(module, folder / "pickled.pt")
    (folder / "notes.txt").write_text("not a model\n")
    return folder


def _assert_refused(cli, tmp_path, args, message):
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir(exist_ok=True)
    code, stdout, stderr = cli("export", *args, "-o", out) if "-o" not in args else cli("export", *args)
    assert code == 2, (stdout, stderr)
    assert message in stderr, stderr
    assert "Traceback" not in stderr
    assert not any(out.parent.iterdir()), "nothing may be written on bad input"
    return stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.pt"], "model not found"),
        (["notes.txt"], "not a PyTorch model file"),
        (["weights.pt", "--input", "x:1x3x64x64"], "holds weights (a state dict), not a model"),
        (["pickled.pt", "--input", "x:1x3x64x64"], "--trust-pickle"),
        (["resnet.ts", "--input", "x:1x3x64"], "the model rejects inputs x:1x3x64:float32"),
        (["resnet.ts"], "no inputs to export with: give --input NAME:SHAPE[:DTYPE] for x"),
        (["resnet.ts", "--input", "image:1x3x64x64"], "the model's inputs are x"),
        (["resnet.ts", "--example-inputs", "nowhere.pt"], "example inputs file not found"),
        (["resnet.ts", "--input", "x:1x3x64x64", "--dynamic", "y:0:batch"], "not among the inputs"),
        (["no_such_package.module:build"], "cannot import 'no_such_package.module'"),
    ],
)
def test_bad_model_or_inputs(cli, tmp_path, models, monkeypatch, args, message):
    monkeypatch.chdir(models)
    _assert_refused(cli, tmp_path, args, message)


@pytest.mark.parametrize("flag", [["--input", "x:1by3"], ["--dynamic", "x:zero:batch"], ["--target", "tpu"]])
def test_malformed_flags(cli, tmp_path, models, flag):
    _assert_refused(cli, tmp_path, [str(models / "resnet.ts"), *flag], "error:")


@pytest.mark.parametrize(("output", "message"), [("missing/dir/m.onnx", "does not exist"), ("/proc/m.onnx", "not writable")])
def test_bad_output_location(cli, tmp_path, models, output, message):
    target = output if output.startswith("/") else str(tmp_path / output)
    code, _, stderr = cli("export", models / "resnet.ts", "--input", "x:1x3x64x64", "-o", target)
    assert code == 2 and message in stderr


# --- findings of issue 18: each test failed before its fix -----------------------------------


def _dims(path):
    model = onnx.load(str(path))
    return {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}


def test_a_dynamic_axis_spreads_to_inputs_that_share_it(tmp_path):
    """The README's Python example marks only input_ids:1 dynamic; attention_mask has the same
    size on that axis, so it becomes dynamic too (it used to stay static and break the export)."""
    from conftest import assert_onnx_matches_torch

    from examples.tiny_bert import build

    result = deployfuse.export("examples.tiny_bert:build", tmp_path / "bert.onnx", dynamic=[deployfuse.DynamicAxis("input_ids", 1, "seq")], fuse=False, verify=False)
    assert _dims(result.onnx_path) == {"input_ids": [2, "seq"], "attention_mask": [2, "seq"]}
    assert "attention_mask:1:seq" in result.report.dynamic
    assert "also dynamic, sharing the size: attention_mask:1:seq" in result.report.steps[0].detail
    module, _ = build()
    ids = torch.randint(0, 1000, (2, 45))
    assert_onnx_matches_torch(result.onnx_path, module, {"input_ids": ids, "attention_mask": torch.ones_like(ids)})


def _small_cnn() -> torch.nn.Module:
    """Conv, BatchNorm, ReLU, global average pool (a ReduceMean), Linear: a ResNet in small."""
    torch.manual_seed(0)
    layers = [torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4)]
    return torch.nn.Sequential(*layers).eval()


@pytest.mark.parametrize(("source", "opset"), [("module", 17), ("torchscript", 23)])
def test_the_file_has_the_opset_the_report_records(tmp_path, source, opset):
    """--opset is honoured by every exporter (TorchScript writes at most 20 by itself; dynamo
    writes 18 when asked for less), or refused with the supported range (see test_bad_inputs)."""
    model = _small_cnn()
    if source == "torchscript":
        torch.jit.save(torch.jit.trace(model, torch.randn(1, 3, 16, 16)), tmp_path / "cnn.ts")
        model = tmp_path / "cnn.ts"
    result = deployfuse.export(model, tmp_path / "m.onnx", inputs=[InputSpec("input", (1, 3, 16, 16))], opset=opset)
    written = next(i.version for i in onnx.load(str(result.onnx_path)).opset_import if i.domain in ("", "ai.onnx"))
    assert written == result.report.opset == opset


def test_bf16_exports_unfused_and_unverified_or_says_why_not(tmp_path):
    """ONNX Runtime's CPU provider has no bfloat16 Conv: the export says so in one line instead
    of a traceback inside fuse, and without fuse and verify it writes the bf16 model."""
    with pytest.raises(deployfuse.UsageError, match="cannot run this bfloat16 model"):
        deployfuse.export(_small_cnn(), tmp_path / "m.onnx", inputs=[InputSpec("input", (1, 3, 16, 16))], precision="bf16")
    assert not any(tmp_path.iterdir())
    result = deployfuse.export(_small_cnn(), tmp_path / "m.onnx", inputs=[InputSpec("input", (1, 3, 16, 16))], precision="bf16", fuse=False, verify=False)
    weights = onnx.load(str(result.onnx_path)).graph.initializer
    assert {w.data_type for w in weights if w.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.BFLOAT16)} == {onnx.TensorProto.BFLOAT16}


class _TwoInputs(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.linear(x).relu() + y.sum(dim=1, keepdim=True)


def test_a_pt2_program_keeps_its_dynamic_axes(tmp_path):
    """The program's symbolic batch (shared by both inputs) stays dynamic without --dynamic."""
    batch = torch.export.Dim("batch")
    program = torch.export.export(_TwoInputs().eval(), (torch.randn(3, 4), torch.randn(3, 2)), dynamic_shapes=({0: batch}, {0: batch}))
    torch.export.save(program, tmp_path / "dyn.pt2")
    result = deployfuse.export(tmp_path / "dyn.pt2", tmp_path / "m.onnx")
    dims = _dims(result.onnx_path)
    assert isinstance(dims["x"][0], str) and dims["x"][0] == dims["y"][0] and dims["x"][1] == 4
    assert len({tuple(v["shapes"]["x"]) for v in result.report.verify}) == 2  # verified at a second batch


def test_a_pickled_module_whose_class_is_in_the_current_folder_loads(cli, tmp_path, monkeypatch):
    (tmp_path / "my_models.py").write_text("import torch\n\nclass Mine(torch.nn.Module):\n    def forward(self, x):\n        return x * 2 + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import my_models

    torch.save(my_models.Mine(), tmp_path / "mine.pt")
    monkeypatch.delitem(sys.modules, "my_models")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in (str(tmp_path), "", ".")])
    monkeypatch.chdir(tmp_path)
    code, _, stderr = cli("export", "mine.pt", "--trust-pickle", "-o", "mine.onnx", "--input", "x:2x3", "-q")
    assert code == 0, stderr
    assert (tmp_path / "mine.onnx").is_file()


def test_the_python_api_takes_the_flags_string_forms(tmp_path):
    """export's and compare's inputs= and dynamic= take `--input` / `--dynamic` strings as the CLI does (they used to
    fail with an AttributeError deep inside); the file matches the one the typed specs give."""
    from conftest import assert_onnx_matches_torch

    model = _small_cnn()
    typed = deployfuse.export(model, tmp_path / "typed.onnx", inputs=[InputSpec("input", (2, 3, 16, 16))],
                              dynamic=[deployfuse.DynamicAxis("input", 0, "batch")], fuse=False, verify=False)
    text = deployfuse.export(model, tmp_path / "text.onnx", inputs=["input:2x3x16x16:float32"], dynamic=["input:0:batch"], fuse=False, verify=False)
    assert _dims(text.onnx_path) == _dims(typed.onnx_path) == {"input": ["batch", 3, 16, 16]}
    assert_onnx_matches_torch(text.onnx_path, model, {"input": torch.randn(5, 3, 16, 16)})
    checked = deployfuse.compare(model, text.onnx_path, inputs=["input:2x3x16x16:float32"], dynamic=["input:0:batch"], backends=("torch", "ort-cpu"),
                                 iterations=0)
    assert checked.passed and len({a.feed for a in checked.accuracy}) == 2  # the second feed at a resized batch


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dynamic": "input:0:batch"}, "dynamic= takes a list of DynamicAxis or strings, e.g. ['input_ids:0:batch'], not a str"),
        ({"dynamic": [{"input": 0}]}, "dynamic= takes DynamicAxis or strings like 'input_ids:0:batch', not the dict"),
        ({"inputs": [(1, 3, 16, 16)]}, "inputs= takes InputSpec or strings like 'input_ids:1x128:int64', not the tuple"),
        ({"dynamic": ["input:batch"]}, "--dynamic 'input:batch': expected NAME:AXIS:LABEL"),
    ],
)
def test_the_python_api_refuses_other_spec_forms_with_one_line(tmp_path, kwargs, message):
    with pytest.raises(deployfuse.UsageError) as refused:
        deployfuse.export(_small_cnn(), tmp_path / "m.onnx", **{"inputs": [InputSpec("input", (1, 3, 16, 16))], **kwargs})
    assert message in str(refused.value)
    assert not any(tmp_path.iterdir()), "nothing may be written on bad input"
