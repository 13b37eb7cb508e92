"""Autotune reverts a family that makes the model slower on the target and keeps the others;
the report says why, and the result is the graph of the kept families, equal to the unfused one."""

from types import SimpleNamespace

import onnx
import pytest
import torch
from _export import assert_same_outputs, exported, feeds, op_counts
from onnxscript.rewriter import pattern

from deployfuse.rewrite import RULE_TAG, fuse, rules as registry
from deployfuse.rewrite.autotune import SESSION_SPREAD, THRESHOLD, close_call, decide, median_pair, time_family

STEPS = 256


class SlowTanh(pattern.RewriteRuleClassBase):
    """Deliberately slower, same numbers: tanh(x) = 2 sigmoid(2x) - 1, then STEPS steps of
    y + 0 * sin(y). ORT cannot drop them: 0 * sin(y) is not 0 where y is inf or NaN. Enough
    steps to make the tiny BERT several times slower, so that load from other processes cannot
    hide it (64 steps once could, under pytest -n 2 beside CUDA compiles)."""

    def pattern(self, op, x):
        return op.Tanh(x)

    def rewrite(self, op, x):
        zero, one, two = (op.Constant(value_float=v) for v in (0.0, 1.0, 2.0))
        y = op.Sub(op.Mul(two, op.Sigmoid(op.Mul(two, x))), one)
        for _ in range(STEPS):
            y = op.Add(y, op.Mul(op.Sin(y), zero))
        return y


@pytest.fixture
def slow_family(monkeypatch):
    """The registry with the slow family first (BERT's pooler has the one Tanh)."""
    real = registry.families
    slow = SimpleNamespace(FAMILY="slow", rules=lambda target: [SlowTanh.rule()])
    monkeypatch.setattr(registry, "families", lambda: [slow, *real()])


def test_slower_family_is_reverted(slow_family):
    model = exported("bert", "dynamo")
    guarded, plain = fuse(model, "ort-cpu", feeds("bert", model), families=["slow"])
    assert plain.families[0].fused == 1 and op_counts(guarded)["Sin"] == STEPS  # the guard accepts it
    tuned, report = fuse(model, "ort-cpu", feeds("bert", model), families=["slow"], autotune=True)
    slow = report.families[0]
    assert slow.reverted and not slow.rolled_back and slow.fused == 0 and report.counts() == {"SlowTanh": 0}
    assert slow.after_ms > slow.before_ms * (1 + THRESHOLD)
    assert slow.autotune == f"slower: {slow.before_ms:.3g} -> {slow.after_ms:.3g} ms (> +2%)"
    assert tuned.SerializeToString() == model.SerializeToString()
    assert f"reverted: {slow.autotune}" in report.table()
    assert report.to_dict()["families"][0]["autotune"]["kept"] is False


def test_autotuned_bert_is_consistent(slow_family):
    """Every family the guard accepted is timed; the model is exactly the kept families' graph
    (a reverted family leaves no node, the families after it fuse the model before it)."""
    model = exported("bert", "dynamo")
    tuned, report = fuse(model, "ort-cpu", feeds("bert", model), autotune=True)
    applied = [f for f in report.families if sum(f.matches.values())]
    assert [f.family for f in applied][:3] == ["slow", "gelu", "attention"]
    assert not [f for f in report.families if f.rolled_back]
    for f in report.families:
        if f in applied:
            assert f.before_ms > 0 and f.after_ms > 0
            assert f.reverted == (f.after_ms > f.before_ms * (1 + THRESHOLD)), f.autotune
            assert f.autotune.startswith("slower: " if f.reverted else ("faster: ", "not slower: "))
        else:
            assert (f.autotune, f.before_ms, f.reverted) == ("", None, False)
    assert report.families[0].reverted
    tags = {p.value for n in tuned.graph.node for p in n.metadata_props if p.key == RULE_TAG}
    assert not tags & {rule for f in applied if f.reverted for rule in f.matches}
    kept = [f.family for f in applied if not f.reverted]
    only_kept, _ = fuse(model, "ort-cpu", feeds("bert", model), families=kept)
    assert op_counts(tuned) == op_counts(only_kept)
    assert_same_outputs(model, tuned, "bert")


