"""The inputs a quantized export is calibrated on, and the held-out inputs its gate also checks.

`--calibration-data` takes a `torch.save`d list of input dicts (one sample each), a `.npz` file
(one array per input name), or a folder of `.npz` files. An array one rank above the model's
input holds a leading sample axis; an array of the input's own rank is one sample. Samples are
validated against the model's inputs (names, ranks, dtype kinds, the sizes of static axes)
before anything runs, and the last quarter (at least one) is held out: scales never see it, so
the gate also checks inputs the quantization was not fitted to. Without a file, inputs are drawn
as verification draws them (`deployfuse.inputs`), and the export warns that scales fitted to
random inputs say little about real data.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from deployfuse.errors import UsageError, first_line
from deployfuse.inputs import DynamicAxis, Inputs, make_inputs, mask_like, specs_of

RANDOM_CALIBRATION, RANDOM_HELD_OUT = 8, 4  # samples drawn without --calibration-data
RANDOM_WARNING = ("WARNING: no --calibration-data: quantization scales were calibrated on RANDOM inputs, which say little about "
                  "the activations of real data; the accuracy gate passed on random inputs only. Give --calibration-data FILE.")


@dataclass(frozen=True)
class Calibration:
    """Samples to fit quantization scales on, samples held out from that fit, and where they came from.

    Attributes:
        samples: input dicts (names -> tensors, the model's dtypes) for calibration.
        held_out: input dicts the scales never saw, checked by the accuracy gate.
        source: one line for the report, e.g. "calib.npz: 48 calibration + 16 held-out samples".
        random: True when no data was given and the samples are random draws.
    """

    samples: list[Inputs]
    held_out: list[Inputs]
    source: str
    random: bool = False

    def feeds(self, held_out: bool = False) -> list[dict[str, np.ndarray]]:
        """The calibration (or held-out) samples as numpy feeds for ONNX Runtime."""
        return [{k: v.numpy() for k, v in sample.items()} for sample in (self.held_out if held_out else self.samples)]


def random_calibration(example: Inputs, module: object, seed: int = 0) -> Calibration:
    """Random samples at the example's shapes, drawn like verification inputs (masks padded after the first)."""
    specs = specs_of(example)
    masks = mask_like(example)
    draws = [make_inputs(specs, module, seed + i, pad_masks=i > 0, masks=masks) for i in range(RANDOM_CALIBRATION + RANDOM_HELD_OUT)]
    return Calibration(draws[:RANDOM_CALIBRATION], draws[RANDOM_CALIBRATION:],
                       f"random inputs (seeds {seed}..{seed + len(draws) - 1}): {RANDOM_CALIBRATION} calibration + {RANDOM_HELD_OUT} held-out samples",
                       random=True)


def load_calibration(path: str | os.PathLike[str], example: Inputs, dynamic: Sequence[DynamicAxis] = ()) -> Calibration:
    """The samples in `path`, checked against the model's inputs (`example`, whose `dynamic`
    axes may take other sizes), split into calibration and held-out samples.

    Raises:
        UsageError: a missing or unreadable file, or samples the model cannot take (one line).
    """
    file = Path(path)
    flag = f"--calibration-data {file}"
    if file.is_dir():
        parts = sorted(file.glob("*.npz"))
        if not parts:
            raise UsageError(f"{flag}: the folder holds no .npz files")
        samples = [s for part in parts for s in _npz_samples(part, example, f"{flag}/{part.name}")]
    elif not file.is_file():
        raise UsageError(f"{flag}: no such file or folder")
    elif file.suffix == ".npz":
        samples = _npz_samples(file, example, flag)
    else:
        samples = _torch_samples(file, flag)
    checked = [_checked(sample, example, dynamic, f"{flag}: sample {i}") for i, sample in enumerate(samples)]
    if len(checked) < 2:
        raise UsageError(f"{flag}: {len(checked)} sample(s); give at least 2 (the last quarter is held out to check the quantized model)")
    held = max(1, len(checked) // 4)
    return Calibration(checked[:-held], checked[-held:], f"{file.name}: {len(checked) - held} calibration + {held} held-out samples")


def _torch_samples(file: Path, flag: str) -> list[Mapping[str, object]]:
    try:
        loaded = torch.load(str(file), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise UsageError(f"{flag}: not a torch.save'd list of input dicts or an .npz file ({first_line(exc)})") from exc
    if isinstance(loaded, Mapping):
        loaded = [loaded]
    if not isinstance(loaded, (list, tuple)) or not all(isinstance(s, Mapping) for s in loaded):
        raise UsageError(f"{flag}: holds a {type(loaded).__name__}; expected a list of dicts, input name -> tensor (one dict per sample)")
    return list(loaded)


def _npz_samples(file: Path, example: Inputs, flag: str) -> list[Mapping[str, object]]:
    """Samples from one .npz: arrays one rank above the input's are split along their first axis."""
    try:
        with np.load(file, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except Exception as exc:
        raise UsageError(f"{flag}: not a readable .npz file ({first_line(exc)})") from exc
    counts = {name: len(a) if name in example and a.ndim == example[name].dim() + 1 else None for name, a in arrays.items()}
    stacked = {c for c in counts.values() if c is not None}
    if len(stacked) > 1:
        raise UsageError(f"{flag}: the arrays hold different numbers of samples along their first axis ({', '.join(f'{k} {c}' for k, c in counts.items())})")
    if not stacked:
        return [arrays]
    count = stacked.pop()
    return [{name: a[i] if counts[name] is not None else a for name, a in arrays.items()} for i in range(count)]


def _checked(sample: Mapping[str, object], example: Inputs, dynamic: Sequence[DynamicAxis], where: str) -> Inputs:
    """`sample` as tensors in the model's dtypes, or a UsageError naming what does not fit."""
    missing = [name for name in example if name not in sample]
    if missing:
        raise UsageError(f"{where} lacks input {missing[0]!r} (the model's inputs: {', '.join(example)})")
    extra = [str(name) for name in sample if name not in example]
    if extra:
        raise UsageError(f"{where} has {extra[0]!r}, which is not an input of the model ({', '.join(example)})")
    free = {(d.name, d.axis) for d in dynamic}
    out: Inputs = {}
    for name, want in example.items():
        value = sample[name]
        if isinstance(value, np.ndarray):
            value = torch.from_numpy(np.ascontiguousarray(value))
        if not isinstance(value, torch.Tensor):
            raise UsageError(f"{where}: {name} is a {type(value).__name__}, not a tensor or array")
        if value.dim() != want.dim():
            raise UsageError(f"{where}: {name} has rank {value.dim()} (shape {tuple(value.shape)}); the model takes rank {want.dim()} "
                             f"(e.g. {tuple(want.shape)})")
        fixed = [axis for axis in range(want.dim()) if (name, axis) not in free and value.shape[axis] != want.shape[axis]]
        if fixed:
            raise UsageError(f"{where}: {name} has shape {tuple(value.shape)}; axis {fixed[0]} is static in the export, size {want.shape[fixed[0]]}")
        if _kind(value.dtype) != _kind(want.dtype):
            raise UsageError(f"{where}: {name} is {str(value.dtype).removeprefix('torch.')}; the model takes {str(want.dtype).removeprefix('torch.')}")
        out[name] = value.to(want.dtype)
    return out


def _kind(dtype: torch.dtype) -> str:
    return "bool" if dtype == torch.bool else "float" if dtype.is_floating_point else "int"


__all__ = ["RANDOM_WARNING", "Calibration", "load_calibration", "random_calibration"]
