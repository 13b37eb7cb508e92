"""BatchNorm folding: exact per case, only where the graph proves it safe, in every model form."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch import nn

import fold_models
import zoo
from deployfuse.fold import FoldReport, fold_batchnorm
from deployfuse.loading import load_model

RTOL = 1e-5  # relative to each output's max |value|: fp32 rounding, far below any real fold error


def assert_same_outputs(reference: nn.Module, folded: nn.Module, inputs: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        expected, actual = reference(**inputs), folded(**inputs)
    if isinstance(expected, torch.Tensor):
        expected, actual = {"output": expected}, {"output": actual}
    for case, want in expected.items():
        error = (actual[case] - want).abs().max().item()
        assert error <= RTOL * want.abs().max().item(), f"{case}: max abs error {error:.3g}"


def folded_counts() -> dict[str, int]:
    return {kind: len(names) for kind, names in fold_models.FOLDED.items()}


def skipped_names(report: FoldReport) -> set[str]:
    return {line.split(":", 1)[0] for line in report.skipped}


def test_every_case_folds_exactly_and_only_where_safe() -> None:
    model, example = fold_models.all_fold_cases()
    reference = copy.deepcopy(model)
    train_stats = model.bn_train.running_mean.clone()

    report = fold_batchnorm(model, example)

    assert report.method == "fx"
    assert report.counts == folded_counts()
    assert skipped_names(report) == set(fold_models.KEPT)
    for name in (n for names in fold_models.FOLDED.values() for n in names):
        assert isinstance(getattr(model, name), nn.Identity), name
    for name in fold_models.KEPT:
        assert isinstance(getattr(model, name), nn.modules.batchnorm._BatchNorm), name
    assert model.conv1d.bias is not None and model.convt2d.bias is not None  # bias-less layers gained one
    assert torch.equal(model.bn_train.running_mean, train_stats)  # tracing did not move training statistics
    assert_same_outputs(reference, model, fold_models.example_inputs(batch=3))
    json.dumps(report.to_dict())


def test_without_example_inputs_batchnorm1d_pairs_stay() -> None:
    """BatchNorm1d takes 2-D and 3-D input; without inputs the rank is unknown, so nothing is assumed."""
    model, _ = fold_models.all_fold_cases()
    reference = copy.deepcopy(model)

    report = fold_batchnorm(model)

    assert report.counts == {"conv-bn": 2, "convtranspose-bn": 2, "linear-bn": 0}
    unknown = {line.split(":")[0] for line in report.skipped if "rank" in line and "unknown" in line}
    assert unknown == {"bn_conv1d", "bn_convt1d", "bn_linear", "bn_linear3d"}
    assert_same_outputs(reference, model, fold_models.example_inputs())


def test_model_fx_cannot_trace_is_traced_with_torch_export() -> None:
    model, example = fold_models.untraceable_by_fx()
    reference = copy.deepcopy(model)

    untouched = fold_batchnorm(copy.deepcopy(model))
    assert untouched.counts["conv-bn"] == 0 and all("torch.fx cannot trace" in line for line in untouched.skipped)

    report = fold_batchnorm(model, example)
    assert report.method == "torch.export"
    assert report.counts == {"conv-bn": 1, "convtranspose-bn": 0, "linear-bn": 0}
    assert skipped_names(report) == {"bn_residual"}
    assert isinstance(model.bn, nn.Identity)
    assert_same_outputs(reference, model, {"x": torch.randn(4, 3, 8, 8)})


def test_resnet18_folds_all_twenty_batchnorms() -> None:
    model, example = zoo.resnet18()
    fold_models.randomise_batchnorms(model)
    reference = copy.deepcopy(model)

    report = fold_batchnorm(model, example)

    assert report.counts == {"conv-bn": 20, "convtranspose-bn": 0, "linear-bn": 0}
    assert report.skipped == []
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert_same_outputs(reference, model, {"x": torch.randn(2, 3, 64, 64)})


def _save(form: str, path: str) -> str:
    model, example = fold_models.all_fold_cases()
    if form == "pickle":
        torch.save(model, path)
    elif form == "exported-program":
        torch.export.save(torch.export.export(model, (), example, strict=False), path)
    elif form == "torchscript":
        torch.jit.save(torch.jit.script(model), path)
    else:
        return "fold_models:all_fold_cases"
    return path


# What each form folds. TorchScript (torch.jit.freeze) folds no ConvTranspose or Linear pair, and
# folds each call of the shared conv into its own constant weight, which is exact there.
EXPECTED = {
    "pickle": folded_counts(),
    "factory": folded_counts(),
    "exported-program": folded_counts(),
    "torchscript": {"conv-bn": 5, "convtranspose-bn": 0, "linear-bn": 0},
}


@pytest.mark.parametrize("form", list(EXPECTED))
def test_every_model_form_folds_in_place(form: str, tmp_path) -> None:
    source = _save(form, str(tmp_path / ("model.pt2" if form == "exported-program" else "model.pt")))
    loaded, reference = (load_model(source, trust_pickle=True) for _ in range(2))
    assert loaded.form == form
    if form != "exported-program":  # the loader puts every module in eval mode; the case wants one in training
        loaded.module.bn_train.train()
        reference.module.bn_train.train()
    example = loaded.example_inputs or fold_models.example_inputs()

    report = fold_batchnorm(loaded.module, example)

    assert report.counts == EXPECTED[form]
    assert {"bn_train", "bn_residual", "bn_no_stats", "bn_after_relu", "bn_linear3d", "bn_linear4d"} <= skipped_names(report)
    if form != "torchscript":
        assert skipped_names(report) == set(fold_models.KEPT)
    assert_same_outputs(reference.module, loaded.module, fold_models.example_inputs())  # fresh values; a .pt2 fixes the batch