@pytest.mark.parametrize(
    ("before", "after", "threshold", "keep", "reason"),
    [
        (10.0, 9.0, THRESHOLD, True, "faster: 10 -> 9 ms"),
        (10.0, 10.2, THRESHOLD, True, "not slower: 10 -> 10.2 ms"),
        (10.0, 10.21, THRESHOLD, False, "slower: 10 -> 10.2 ms (> +2%)"),
        (12.3, 12.9, THRESHOLD, False, "slower: 12.3 -> 12.9 ms (> +2%)"),
        (12.3, 12.9, 0.05, True, "not slower: 12.3 -> 12.9 ms"),
        (10.0, 10.6, 0.05, False, "slower: 10 -> 10.6 ms (> +5%)"),
    ],
)
def test_decision_threshold(before, after, threshold, keep, reason):
    decision = decide(before, after, threshold)
    assert (decision.keep, decision.reason, decision.before_ms, decision.after_ms) == (keep, reason, before, after)


@pytest.mark.parametrize(("before", "after", "close"), [(10.0, 10.2, True), (10.0, 9.8, True), (10.0, 10.6, True), (10.0, 9.0, False), (10.0, 12.0, False)])
def test_close_calls_lie_within_the_session_spread_of_the_threshold(before, after, close):
    """Within SESSION_SPREAD (5 %) of 1 + THRESHOLD (2 %): ratios 0.97-1.07."""
    assert close_call(before, after) is close and SESSION_SPREAD == 0.05 and THRESHOLD == 0.02


def test_the_median_pair_is_ranked_by_ratio():
    assert median_pair([(10.0, 11.0), (20.0, 18.0), (8.0, 8.0)]) == (8.0, 8.0)
    assert median_pair([(10.0, 11.0), (20.0, 18.0)]) == (20.0, 18.0)  # the lower middle of an even count
    assert median_pair([(5.0, 6.0)]) == (5.0, 6.0)


def test_a_close_call_is_timed_again_on_fresh_session_pairs():
    """A first ratio within `spread` of the threshold (here every ratio) is timed on three session pairs and decided
    on the median one, which the reason says; with no spread, one pair decides."""
    model = exported("bert", "dynamo")
    feed = feeds("bert", model, count=1)[0]
    again = time_family(model, model, "ort-cpu", feed, budget_s=0.05, spread=1e9)
    assert again.reason.endswith(", the median of 3 session pairs") and again.before_ms > 0 and again.after_ms > 0, again
    assert again.keep == (again.after_ms <= again.before_ms * (1 + THRESHOLD))
    once = time_family(model, model, "ort-cpu", feed, budget_s=0.05, spread=0.0)
    assert "session pairs" not in once.reason and once.before_ms > 0, once


def test_targets_not_timed_here_keep_the_family():
    import onnxruntime as ort

    model = exported("bert", "dynamo")
    feed = feeds("bert", model, count=1)[0]
    broken = onnx.ModelProto()  # never loaded: an untimed target opens no session
    targets = ["tensorrt"] + (["ort-cuda"] if "CUDAExecutionProvider" not in ort.get_available_providers() else [])
    for target in targets:
        decision = time_family(model, broken, target, feed)
        assert decision.keep and decision.reason.startswith("not timed: ") and decision.before_ms is None


def test_family_onnxruntime_cannot_load_optimised_is_reverted():
    model = exported("bert", "dynamo")
    decision = time_family(model, onnx.ModelProto(), "ort-cpu", feeds("bert", model, count=1)[0])
    assert not decision.keep and decision.reason.startswith("onnxruntime (optimised): ")


