"""Optimisation profiles: the min / opt / max shape TensorRT tunes each dynamic input for.

An engine has one or more optimisation profiles; each `--profile` flag is one, its inputs
comma-separated (`--profile input_ids:1x16:1x64:1x128,attention_mask:1x16:1x64:1x128`), and
without any flag the engine gets one. Within a profile, a dynamic input's shapes come, in order
of preference, from
1. the profile's `NAME:MIN:OPT:MAX` for that input;
2. another input's `--profile` through a shared axis label (`attention_mask` follows
   `input_ids` on `batch` and `seq`);
3. the shape the model was exported with (metadata key `deployfuse.input_shapes`, a JSON map
   name -> shape): each dynamic axis of size `s` gets min 1, opt `s`, max `2 s`. Opt is the
   shape the user exported with, so the most likely one; max `2 s` leaves room for a larger
   batch or sequence without asking for sizes past what the model was tried at (position
   tables, for one, are finite).
Static axes keep their size in all three shapes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import onnx

from deployfuse import metadata
from deployfuse.errors import UsageError
from deployfuse.inputs import spec_shape, split_spec

EXPORT_SHAPES_KEY = metadata.INPUT_SHAPES
Shape = tuple[int, ...]
# A model input's dims: an int for a static axis, a label (or None when unnamed) for a dynamic one.
Dims = tuple[int | str | None, ...]


@dataclass(frozen=True)
class ShapeProfile:
    """One input's min / opt / max shapes, as `--profile NAME:MIN:OPT:MAX` gives them."""

    name: str
    min: Shape
    opt: Shape
    max: Shape

    @classmethod
    def parse(cls, text: str) -> ShapeProfile:
        """Parse `input_ids:1x128:4x128:8x128`."""
        parts = split_spec(text, "--profile", "NAME:MIN:OPT:MAX", "input_ids:1x128:4x128:8x128", (4,))
        shapes = [spec_shape(text, "--profile", part) for part in parts[1:]]
        if len({len(s) for s in shapes}) != 1:
            raise UsageError(f"--profile {text!r}: MIN, OPT and MAX must have the same rank")
        if not all(a <= b <= c for a, b, c in zip(*shapes)):
            raise UsageError(f"--profile {text!r}: need MIN <= OPT <= MAX on every axis")
        return cls(parts[0], *shapes)

    def __str__(self) -> str:
        return f"{self.name}:{_fmt(self.min)}:{_fmt(self.opt)}:{_fmt(self.max)}"


def _fmt(shape: Shape) -> str:
    return "x".join(map(str, shape))


def parse_profile(text: str) -> list[ShapeProfile]:
    """One optimisation profile: `input_ids:1x16:1x64:1x128,attention_mask:1x16:1x64:1x128`."""
    parts = [part.strip() for part in text.split(",")]
    if not all(parts):
        raise UsageError(f"--profile {text!r}: an empty entry; inputs are separated by single commas")
    profile = [ShapeProfile.parse(part) for part in parts]
    names = [p.name for p in profile]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise UsageError(f"--profile {text!r} gives {', '.join(repeated)} twice; each --profile is one profile, one entry per input")
    return profile


def resolve_optimization_profiles(inputs: Mapping[str, Dims], given: Sequence[Sequence[ShapeProfile]], exported: Mapping[str, Shape]) -> list[list[ShapeProfile]]:
    """Each given profile completed by `resolve_profiles` (one profile from the export shapes
    when none is given); errors name the profile, and two profiles that resolve alike are refused
    (TensorRT would build both for nothing)."""
    if not given:
        return [resolve_profiles(inputs, [], exported)]
    out: list[list[ShapeProfile]] = []
    for number, profile in enumerate(given, 1):
        try:
            resolved = resolve_profiles(inputs, profile, exported)
        except UsageError as exc:
            raise UsageError(f"profile {number} of {len(given)}: {exc}" if len(given) > 1 else str(exc)) from exc
        if resolved in out:
            raise UsageError(f"profiles {out.index(resolved) + 1} and {number} resolve to the same shapes: {', '.join(map(str, resolved))}")
        out.append(resolved)
    return out


