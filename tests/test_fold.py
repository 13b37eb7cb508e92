"""BatchNorm folding: exact per case, only where the graph proves it safe, in every model form."""

from __future__ import annotations

import copy
import json

import fold_models
import pytest
import torch
import zoo
from torch import nn

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


# ---- the ONNX-level fold (rewrite family `batchnorm_fold`), for what any exporter left ----

ONNX_FOLDED = ["conv1d", "conv2d", "conv3d", "convt1d", "convt2d", "convt3d", "linear", "shared"]
ONNX_KEPT = ["residual", "linear3d", "linear4d", "after_relu"]


def _bn_on_path(model, output: str) -> bool:
    """True when a BatchNormalization computes `output`, directly or through the nodes before it."""
    producer = {o: n for n in model.graph.node for o in n.output}
    frontier, seen = [output], set()
    while frontier:
        node = producer.get(frontier.pop())
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if node.op_type == "BatchNormalization":
            return True
        frontier.extend(node.input)
    return False


def _unfolded_export(module: nn.Module, example: dict[str, torch.Tensor], exporter: str, names: list[str]):
    from deployfuse.export import clean, to_onnx

    loaded = load_model(module)
    model, _ = to_onnx(loaded, example, (), names, 20, (exporter,))
    return loaded, clean(model)


def _fuse_fold_only(model, loaded, inputs: dict[str, torch.Tensor], names: list[str]):
    from deployfuse.export import flatten_outputs
    from deployfuse.rewrite import fuse
    from deployfuse.verify import compare_outputs

    fused, report = fuse(model, "ort-cpu", [{k: v.numpy() for k, v in inputs.items()}], families=["batchnorm_fold"])
    from deployfuse.backends.ort import run, session

    got = run(session(fused, optimize=False), {k: v.numpy() for k, v in inputs.items()})
    with torch.no_grad():
        want = dict(zip(names, flatten_outputs(loaded(inputs)).values()))
    bad = [c for c in compare_outputs(want, got, RTOL) if not c.passed]
    assert not bad, bad
    return fused, report


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_onnx_fold_after_either_exporter(exporter: str) -> None:
    """Exported without the PyTorch fold: every safe Conv / ConvTranspose / Gemm + BN pair is
    folded in the graph (each call of the shared conv too: it is a node of its own there), the
    unsafe ones stay, and the outputs equal PyTorch's on fresh inputs."""
    model, example = fold_models.all_fold_cases()
    model.bn_train.eval()
    names = [f"out_{case}" for case in model(**example)]  # unique: the dynamo exporter also names values after modules
    loaded, onnx_model = _unfolded_export(model, example, exporter, names)
    fused, report = _fuse_fold_only(onnx_model, loaded, fold_models.example_inputs(), names)
    assert not [f.reason for f in report.families if f.rolled_back]
    assert [n for n in ONNX_FOLDED if _bn_on_path(fused, f"out_{n}")] == []
    assert [n for n in ONNX_KEPT if not _bn_on_path(fused, f"out_{n}")] == []


def test_torchscript_archive_folds_convtranspose_and_linear(tmp_path) -> None:
    """`torch.jit.freeze` folds only Conv + BN; the exported graph is folded by the rewrite, also
    through the Reshape that splits a Linear's features into BN1d channels."""
    import deployfuse

    model, example = fold_models.transposed_and_linear()
    torch.jit.save(torch.jit.script(model), tmp_path / "model.pt")
    torch.save(example, tmp_path / "inputs.pt")
    result = deployfuse.export(tmp_path / "model.pt", tmp_path / "model.onnx", example_inputs=tmp_path / "inputs.pt")
    assert "BatchNormalization" not in result.report.op_histogram
    fold = next(f for f in result.report.to_dict()["fusion"]["families"] if f["family"] == "batchnorm_fold")
    assert fold["fused"] == 3


def test_onnx_fold_declines_a_flatten_that_mixes_channels() -> None:
    """Conv [N, 2, 2, 2] -> Flatten [N, 8] -> BN1d(8): eight scales, not one per Conv channel, so
    the BN stays (the structure matches; the math does not allow it)."""

    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 2, 1), nn.BatchNorm1d(8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.bn(self.conv(x).flatten(1))

    model = fold_models.randomise_batchnorms(Mixed()).eval()
    example = {"x": torch.randn(2, 3, 2, 2)}
    loaded, onnx_model = _unfolded_export(model, example, "dynamo", ["y"])
    fused, report = _fuse_fold_only(onnx_model, loaded, {"x": torch.randn(2, 3, 2, 2)}, ["y"])
    assert _bn_on_path(fused, "y") and report.counts() == {"batchnorm_fold": 0}