def test_native_kernels_are_timed_when_the_library_is_given():
    """Given the custom-op library, the timed sessions run the native kernel: a BiasAct node with
    no function body loads and is timed, and the reason says what ran it. Without the library the
    function bodies are timed (the reason says so) and a node without one cannot be."""
    from _native import kernel_only_bias_act

    from deployfuse.ops import ort_custom_ops_library

    with_body, kernel_only, feed = kernel_only_bias_act()
    library = ort_custom_ops_library()
    native = time_family(with_body, kernel_only, "ort-cpu", feed, budget_s=0.05, custom_ops_library=library)
    assert native.before_ms > 0 and native.after_ms > 0
    assert native.reason.endswith(f"; deployfuse ops on native kernels ({library.name})"), native.reason
    bodies = time_family(kernel_only, with_body, "ort-cpu", feed, budget_s=0.05)
    assert bodies.before_ms is None and not bodies.keep and "BiasAct" in bodies.reason  # before: no body, no library
    bodies = time_family(with_body, with_body, "ort-cpu", feed, budget_s=0.05)
    assert bodies.after_ms > 0 and bodies.reason.endswith("; deployfuse ops as ONNX function bodies (no custom-op library built: `deployfuse plugins build`)")


# ---- prefer_nhwc: by measurement with --autotune, else only where 2-D convolutions dominate ----


class _SmallConvNet(torch.nn.Module):
    """The shape of the net NHWC made 1.6x slower on an H200: Conv2d, ConvTranspose2d and Conv1d layers, narrow."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.Conv2d(16, 16, 3, padding=1)
        self.up = torch.nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.line = torch.nn.Conv1d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(torch.relu(self.c2(torch.relu(self.c1(x)))))
        return self.line(h.flatten(2))


def _onnx(module: torch.nn.Module, x: torch.Tensor):
    import warnings

    from deployfuse.export import clean

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return clean(torch.onnx.export(module.eval(), (x,), dynamo=True, optimize=True, verbose=False).model_proto)


def test_nhwc_only_where_2d_convolutions_dominate() -> None:
    from _export import exported

    from deployfuse.pipeline import cuda_provider_options

    assert cuda_provider_options(exported("resnet18", "dynamo"), cuda_graph=False).get("prefer_nhwc") == "1"
    assert "prefer_nhwc" not in cuda_provider_options(exported("vit", "dynamo"), cuda_graph=False)
    assert "prefer_nhwc" not in cuda_provider_options(exported("convnext", "dynamo"), cuda_graph=False)  # 16-32 channels
    assert "prefer_nhwc" not in cuda_provider_options(_onnx(_SmallConvNet(), torch.randn(1, 3, 16, 16)), cuda_graph=False)


def test_nhwc_by_measurement_overrides_the_rule() -> None:
    """With --autotune on a CUDA build of ORT the timer decides (a stand-in timer here: no GPU on
    this machine, so the real CUDA timing has not run in the tests)."""
    from _export import exported

    from deployfuse.pipeline import cuda_provider_options
    from deployfuse.rewrite.autotune import cuda_option_timer

    calls = []

    def timer(ms_without: float, ms_with: float):
        def measure(first, second):
            calls.append((dict(first), dict(second)))
            return ms_without, ms_with

        return measure

    resnet, small = exported("resnet18", "dynamo"), _onnx(_SmallConvNet(), torch.randn(1, 3, 16, 16))
    assert "prefer_nhwc" not in cuda_provider_options(resnet, cuda_graph=True, timer=timer(1.0, 0.99))  # within 2 %: not worth it
    assert cuda_provider_options(small, cuda_graph=True, timer=timer(1.0, 0.5))["prefer_nhwc"] == "1"
    assert calls[-1] == ({"enable_cuda_graph": "1"}, {"enable_cuda_graph": "1", "prefer_nhwc": "1"})  # timed with the artefact's other options
    if "CUDAExecutionProvider" not in __import__("onnxruntime").get_available_providers():
        assert cuda_option_timer(resnet, {}) is None
