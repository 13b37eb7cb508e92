"""Model inputs: parsing `--input`/`--dynamic` specs and making valid random tensors.

Integer inputs get values a model accepts: attention masks are all ones (or, with
`pad_masks`, padded: each row keeps at least one leading valid position), position ids count
up, and other integer inputs (token ids) stay below the vocabulary or the smallest embedding
table, so a random input never indexes out of range. A mask is known by its name or, where the
name says nothing (a torch.export program's `a_1`), by its example's values (`mask_like`).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from deployfuse.errors import UsageError

Inputs = dict[str, torch.Tensor]

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float64": torch.float64, "fp64": torch.float64, "double": torch.float64,
    "int64": torch.int64, "long": torch.int64, "int32": torch.int32, "int": torch.int32,
    "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool,
}
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-/]*")  # an input name (the TorchScript exporter writes `input.1`) or an axis label


def parse_shape(text: str) -> tuple[int, ...] | None:
    """`1x3x224x224` (or `1,3,224,224`) as a tuple of positive ints; None when malformed."""
    dims = re.split(r"[x,]", text)
    if not all(d.isdigit() and int(d) > 0 for d in dims):
        return None
    return tuple(int(d) for d in dims)


def split_spec(text: str, flag: str, form: str, example: str, fields: Sequence[int], valid: Callable[[list[str]], object] = bool) -> list[str]:
    """The value `text` of `flag` (`--input`, `--dynamic`, `--profile`) split at ':'.

    Raises UsageError saying the expected `form`, with `example`, when it does not have one of
    the `fields` counts of parts, does not start with an input name, or fails `valid`.
    """
    parts = text.split(":")
    if len(parts) not in fields or not NAME.fullmatch(parts[0]) or not valid(parts):
        raise UsageError(f"{flag} {text!r}: expected {form}, e.g. {example}")
    return parts


def spec_shape(text: str, flag: str, part: str) -> tuple[int, ...]:
    """The shape `part` of the value `text` of `flag`; UsageError when it is not one."""
    shape = parse_shape(part)
    if shape is None:
        raise UsageError(f"{flag} {text!r}: SHAPE must be positive integers joined by 'x' (got {part!r}), e.g. 1x3x224x224")
    return shape


@dataclass(frozen=True)
class InputSpec:
    """One `--input NAME:SHAPE[:DTYPE]`: a named tensor shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32

    @classmethod
    def parse(cls, text: str) -> InputSpec:
        """Parse `input_ids:1x128:int64` or `pixel_values:1x3x224x224`."""
        parts = split_spec(text, "--input", "NAME:SHAPE[:DTYPE]", "input_ids:1x128:int64", (2, 3))
        shape = spec_shape(text, "--input", parts[1])
        dtype = torch.float32
        if len(parts) == 3:
            if parts[2].lower() not in _DTYPES:
                raise UsageError(f"--input {text!r}: unknown dtype {parts[2]!r}; use one of {', '.join(sorted(_DTYPES))}")
            dtype = _DTYPES[parts[2].lower()]
        return cls(parts[0], shape, dtype)


@dataclass(frozen=True)
class DynamicAxis:
    """One `--dynamic NAME:AXIS:LABEL`: axis AXIS of input NAME varies, named LABEL in ONNX."""

    name: str
    axis: int
    label: str

    @classmethod
    def parse(cls, text: str) -> DynamicAxis:
        """Parse `input_ids:1:seq`."""
        parts = split_spec(text, "--dynamic", "NAME:AXIS:LABEL", "input_ids:1:seq", (3,), lambda p: re.fullmatch(r"-?\d+", p[1]) and NAME.fullmatch(p[2]))
        return cls(parts[0], int(parts[1]), parts[2])


_SPEC_EXAMPLES = {InputSpec: "input_ids:1x128:int64", DynamicAxis: "input_ids:0:batch"}


