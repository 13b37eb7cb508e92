"""Bad input to `deployfuse export`: one line on stderr, exit code 2, nothing written."""

from __future__ import annotations

import pytest
import torch
import zoo


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
