"""One typed Target per `--target` name: its lowering preferences agree with its kernel profile,
and the public names are unchanged."""

import pytest

import deployfuse
from deployfuse.errors import UsageError
from deployfuse.targets import BY_NAME, TARGETS, get_target


def test_public_target_names_are_unchanged():
    assert deployfuse.TARGETS == TARGETS == ("ort-cpu", "ort-cuda", "tensorrt")
    assert all(str(get_target(name)) == name for name in TARGETS)


@pytest.mark.parametrize("name", TARGETS)
def test_every_preferred_lowering_has_a_kernel_on_its_target(name):
    """A rule only emits what its target's profile allows: a preference the profile refuses at
    every opset for every float dtype would be a lowering that can never be chosen."""
    target = BY_NAME[name]
    for key, options in target.lowerings.items():
        for option in options:
            runnable = [d for d in ("float", "float16") if target.emits(option.domain, option.op_type, 23, d)]
            assert runnable, f"{name}: rule {key} prefers {option.domain or 'ai.onnx'}::{option.op_type}, which the profile never runs"


def test_unknown_target_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown target 'ort-rocm'; choose one of ort-cpu, ort-cuda, tensorrt"):
        get_target("ort-rocm")
