"""Optimisation profiles: parsing, shared labels, export-shape defaults, and the errors."""

from __future__ import annotations

import json

import onnx
import pytest

from deployfuse.engine import EXPORT_SHAPES_KEY, ShapeProfile
from deployfuse.engine.profiles import export_shapes, model_inputs, parse_profile, resolve_optimization_profiles, resolve_profiles
from deployfuse.errors import UsageError

TEXT = {"input_ids": ("batch", "seq"), "attention_mask": ("batch", "seq")}


def test_parse_round_trips():
    p = ShapeProfile.parse("input_ids:1x128:4x128:8x128")
    assert (p.min, p.opt, p.max) == ((1, 128), (4, 128), (8, 128))
    assert str(p) == "input_ids:1x128:4x128:8x128"


@pytest.mark.parametrize("text", ["input_ids:1x8:2x8", "x:1x0:1x1:1x2", "x:2:1:3", "x:1x8:2x8:4", "1x:1:1:1"])
def test_parse_rejects(text):
    with pytest.raises(UsageError):
        ShapeProfile.parse(text)


def test_shared_labels_follow_the_given_profile():
    given = [ShapeProfile.parse("input_ids:1x8:2x16:4x32")]
    out = {p.name: p for p in resolve_profiles(TEXT, given, {})}
    assert out["attention_mask"] == ShapeProfile("attention_mask", (1, 8), (2, 16), (4, 32))


def test_export_shape_defaults_are_1_s_2s():
    out = resolve_profiles({"x": ("batch", 3, 32, 32)}, [], {"x": (5, 3, 32, 32)})
    assert out == [ShapeProfile("x", (1, 3, 32, 32), (5, 3, 32, 32), (10, 3, 32, 32))]


def test_export_shapes_are_read_from_metadata(bert_onnx):
    model = onnx.load(bert_onnx, load_external_data=False)
    onnx.helper.set_model_props(model, {EXPORT_SHAPES_KEY: json.dumps({"input_ids": [2, 16], "attention_mask": [2, 16]})})
    profiles = resolve_profiles(model_inputs(model), [], export_shapes(model))
    assert [(p.min, p.opt, p.max) for p in profiles] == [((1, 1), (2, 16), (4, 32))] * 2


def test_errors_say_what_to_do():
    with pytest.raises(UsageError, match=r"give --profile input_ids:1x1:4x4:8x8"):
        resolve_profiles(TEXT, [], {})
    with pytest.raises(UsageError, match="not a model input"):
        resolve_profiles(TEXT, [ShapeProfile.parse("ids:1x8:2x8:4x8")], {})
    with pytest.raises(UsageError, match="static with size 3"):
        resolve_profiles({"x": ("batch", 3)}, [ShapeProfile.parse("x:1x3:2x4:4x4")], {})
    with pytest.raises(UsageError, match="disagree"):
        resolve_profiles(TEXT, [ShapeProfile.parse("input_ids:1x8:2x8:4x8"), ShapeProfile.parse("attention_mask:1x8:2x9:4x9")], {})


def test_one_profile_flag_holds_several_inputs():
    profile = parse_profile("input_ids:1x16:1x64:1x128, attention_mask:1x16:1x64:1x128")
    assert [p.name for p in profile] == ["input_ids", "attention_mask"]
    for text, message in [("input_ids:1x8:2x8:4x8,", "empty entry"), ("x:1:1:1,x:1:2:2", "gives x twice")]:
        with pytest.raises(UsageError, match=message):
            parse_profile(text)


def test_several_profiles_each_completed_on_its_own():
    """Inputs a profile leaves out follow its inputs through shared axes, else the export shape."""
    inputs = {**TEXT, "pixel": ("batch", 3), "extra": ("rows",)}
    given = [parse_profile("input_ids:1x16:1x64:1x128"), parse_profile("input_ids:8x16:32x128:64x128,pixel:8x3:32x3:64x3")]
    first, second = resolve_optimization_profiles(inputs, given, {"extra": (5,)})
    assert {p.name: (p.min, p.opt, p.max) for p in first} == {
        "input_ids": ((1, 16), (1, 64), (1, 128)),
        "attention_mask": ((1, 16), (1, 64), (1, 128)),  # the shared axes batch and seq
        "pixel": ((1, 3), (1, 3), (1, 3)),  # batch
        "extra": ((1,), (5,), (10,)),  # no shared axis: the export shape
    }
    assert {p.name: p.max for p in second} == {"input_ids": (64, 128), "attention_mask": (64, 128), "pixel": (64, 3), "extra": (10,)}
    assert resolve_optimization_profiles(TEXT, [], {"input_ids": (2, 8), "attention_mask": (2, 8)}) == [resolve_profiles(TEXT, [], {"input_ids": (2, 8), "attention_mask": (2, 8)})]


def test_several_profiles_errors_name_the_profile():
    with pytest.raises(UsageError, match=r"profile 2 of 2: --profile names 'ids'"):
        resolve_optimization_profiles(TEXT, [parse_profile("input_ids:1x8:2x8:4x8"), parse_profile("ids:1x8:2x8:4x8")], {})
    with pytest.raises(UsageError, match="profiles 1 and 2 resolve to the same shapes"):
        resolve_optimization_profiles(TEXT, [parse_profile("input_ids:1x8:2x8:4x8"), parse_profile("attention_mask:1x8:2x8:4x8")], {})


@pytest.mark.parametrize("name", ["input_ids", "input.1", "encoder/pixel-values"])
def test_profile_input_and_dynamic_take_the_same_input_names(name):
    """One rule for an input name in --profile, --input and --dynamic (the TorchScript exporter writes `input.1`)."""
    from deployfuse.inputs import DynamicAxis, InputSpec

    assert ShapeProfile.parse(f"{name}:1x8:2x8:4x8").name == InputSpec.parse(f"{name}:2x8").name == DynamicAxis.parse(f"{name}:0:batch").name == name


@pytest.mark.parametrize("flag", ["--profile", "--input"])
def test_a_bad_shape_says_which_part(flag):
    from deployfuse.inputs import InputSpec

    parse, text = (ShapeProfile.parse, "x:1x8:2by8:4x8") if flag == "--profile" else (InputSpec.parse, "x:2by8")
    with pytest.raises(UsageError, match=rf"^{flag} '{text}': SHAPE must be positive integers joined by 'x' \(got '2by8'\)"):
        parse(text)
