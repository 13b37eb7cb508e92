"""Every op a profile may emit has a kernel on that target; TensorRT gets no com.microsoft op."""

import onnxruntime as ort
import pytest
from _export import exported, feeds, fused
from onnxruntime.capi import onnxruntime_pybind11_state as C

from deployfuse.errors import UsageError
from deployfuse.rewrite import TARGETS, fuse
from deployfuse.targets import BY_NAME


def _registry(provider: str) -> dict[tuple[str, str], set[str]]:
    """(domain, op) -> dtypes of the first type constraint, from ORT's own kernel registry."""
    table: dict[tuple[str, str], set[str]] = {}
    for k in C.get_all_opkernel_def():
        if k.provider != provider:
            continue
        types = next(iter(k.type_constraints.values()), [])
        table.setdefault((k.domain, k.op_name), set()).update(t[len("tensor("):-1] for t in types)
    return table


def test_cpu_profile_matches_kernel_registry():
    registry = _registry("CPUExecutionProvider")
    for (domain, op), dtypes in BY_NAME["ort-cpu"].kernels.items():
        assert (domain, op) in registry, f"{domain}::{op} has no CPU kernel"
        assert dtypes <= registry[(domain, op)], f"{domain}::{op}: {sorted(dtypes - registry[(domain, op)])} have no CPU kernel"


def test_cpu_profile_refuses_kernel_less_ops():
    cpu = BY_NAME["ort-cpu"]
    for op in ("GroupNorm", "BiasAdd", "BiasSplitGelu", "SkipGroupNorm"):
        assert not cpu.emits("com.microsoft", op, 18)
    assert not cpu.emits("com.microsoft", "BiasGelu", 18, "float16")  # float-only CPU kernel
    assert not BY_NAME["ort-cuda"].emits("com.microsoft", "GroupQueryAttention", 18, "float")


def test_layernorm_below_opset_17_is_onnx_runtimes_own():
    """ORT registers an ONNX-domain LayerNormalization for opsets 1-16; TensorRT gets only the standard one (17 on)."""
    for target in ("ort-cpu", "ort-cuda"):
        assert BY_NAME[target].emits("", "LayerNormalization", 16) and BY_NAME[target].emits("", "LayerNormalization", 17)
    assert not BY_NAME["tensorrt"].emits("", "LayerNormalization", 16) and BY_NAME["tensorrt"].emits("", "LayerNormalization", 17)
    assert not BY_NAME["tensorrt"].emits("", "SimplifiedLayerNormalization", 23)  # ORT's own, at every opset


@pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(), reason="needs a CUDA build of ONNX Runtime")
def test_cuda_profile_matches_kernel_registry():
    registry = _registry("CUDAExecutionProvider")
    for (domain, op), dtypes in BY_NAME["ort-cuda"].kernels.items():
        assert (domain, op) in registry and dtypes <= registry[(domain, op)], f"{domain}::{op}"


def test_tensorrt_profile_emits_no_contrib_op():
    assert BY_NAME["tensorrt"].kernels == {}
    assert not BY_NAME["tensorrt"].emits("com.microsoft", "Gelu", 20)
    for name, exporter in [("bert", "dynamo"), ("gpt2", "dynamo"), ("llama", "dynamo"), ("resnet18", "dynamo"), ("hand_norms", "torchscript")]:
        model, _, _ = fused(name, exporter, "tensorrt")
        assert not [n.op_type for n in model.graph.node if n.domain == "com.microsoft"], name


def test_unknown_target_is_a_usage_error():
    with pytest.raises(UsageError, match="ort-cpu, ort-cuda, tensorrt"):
        fuse(None, "cpu", [{}])
    assert TARGETS == ("ort-cpu", "ort-cuda", "tensorrt")


def test_deployfuse_ops_below_opset_17_are_near_misses_not_rollbacks():
    """Their function bodies need LayerNormalization-17: a tensorrt export at opset 16 keeps the
    decomposed graph, and --debug says why instead of a family failing after the fact."""
    model = exported("bert", "torchscript", 16)
    out, report = fuse(model, "tensorrt", feeds("bert", model), debug=True)
    assert not [f.family for f in report.families if f.rolled_back]
    assert not [n.op_type for n in out.graph.node if n.domain == "deployfuse"]
    reasons = [r for f in report.families for rs in f.near_misses.values() for r in rs]
    assert any("deployfuse::FusedMHA" in r and "opset 16" in r for r in reasons), reasons
