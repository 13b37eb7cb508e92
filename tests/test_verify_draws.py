"""Verification that a wrong model cannot pass: branches on tensor values, several input draws
with padded masks, and fp16 judged against the fp32 model (issue 18, sections 2 and 4)."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
import torch

import deployfuse
from deployfuse.errors import AccuracyError, DeployfuseError, UsageError
from deployfuse.inputs import InputSpec, make_inputs


class SignBranch(torch.nn.Module):
    """Data-dependent Python control flow: the branch depends on the input's values."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return self.linear(x)
        return -self.linear(x)


class SkipsMaskWhenFull(torch.nn.Module):
    """Mean over tokens that takes a shortcut when no token is padded (like attention code that
    drops an all-ones mask): a trace with an all-ones mask keeps only the shortcut."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(50, 8)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        if attention_mask.all():
            return h.mean(1)
        mask = attention_mask.unsqueeze(-1).to(h.dtype)
        return (h * mask).sum(1) / mask.sum(1)


def _token_inputs() -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 50, (3, 6))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def test_branch_on_tensor_values_is_refused_with_the_tracers_warning(cli, tmp_path):
    torch.manual_seed(0)
    module = SignBranch().eval()
    model, out, report = tmp_path / "branch.pt", tmp_path / "branch.onnx", tmp_path / "branch.json"
    torch.save(module, model)
    torch.save((torch.randn(2, 8),), tmp_path / "x.pt")
    code, _, err = cli("export", model, "--trust-pickle", "--example-inputs", tmp_path / "x.pt", "-o", out, "--report", report)

    assert code == 1 and not out.exists()
    assert "data-dependent control flow" in err and "if x.sum() > 0:" in err and "--allow-traced-control-flow" in err
    data = json.loads(report.read_text())
    dynamo, torchscript = data["export_attempts"]
    assert "data-dependent control flow" in dynamo["error"] and "if x.sum() > 0:" in dynamo["error"]
    [found] = torchscript["data_dependent"]
    assert found["code"] == "if x.sum() > 0:" and found["location"].endswith(f"test_verify_draws.py:{SignBranch.forward.__code__.co_firstlineno + 1}")
    assert "Converting a tensor to a Python boolean" in found["warning"]


def test_dynamo_alone_names_the_data_dependent_line(tmp_path):
    with pytest.raises(DeployfuseError, match=r"data-dependent control flow at .*test_verify_draws.py:\d+ `if x.sum\(\) > 0:`"):
        deployfuse.export(SignBranch().eval(), tmp_path / "x.onnx", example_inputs=(torch.randn(2, 8),), exporter="dynamo", fuse=False)
    assert not (tmp_path / "x.onnx").exists()


def test_an_accepted_branch_is_still_caught_by_several_draws(tmp_path):
    """With the flag the trace is exported, but draws that take the other branch fail it."""
    module = SignBranch().eval()
    with pytest.raises(AccuracyError, match=r"differs from PyTorch .* on [1-8] of 8 input draws") as caught:
        deployfuse.export(module, tmp_path / "x.onnx", example_inputs=(torch.ones(2, 8),), fuse=False,
                          allow_traced_control_flow=True, verify_draws=8, seed=0)
    assert not (tmp_path / "x.onnx").exists(), caught.value


def test_padded_masks_catch_a_trace_that_assumed_no_padding(tmp_path):
    """Traced with an all-ones mask, the ONNX model ignores padding: the first draw (all ones)
    passes, every padded draw fails. Before, masks were always ones and this was 'verified'."""
    torch.manual_seed(0)
    module, example = SkipsMaskWhenFull().eval(), _token_inputs()
    with pytest.raises(AccuracyError, match="data-dependent control flow"):
        deployfuse.export(module, tmp_path / "x.onnx", example_inputs=example, fuse=False)

    result = None
    with pytest.raises(AccuracyError, match=r"on 2 of 3 input draws"):
        result = deployfuse.export(module, tmp_path / "x.onnx", example_inputs=example, fuse=False, allow_traced_control_flow=True,
                                   report_path=tmp_path / "r.json")
    assert result is None and not (tmp_path / "x.onnx").exists()
    report = json.loads((tmp_path / "r.json").read_text())
    assert [all(o["passed"] for o in v["outputs"]) for v in report["verify"]] == [True, False, False]
    assert report["export_attempts"][-1]["data_dependent"][0]["code"] == "if attention_mask.all():"


def test_padding_masks_keep_a_valid_token_in_every_row():
    specs = [InputSpec("input_ids", (4, 7), torch.int64), InputSpec("attention_mask", (4, 7), torch.int64), InputSpec("pad_mask", (2, 3, 5), torch.bool)]
    for seed in range(20):
        padded = make_inputs(specs, torch.nn.Embedding(30, 4), seed, pad_masks=True)
        for name in ("attention_mask", "pad_mask"):
            mask = padded[name].to(torch.int64)
            assert mask.dtype == torch.int64 and set(mask.unique().tolist()) <= {0, 1}
            assert (mask[..., 0] == 1).all(), "every row keeps its first token"
            assert (mask.diff(dim=-1) <= 0).all(), "padding sits at the end of a row"
            assert (mask.reshape(-1, mask.shape[-1])[0] == 0).any(), "the first row is padded"
        assert padded["input_ids"].max() < 30
    plain = make_inputs(specs, torch.nn.Embedding(30, 4), 0)
    assert (plain["attention_mask"] == 1).all() and plain["pad_mask"].all()
    assert not torch.equal(make_inputs(specs, None, 1)["input_ids"], make_inputs(specs, None, 2)["input_ids"])


def test_report_says_how_many_draws_at_which_shapes_and_seeds_repeat(tmp_path):
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.GELU()).eval()
    kwargs = dict(example_inputs=(torch.randn(2, 6),), dynamic=[deployfuse.DynamicAxis("input", 0, "batch")], fuse=False, verify_draws=2, seed=11)
    first = deployfuse.export(module, tmp_path / "a.onnx", **kwargs).report
    again = deployfuse.export(module, tmp_path / "b.onnx", **kwargs).report

    assert first.verification["draws_per_shape"] == 2 and first.verification["seeds"] == [11, 12, 13, 14]
    assert first.verification["shapes"] == ["input=2x6", "input=3x6"]
    assert [(v["draw"], v["shapes"]["input"]) for v in first.verify] == [(0, [2, 6]), (1, [2, 6]), (0, [3, 6]), (1, [3, 6])]
    assert [v["outputs"] for v in first.verify] == [v["outputs"] for v in again.verify], "a seed repeats a verification"
    assert "2 input draw(s) at each of 2 shape(s)" in next(s.detail for s in first.steps if s.name == "verify")
    with pytest.raises(UsageError, match="verify-draws"):
        deployfuse.export(module, tmp_path / "c.onnx", example_inputs=(torch.randn(2, 6),), verify_draws=0)


def test_verify_draws_flag_is_checked_before_any_work(cli, tmp_path):
    code, _, err = cli("export", "no_such_module:build", "-o", tmp_path / "x.onnx", "--verify-draws", "0")
    assert code == 2 and "--verify-draws 0" in err and not (tmp_path / "x.onnx").exists()


class Cancels(torch.nn.Module):
    """(x + 1024) - 1024: exact in fp32; in fp16 the sum keeps no fraction (ulp 1 at 1024)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x + 1024.0) - 1024.0


