"""`forward(self, *args)` modules in every loadable form: `--input` names, in order, become the
ONNX input names and the inputs are passed positionally (they used to go by keyword and fail)."""

from __future__ import annotations

import onnx
import torch
from _models import VarargsBert

INPUTS = ("--input", "input_ids:2x8:int64", "--input", "attention_mask:2x8:int64")


def _input_names(path) -> list[str]:
    return [i.name for i in onnx.load(str(path), load_external_data=False).graph.input]


def _export(cli, tmp_path, model: str, *flags: str) -> list[str]:
    out = tmp_path / "out.onnx"
    code, stdout, stderr = cli("export", model, "-o", out, "-q", *flags)
    assert code == 0, stdout + stderr
    return _input_names(out)


def test_factory_with_input_flags(cli, tmp_path) -> None:
    names = _export(cli, tmp_path, "_models:varargs_bert", *INPUTS, "--dynamic", "input_ids:1:seq", "--dynamic", "attention_mask:1:seq")
    assert names == ["input_ids", "attention_mask"]


def test_factory_with_positional_example_inputs(cli, tmp_path) -> None:
    assert _export(cli, tmp_path, "_models:varargs_bert_with_inputs", "--no-fuse") == ["input_0", "input_1"]


def test_pickled_module(cli, tmp_path) -> None:
    path = tmp_path / "wrapped.pt"
    torch.save(VarargsBert().eval(), path)
    assert _export(cli, tmp_path, str(path), "--trust-pickle", "--exporter", "torchscript", *INPUTS) == ["input_ids", "attention_mask"]


def test_exported_program(cli, tmp_path) -> None:
    # Unseeded again: its mask, named a_1, was drawn as token ids and failed 3 of 40 seeds (e.g. manual_seed(232),
    # --seed 1232) until verification took the example's 0/1 values for a mask (inputs.mask_like).
    ids = torch.randint(0, 512, (2, 8))
    path = tmp_path / "wrapped.pt2"
    torch.export.save(torch.export.export(VarargsBert().eval(), (ids, torch.ones_like(ids))), path)
    assert _export(cli, tmp_path, str(path), *INPUTS) == ["input_ids", "attention_mask"]
    assert _export(cli, tmp_path, str(path)) == ["a_0", "a_1"]  # its own example inputs, its own names


def test_exported_program_needs_every_input_named(cli, tmp_path) -> None:
    ids = torch.randint(0, 512, (2, 8))
    path = tmp_path / "wrapped.pt2"
    torch.export.save(torch.export.export(VarargsBert().eval(), (ids, torch.ones_like(ids))), path)
    code, out, err = cli("export", str(path), "-o", tmp_path / "x.onnx", INPUTS[0], INPUTS[1])
    assert code == 2 and "1 inputs named, but the program takes 2" in err + out
    assert not (tmp_path / "x.onnx").exists()