def as_specs(given: object, kind: type[InputSpec] | type[DynamicAxis], argument: str) -> list[Any]:
    """The Python API's `inputs=` / `dynamic=` as `kind`s: each item as is, or parsed from its CLI flag's string form.

    Raises UsageError for anything else: a lone string or a dict would otherwise fail deep inside the export.
    """
    example = _SPEC_EXAMPLES[kind]
    if isinstance(given, (str, bytes, Mapping)) or not isinstance(given, Iterable):
        raise UsageError(f"{argument}= takes a list of {kind.__name__} or strings, e.g. [{example!r}], not a {type(given).__name__}")
    items = list(given)
    for item in items:
        if not isinstance(item, (str, kind)):
            raise UsageError(f"{argument}= takes {kind.__name__} or strings like {example!r}, not the {type(item).__name__} {item!r}")
    return [kind.parse(item) if isinstance(item, str) else item for item in items]


def integer_bound(module: object) -> int:
    """Exclusive upper bound for random token ids: the vocabulary, else the smallest embedding."""
    config = getattr(module, "config", None)
    vocab = getattr(config, "vocab_size", None)
    if isinstance(vocab, int) and vocab > 0:
        return vocab
    sizes = [m.num_embeddings for m in module.modules() if isinstance(m, torch.nn.Embedding)] if isinstance(module, torch.nn.Module) else []
    return min(sizes) if sizes else 2


def padding_mask(shape: Sequence[int], dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    """A mask that pads the end of each row (last axis) after a random length of 1 or more.

    The first row is always padded (when rows are longer than 1), so the mask is never all
    ones; no row is all padding, whose output would be undefined (softmax over nothing).
    """
    if not shape:
        return torch.ones((), dtype=dtype)
    length = shape[-1]
    valid = torch.randint(1, length + 1, tuple(shape[:-1]), generator=generator)
    if length > 1:
        valid.view(-1)[0] = int(torch.randint(1, length, (), generator=generator))
    return (torch.arange(length) < valid.unsqueeze(-1)).to(dtype)


def mask_like(example: Mapping[str, torch.Tensor]) -> frozenset[str]:
    """The integer and bool inputs of `example` that hold only 0s and 1s, some 1: attention masks, whatever their names.

    Drawn as token ids instead (values up to the vocabulary), a mask the model turns into (1 - mask) * min gives scores of
    +-inf that PyTorch and ONNX Runtime resolve differently: an unnamed mask failed verification on such draws."""
    def binary(t: torch.Tensor) -> bool:
        if t.is_floating_point() or t.numel() == 0:
            return False
        values = t.to(torch.int64)
        return bool(((values == 0) | (values == 1)).all()) and bool((values == 1).any())

    return frozenset(name for name, tensor in example.items() if binary(tensor))


def random_tensor(name: str, shape: Sequence[int], dtype: torch.dtype, int_bound: int, generator: torch.Generator, pad_masks: bool = False,
                  is_mask: bool = False) -> torch.Tensor:
    """A random tensor a model accepts for an input called `name` (masks padded with `pad_masks`; `is_mask`: a mask
    whatever the name says)."""
    lowered = name.lower()
    if (is_mask or "mask" in lowered) and (dtype == torch.bool or not dtype.is_floating_point):
        return padding_mask(shape, dtype, generator) if pad_masks else torch.ones(shape, dtype=dtype)
    if dtype == torch.bool:
        return torch.rand(shape, generator=generator) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator).to(dtype)
    if "position" in lowered and len(shape) > 0:
        return torch.arange(shape[-1], dtype=dtype).expand(*shape).contiguous()
    if "token_type" in lowered:
        return torch.zeros(shape, dtype=dtype)
    return torch.randint(0, max(int_bound, 1), tuple(shape), generator=generator, dtype=dtype)


def available_memory() -> int:
    """Bytes of memory available to a new allocation (MemAvailable on Linux, else free pages)."""
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_memory(specs: Sequence[InputSpec]) -> None:
    """UsageError when the tensors of `specs` alone would not fit in the memory available.

    A run holds several sets of them at once (the example, verification draws, ONNX Runtime's
    copies) and the model's activations on top, so this refuses only what cannot work.
    """
    needed = sum(math.prod(s.shape) * s.dtype.itemsize for s in specs)
    available = available_memory()
    if needed > available:
        shapes = ", ".join(f"{s.name}:{'x'.join(map(str, s.shape))}:{str(s.dtype).removeprefix('torch.')}" for s in specs)
        raise UsageError(f"inputs {shapes} need {needed / 1e9:.1f} GB, more than the {available / 1e9:.1f} GB of memory available: choose smaller shapes")