def model_inputs(model: onnx.ModelProto) -> dict[str, Dims]:
    """The model's real inputs (initializers excluded) and their dims."""
    initializers = {t.name for t in model.graph.initializer}
    out: dict[str, Dims] = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        dims = value.type.tensor_type.shape.dim
        out[value.name] = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in dims)
    return out


def export_shapes(model: onnx.ModelProto) -> dict[str, Shape]:
    """The input shapes recorded at export (empty when the exporter recorded none)."""
    for prop in model.metadata_props:
        if prop.key == EXPORT_SHAPES_KEY:
            try:
                return {k: tuple(int(d) for d in v) for k, v in json.loads(prop.value).items()}
            except (ValueError, TypeError, AttributeError) as exc:
                raise UsageError(f"metadata {EXPORT_SHAPES_KEY!r} is not a JSON map of name -> shape: {exc}") from exc
    return {}


def resolve_profiles(inputs: Mapping[str, Dims], given: Sequence[ShapeProfile], exported: Mapping[str, Shape]) -> list[ShapeProfile]:
    """One ShapeProfile per dynamic input (see the module docstring for where each comes from).

    Raises UsageError for a profile that names no input, contradicts a static axis, or
    leaves a dynamic input without shapes.
    """
    by_name = {p.name: p for p in given}
    for p in given:
        if p.name not in inputs:
            raise UsageError(f"--profile names {p.name!r}, which is not a model input; inputs: {', '.join(inputs)}")
        _check_against_dims(p, inputs[p.name])
    labels = _label_ranges(given, inputs)
    out: list[ShapeProfile] = []
    for name, dims in inputs.items():
        if all(isinstance(d, int) for d in dims):
            if name in by_name:
                out.append(by_name[name])
            continue
        profile = by_name.get(name) or _from_labels(name, dims, labels) or _from_export(name, dims, exported.get(name))
        if profile is None:
            example = ":".join(_fmt(tuple(d if isinstance(d, int) else n for d in dims)) for n in (1, 4, 8))
            raise UsageError(f"input {name!r} has dynamic axes {_describe(dims)} and the model records no export shape; give --profile {name}:{example}")
        out.append(profile)
    return out


def _check_against_dims(p: ShapeProfile, dims: Dims) -> None:
    if len(p.min) != len(dims):
        raise UsageError(f"--profile {p}: rank {len(p.min)}, but input {p.name!r} has rank {len(dims)} {_describe(dims)}")
    for axis, d in enumerate(dims):
        if isinstance(d, int) and not p.min[axis] == p.opt[axis] == p.max[axis] == d:
            raise UsageError(f"--profile {p}: axis {axis} of {p.name!r} is static with size {d}")


def _label_ranges(given: Sequence[ShapeProfile], inputs: Mapping[str, Dims]) -> dict[str, tuple[int, int, int]]:
    ranges: dict[str, tuple[int, int, int]] = {}
    for p in given:
        for axis, d in enumerate(inputs[p.name]):
            if isinstance(d, str):
                seen = ranges.setdefault(d, (p.min[axis], p.opt[axis], p.max[axis]))
                if seen != (p.min[axis], p.opt[axis], p.max[axis]):
                    raise UsageError(f"--profile values disagree on axis {d!r}: {seen} and {(p.min[axis], p.opt[axis], p.max[axis])}")
    return ranges


def _from_labels(name: str, dims: Dims, labels: Mapping[str, tuple[int, int, int]]) -> ShapeProfile | None:
    if not all(isinstance(d, int) or d in labels for d in dims):
        return None
    shapes = [tuple(d if isinstance(d, int) else labels[d][i] for d in dims) for i in range(3)]  # type: ignore[index]
    return ShapeProfile(name, *shapes)


def _from_export(name: str, dims: Dims, shape: Shape | None) -> ShapeProfile | None:
    if shape is None:
        return None
    if len(shape) != len(dims):
        raise UsageError(f"metadata {EXPORT_SHAPES_KEY!r} gives {name!r} rank {len(shape)}, the model rank {len(dims)}")
    low = tuple(s if isinstance(d, int) else 1 for d, s in zip(dims, shape))
    high = tuple(s if isinstance(d, int) else 2 * s for d, s in zip(dims, shape))
    return ShapeProfile(name, low, tuple(shape), high)


def _describe(dims: Dims) -> str:
    return "[" + ", ".join(str(d) if d is not None else "?" for d in dims) + "]"
