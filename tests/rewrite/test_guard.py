"""The guard rolls back a family that breaks the graph or its numbers, and fusion goes on."""

from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from _export import exported, feeds, op_counts
from _native import kernel_only_bias_act
from onnxscript.rewriter import pattern

from deployfuse.rewrite import fuse, rules as registry
from deployfuse.rewrite.rules import fused_conv


class ReluToSigmoid(pattern.RewriteRuleClassBase):
    """Deliberately wrong: valid graph, different numbers."""

    def pattern(self, op, x):
        return op.Relu(x)

    def rewrite(self, op, x):
        return op.Sigmoid(x)


class ReluToUnknownOp(pattern.RewriteRuleClassBase):
    """Deliberately invalid: an op no runtime has."""

    def pattern(self, op, x):
        return op.Relu(x)

    def rewrite(self, op, x):
        return op.NoSuchOp(x)


def _with_family(monkeypatch, rule_class) -> None:
    real = registry.families
    broken = SimpleNamespace(FAMILY="broken", rules=lambda target: [rule_class.rule()])
    monkeypatch.setattr(registry, "families", lambda: [broken, *real()])


@pytest.mark.parametrize(("rule_class", "reason"), [(ReluToSigmoid, "max abs error"), (ReluToUnknownOp, "NoSuchOp")])
def test_broken_family_is_rolled_back(monkeypatch, rule_class, reason):
    _with_family(monkeypatch, rule_class)
    model = exported("resnet18", "dynamo")
    fused, report = fuse(model, "ort-cpu", feeds("resnet18", model))
    broken = report.families[0]
    assert broken.family == "broken" and broken.rolled_back and broken.matches == {rule_class.__name__: 17}
    assert reason in broken.reason
    assert report.counts()[rule_class.__name__] == 0
    counts = op_counts(fused)
    assert counts.get("Sigmoid", 0) == 0 and counts.get("NoSuchOp", 0) == 0
    assert counts["com.microsoft::FusedConv"] == 9  # the families after it still ran
    assert "rolled back" in report.table()


def test_guard_rejects_op_outside_profile(monkeypatch):
    """A family emitting com.microsoft.FusedConv into a tensorrt model is rolled back, although
    the CPU proxy could run it."""
    cpu_rule = fused_conv.ConvAct.rule("ort-cpu", "Relu")
    real = registry.families
    monkeypatch.setattr(registry, "families", lambda: [SimpleNamespace(FAMILY="outside", rules=lambda target: [cpu_rule]), *real()])
    model = exported("resnet18", "dynamo")
    fused, report = fuse(model, "tensorrt", feeds("resnet18", model))
    assert report.families[0].rolled_back
    assert "tensorrt cannot run" in report.families[0].reason
    assert not any(n.domain == "com.microsoft" for n in fused.graph.node)


def test_fused_model_is_valid_and_input_untouched():
    model = exported("bert", "dynamo")
    before = model.SerializeToString()
    fused, _ = fuse(model, "ort-cuda", feeds("bert", model))
    assert model.SerializeToString() == before
    onnx.checker.check_model(fused, full_check=True)


def test_rule_that_raises_is_rolled_back(monkeypatch):
    class Crashes(pattern.RewriteRuleClassBase):
        def pattern(self, op, x):
            return op.Relu(x)

        def rewrite(self, op, x):
            raise RuntimeError("bug in a rule")

    _with_family(monkeypatch, Crashes)
    model = exported("resnet18", "dynamo")
    _, report = fuse(model, "ort-cpu", feeds("resnet18", model))
    assert report.families[0].rolled_back and "bug in a rule" in report.families[0].reason
    assert report.counts()["conv_act"] == 9


def test_rewriting_leaves_the_model_before_it_as_it_was():
    """onnx-ir shares the proto's messages and writes an initializer rename back into them;
    the fuser's IR view puts the names back, so a rolled-back family cannot leave a model whose
    nodes name initializers that are no longer there."""
    from deployfuse.rewrite.fuser import _ir_over

    model = exported("bert", "dynamo")
    before = model.SerializeToString()
    with _ir_over(model) as ir_model:
        for i, tensor in enumerate(ir_model.graph.initializers.values()):
            tensor.const_value.name = f"renamed_{i}"
        assert any(t.name.startswith("renamed_") for t in model.graph.initializer), "the rename reached the proto"
    assert model.SerializeToString() == before


def test_guard_runs_deployfuse_nodes_on_the_library_it_is_given():
    """Given the custom-op library, the guard's session runs the native kernel (a node with no
    function body passes, matching the body and PyTorch); without it, the node cannot run."""
    import torch

    from deployfuse.ops import SPECS, ort_custom_ops_library
    from deployfuse.rewrite import guard

    with_body, kernel_only, feed = kernel_only_bias_act()
    cpu = ["CPUExecutionProvider"]
    reference = guard.run_outputs(with_body, [feed], cpu)  # the function body, no library
    got = guard.check(kernel_only, reference, [feed], cpu, ort_custom_ops_library())
    want = SPECS["BiasAct"].reference(torch.from_numpy(feed["X"]), torch.from_numpy(feed["Bias"]), activation="gelu").numpy()
    np.testing.assert_allclose(got[0]["Y"], want, rtol=1e-4, atol=1e-5)
    with pytest.raises(guard.GuardFailure, match="onnxruntime: .*BiasAct"):
        guard.check(kernel_only, reference, [feed], cpu)