def test_fp16_is_judged_against_the_fp32_model(tmp_path):
    """ONNX Runtime's CPU runs this fp16 Add -> Sub in fp32 (it casts around ops without fp16
    kernels and drops the casts between them), so the file is exact; PyTorch in fp16 rounds
    the sum to whole numbers. Judged against PyTorch fp16, as before, this export failed."""
    x = torch.randn(4, 64)
    report = deployfuse.export(Cancels(), tmp_path / "x.onnx", example_inputs=(x,), precision="fp16", fuse=False).report
    assert report.verification["reference"] == "PyTorch fp32 (the model before the cast to fp16)"
    for check in report.verify:
        [o] = check["outputs"]
        assert o["passed"] and o["max_abs_error"] < 1e-3 and o["same_precision_rel_error"] > 0.05
    session = ort.InferenceSession(str(tmp_path / "x.onnx"), providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x.half().numpy()})[0]
    assert np.abs(got.astype(np.float32) - x.half().float().numpy()).max() < 1e-3, "the file keeps the fraction"


def test_fp16_report_shows_errors_against_fp32_and_fp16_pytorch(tmp_path):
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.LayerNorm(64), torch.nn.GELU(), torch.nn.Linear(64, 16)).eval()
    out = tmp_path / "half.onnx"
    report = deployfuse.export(module, out, example_inputs=(torch.randn(4, 32),), precision="fp16", fuse=False).report

    assert report.verification["reference"].startswith("PyTorch fp32") and report.verification["rtol"] == 1e-2
    for check in report.verify:
        [o] = check["outputs"]
        assert o["passed"] and 0 < o["max_rel_error"] <= 1e-2 and 0 < o["same_precision_rel_error"] <= 1e-2
    assert "vs fp32" in next(s.detail for s in report.steps if s.name == "verify")
    assert "rel err vs PyTorch in the same precision" in report.table()
    # Independently: the fp16 file against the fp32 module on fresh inputs.
    x = torch.randn(4, 32)
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x.half().numpy()})[0].astype(np.float32)
    with torch.inference_mode():
        want = module(x.half().float()).numpy()
    assert np.abs(got - want).max() <= 1e-2 * np.abs(want).max()


def test_an_output_that_vanishes_in_pytorch_is_named_in_the_verify_step(tmp_path):
    """MobileViT built from its default config with random weights ends in values near 1e-40: such an output passes on the
    absolute floor alone, and the step says so instead of printing a large relative error beside "ok"."""
    module = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Tanh()).eval()
    with torch.no_grad():
        module[0].weight.mul_(1e-38)
        module[0].bias.mul_(1e-38)
    report = deployfuse.export(module, tmp_path / "x.onnx", example_inputs=(torch.randn(2, 8),), fuse=False).report
    verify = next(s for s in report.steps if s.name == "verify")
    (output,) = report.verify[0]["outputs"]
    assert verify.status == "ok" and output["near_zero"] and output["name"] in verify.detail and "proves little" in verify.detail
    assert output["max_rel_error"] < 1e-20
