"""Parsing of --input / --dynamic and the validity of random inputs."""

from __future__ import annotations

import pytest
import torch

from deployfuse.errors import UsageError
from deployfuse.inputs import DynamicAxis, InputSpec, make_inputs, mask_like, resized


def test_input_spec_parses_shape_and_dtype():
    spec = InputSpec.parse("input_ids:2x128:int64")
    assert (spec.name, spec.shape, spec.dtype) == ("input_ids", (2, 128), torch.int64)
    assert InputSpec.parse("pixel_values:1x3x224x224").dtype == torch.float32


@pytest.mark.parametrize("text", ["x", "x:", "x:1xax3", "x:0x3", "x:1x3:float99", "1x:1x3", "x:1x3:fp32:extra"])
def test_malformed_input_spec_is_a_usage_error(text):
    with pytest.raises(UsageError, match="--input"):
        InputSpec.parse(text)


@pytest.mark.parametrize("text", ["x:0", "x:a:batch", "x:0:", ":0:batch"])
def test_malformed_dynamic_is_a_usage_error(text):
    with pytest.raises(UsageError, match="--dynamic"):
        DynamicAxis.parse(text)


def test_token_ids_stay_inside_the_smallest_embedding():
    module = torch.nn.Sequential(torch.nn.Embedding(7, 4), torch.nn.Embedding(50, 4))
    ids = make_inputs([InputSpec("input_ids", (64, 64), torch.int64)], module)["input_ids"]
    assert 0 <= int(ids.min()) and int(ids.max()) < 7
    assert len(ids.unique()) > 1


def test_masks_are_ones_and_floats_are_random():
    got = make_inputs([InputSpec("attention_mask", (2, 5), torch.int64), InputSpec("x", (3, 4))], torch.nn.Identity())
    assert torch.equal(got["attention_mask"], torch.ones(2, 5, dtype=torch.int64))
    assert got["x"].std() > 0


def test_an_unnamed_mask_is_known_by_its_example_and_drawn_as_a_mask():
    # A torch.export program's inputs are a_0, a_1: its 0/1 mask was drawn as token ids (up to the vocabulary),
    # which BERT's (1 - mask) * min turns into +-inf scores that PyTorch and ONNX Runtime resolve differently.
    ids = torch.randint(2, 512, (2, 8))
    example = {"a_0": ids, "a_1": torch.ones_like(ids), "a_2": torch.zeros_like(ids), "a_3": torch.randn(2, 8).round().clamp(0, 1)}
    assert mask_like(example) == {"a_1"}  # not the all-zero token types, not a float tensor of 0/1
    specs = [InputSpec(n, tuple(t.shape), t.dtype) for n, t in example.items()]
    for seed in range(20):
        drawn = make_inputs(specs, torch.nn.Embedding(512, 4), seed, pad_masks=seed > 0, masks=mask_like(example))
        mask = drawn["a_1"]
        assert set(mask.unique().tolist()) <= {0, 1} and bool((mask[:, 0] == 1).all()), mask  # no row all padding
        assert int(drawn["a_0"].max()) > 1  # token ids stay token ids
    assert int(make_inputs(specs, torch.nn.Embedding(512, 4), 3)["a_1"].max()) > 1  # what it was without the example's hint


def test_resized_changes_every_axis_of_a_label_alike():
    specs = [InputSpec("ids", (2, 16), torch.int64), InputSpec("mask", (2, 16), torch.int64)]
    dynamic = [DynamicAxis("ids", 1, "seq"), DynamicAxis("mask", 1, "seq"), DynamicAxis("ids", 0, "batch")]
    ids, mask = resized(specs, dynamic)
    assert ids.shape[1] == mask.shape[1] != 16
    assert ids.shape[0] != 2 and mask.shape[0] == 2


def test_dynamic_axis_of_unknown_input_is_a_usage_error():
    with pytest.raises(UsageError, match="not among the inputs"):
        resized([InputSpec("x", (1, 3))], [DynamicAxis("y", 0, "batch")])


def test_checked_dynamic_spreads_an_axis_to_inputs_of_the_same_size():
    from deployfuse.inputs import checked_dynamic

    inputs = {"input_ids": torch.zeros(2, 16, dtype=torch.long), "attention_mask": torch.ones(2, 16, dtype=torch.long), "pixels": torch.zeros(2, 3, 16)}
    axes, shared = checked_dynamic([DynamicAxis("input_ids", -1, "seq"), DynamicAxis("input_ids", 0, "batch")], inputs)
    assert set(axes) == {DynamicAxis("input_ids", 1, "seq"), DynamicAxis("input_ids", 0, "batch"), DynamicAxis("attention_mask", 1, "seq"),
                         DynamicAxis("attention_mask", 0, "batch")}
    assert set(shared) == {DynamicAxis("attention_mask", 1, "seq"), DynamicAxis("attention_mask", 0, "batch")}  # pixels: another rank
    assert checked_dynamic([DynamicAxis("input_ids", 1, "seq")], inputs, share=False)[0] == [DynamicAxis("input_ids", 1, "seq")]


@pytest.mark.parametrize(("axis", "message"),
                         [(DynamicAxis("y", 0, "b"), "not among the inputs: x"), (DynamicAxis("x", 2, "b"), "has rank 2"), (DynamicAxis("x", -3, "b"), "has rank 2")])
def test_checked_dynamic_refuses_axes_the_inputs_lack(axis, message):
    from deployfuse.inputs import checked_dynamic

    with pytest.raises(UsageError, match=message):
        checked_dynamic([axis], {"x": torch.zeros(2, 3)})


def test_inputs_larger_than_free_memory_are_refused_before_allocation(monkeypatch):
    """The check and the test see one measure of free memory: measured twice, memory another process frees in between let
    the check pass and the allocation kill the test's worker (a full run on 2 cores, 2026-12-07)."""
    from deployfuse import inputs

    free = inputs.available_memory()
    monkeypatch.setattr(inputs, "available_memory", lambda: free)
    rows = free // 4 // 1000 + 1  # float32 rows of 1000: just over what is free
    with pytest.raises(UsageError, match="of memory available"):
        make_inputs([InputSpec("x", (rows, 1000))], torch.nn.Identity())