def make_inputs(specs: Sequence[InputSpec], module: object, seed: int | None = None, pad_masks: bool = False, masks: Collection[str] = ()) -> Inputs:
    """Random inputs for `specs`, valid for `module` (see `random_tensor`; `masks`: inputs to draw as masks whatever
    their names, as `mask_like` finds them); refused before any allocation when they would not fit in memory."""
    check_memory(specs)
    generator = torch.Generator()
    generator.manual_seed(seed if seed is not None else torch.seed())
    bound = integer_bound(module)
    return {s.name: random_tensor(s.name, s.shape, s.dtype, bound, generator, pad_masks, s.name in masks) for s in specs}


def specs_of(inputs: Mapping[str, torch.Tensor]) -> list[InputSpec]:
    """The shapes and dtypes of concrete inputs, as specs."""
    return [InputSpec(name, tuple(t.shape), t.dtype) for name, t in inputs.items()]


def checked_dynamic(dynamic: Sequence[DynamicAxis], inputs: Mapping[str, torch.Tensor], share: bool = True) -> tuple[list[DynamicAxis], list[DynamicAxis]]:
    """`dynamic` checked against the inputs, and (with `share`) extended to the inputs that share each axis.

    An input of the same rank whose size at a dynamic axis equals the marked input's (an
    `attention_mask` beside `input_ids`) gets that axis and label too: left static, it would
    pin the dimension the other input varies. Axes come back non-negative.

    Returns:
        (every dynamic axis, the ones added by sharing).

    Raises:
        UsageError: an axis names no input, or an axis the input does not have.
    """
    checked: dict[tuple[str, int], DynamicAxis] = {}
    for d in dynamic:
        if d.name not in inputs:
            raise UsageError(f"--dynamic names input {d.name!r}, which is not among the inputs: {', '.join(inputs)}")
        rank = inputs[d.name].dim()
        if not -rank <= d.axis < rank:
            raise UsageError(f"--dynamic {d.name}:{d.axis}:{d.label}: input {d.name} has rank {rank}")
        checked.setdefault((d.name, d.axis % rank), DynamicAxis(d.name, d.axis % rank, d.label))
    added: list[DynamicAxis] = []
    for d in list(checked.values()) if share else ():
        size, rank = inputs[d.name].shape[d.axis], inputs[d.name].dim()
        for name, tensor in inputs.items():
            if (name, d.axis) not in checked and tensor.dim() == rank and tensor.shape[d.axis] == size:
                checked[(name, d.axis)] = DynamicAxis(name, d.axis, d.label)
                added.append(checked[(name, d.axis)])
    return list(checked.values()), added


def resized(specs: Sequence[InputSpec], dynamic: Sequence[DynamicAxis], grow: int = 1) -> list[InputSpec]:
    """Specs with every dynamic axis changed to another size (same new size per label).

    Used to verify a dynamic export at a second shape: each label's size becomes
    `size + max(1, size // 4) * grow`, so axes that share a label stay equal.
    """
    sizes: dict[str, int] = {}
    by_input: dict[str, dict[int, str]] = {}
    spec_by_name = {s.name: s for s in specs}
    for d in dynamic:
        spec = spec_by_name.get(d.name)
        if spec is None:
            raise UsageError(f"--dynamic names input {d.name!r}, which is not among the inputs: {', '.join(spec_by_name)}")
        axis = d.axis % len(spec.shape) if -len(spec.shape) <= d.axis < len(spec.shape) else None
        if axis is None:
            raise UsageError(f"--dynamic {d.name}:{d.axis}:{d.label}: input has rank {len(spec.shape)}")
        size = spec.shape[axis]
        sizes.setdefault(d.label, size + max(1, size // 4) * grow)
        by_input.setdefault(d.name, {})[axis] = d.label
    out = []
    for s in specs:
        shape = list(s.shape)
        for axis, label in by_input.get(s.name, {}).items():
            shape[axis] = sizes[label]
        out.append(InputSpec(s.name, tuple(shape), s.dtype))
    return out
