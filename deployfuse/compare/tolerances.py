"""Per-output tolerances: `--atol [OUT:]V` / `--rtol [OUT:]V`, with defaults by output dtype.

An element passes when |actual - reference| <= atol + rtol * |reference| (the rule of
`numpy.isclose` / `torch.allclose`). Defaults follow the precision the artefact computes in:
fp32 reorders float arithmetic only (1e-4, 1e-3); fp16 and bf16 lose mantissa bits in every
op, so their bounds are set near a few ulps of a unit value after a deep graph. "tf32" is fp32
storage whose MatMul/Conv inputs a runtime rounds to TF32's 10 mantissa bits (unit roundoff
4.9e-4, ONNX Runtime CUDA's default): errors of that size compound over the layers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from deployfuse.errors import UsageError

# dtype name -> (atol, rtol)
DEFAULTS: dict[str, tuple[float, float]] = {
    "float64": (1e-6, 1e-5),
    "float32": (1e-4, 1e-3),
    "tf32": (5e-3, 5e-3),
    "float16": (1e-2, 1e-2),
    "bfloat16": (5e-2, 5e-2),
}
ALL = ""  # the key of a tolerance that applies to every output


def parse_tolerance(text: str, flag: str) -> tuple[str, float]:
    """Parse `V` or `OUT:V` into (output name or ALL, value)."""
    name, _, value = text.rpartition(":")
    try:
        number = float(value)
    except ValueError:
        raise UsageError(f"{flag} {text!r}: expected [OUTPUT:]VALUE, e.g. {flag} 1e-3 or {flag} logits:1e-2") from None
    if not number >= 0:  # also rejects NaN
        raise UsageError(f"{flag} {text!r}: a tolerance must be a non-negative number")
    return name, number


@dataclass(frozen=True)
class Tolerances:
    """atol/rtol per output name; the key ALL applies to outputs not named."""

    atol: Mapping[str, float] = field(default_factory=dict)
    rtol: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def parse(cls, atol: Sequence[str] = (), rtol: Sequence[str] = ()) -> Tolerances:
        """From repeated `--atol` / `--rtol` flags."""
        return cls(dict(parse_tolerance(t, "--atol") for t in atol), dict(parse_tolerance(t, "--rtol") for t in rtol))

    @classmethod
    def of(cls, atol: float | Mapping[str, float] | None, rtol: float | Mapping[str, float] | None) -> Tolerances:
        """From API arguments: one number for every output, or a mapping by output name."""

        def as_map(value: float | Mapping[str, float] | None) -> dict[str, float]:
            if value is None:
                return {}
            if isinstance(value, Mapping):
                return {str(k): float(v) for k, v in value.items()}
            return {ALL: float(value)}

        return cls(as_map(atol), as_map(rtol))

    def check_names(self, outputs: Iterable[str]) -> None:
        """UsageError when a tolerance names an output the model does not have."""
        known = set(outputs)
        for flag, table in (("--atol", self.atol), ("--rtol", self.rtol)):
            unknown = [n for n in table if n != ALL and n not in known]
            if unknown:
                raise UsageError(f"{flag} names output {unknown[0]!r}, but the outputs are {', '.join(sorted(known))}")

    def for_output(self, name: str, dtype: str) -> tuple[float, float]:
        """(atol, rtol) for output `name` computed in `dtype` (a numpy/torch dtype name)."""
        default_atol, default_rtol = DEFAULTS.get(dtype, DEFAULTS["float32"])
        atol = self.atol.get(name, self.atol.get(ALL, default_atol))
        rtol = self.rtol.get(name, self.rtol.get(ALL, default_rtol))
        return atol, rtol
