"""The fp8 table of a bench/gpu_quant.py run: each model and batch against the best fp16 alternative and against deployfuse's own fp16.

The issue's bar is the best fp16 *alternative*: PyTorch eager, torch.compile, ONNX Runtime on the plain, ORT-optimized and
onnxscript-optimized fp16 files (other tools, at their best settings in the run). deployfuse's own fp16 artefacts are a second
column, not the bar: they carry the same fusions as the fp8 one, so that ratio is what fp8 itself gives.

    python3 bench/quant_table.py bench/results/h200_quant_narrow_yq.json [--kernels bert:64:deployfuse-fp8-tuned+cudagraph]

(--kernels needs a run whose rows carry kernel_profile's `top`: h200_quant_narrow_yq.json and later.)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

FP8_ROWS = ("deployfuse-fp8+cudagraph", "deployfuse-fp8-tuned+cudagraph")


TIMES = ("median_ms", "interleaved_ms")
"""Each row's time as timed alone, and (runs since 2026-12-07) as timed again with every variant of its model and batch in
interleaved rounds, which takes the machine's drift over a run out of the ratios."""


def table(rows: list[dict], time: str = "median_ms") -> str:
    """Markdown: per model and batch, the best alternative, deployfuse's best fp16, each fp8 row with both ratios, torchao;
    `time` one of TIMES."""
    if time not in TIMES:
        raise ValueError(f"time is one of {TIMES}, not {time!r}")

    def _ms(row: dict | None) -> float | None:
        value = row.get(time) if row else None
        return value if isinstance(value, (int, float)) and not row.get("error") else None

    def fp16_rows(here: list[dict], ours: bool) -> list[dict]:  # deployfuse's own (`ours`) or the alternatives'
        return [r for r in here if r.get("dtype") == "fp16" and _ms(r) is not None and r["variant"].startswith("deployfuse") == ours]

    lines = ["| model | batch | best fp16 alternative | deployfuse fp16 | fp8 +graph (x alt, x own fp16) | fp8 tuned (x alt, x own fp16) | torchao fp8 |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for model, batch in dict.fromkeys((r["model"], r["batch"]) for r in rows):
        here = [r for r in rows if r["model"] == model and r["batch"] == batch]
        alt = min(fp16_rows(here, ours=False), key=_ms, default=None)
        own = min(fp16_rows(here, ours=True), key=_ms, default=None)
        cells = [model, str(batch), f"{_ms(alt):.3f} ({alt['variant']})" if alt else "-", f"{_ms(own):.3f} ({own['variant']})" if own else "-"]
        for name in FP8_ROWS:
            fp8 = next((r for r in here if r["variant"] == name and _ms(r) is not None), None)
            if fp8 is None:
                cells.append("-")
                continue
            ratios = [f"{_ms(fp8) / _ms(ref):.2f}" if ref else "-" for ref in (alt, own)]
            cells.append(f"{_ms(fp8):.3f} ({', '.join(ratios)})")
        torchao = [r for r in here if r["variant"].startswith("torchao") and _ms(r) is not None]
        cells.append(" / ".join(f"{_ms(r):.3f}" for r in torchao) or "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def kernels(rows: list[dict], model: str, batch: int, variant: str, count: int = 25) -> str:
    """The row's largest kernels (bench/kernel_profile.py's `top`): ms, launches and the idle time before them, per call
    (the gap column where the run recorded it)."""
    row = next((r for r in rows if r["model"] == model and r["batch"] == batch and r["variant"] == variant), None)
    if row is None or not row.get("top"):
        return f"{model} batch {batch} {variant}: no kernel list in this file"
    gaps = "gap_ms" in row
    out = [f"{model} batch {batch} {variant}: {row.get('gpu_ms')} ms GPU, {row.get('kernels_per_call')} kernels a call"
           + (f", {row['gap_ms']} ms idle between them" if gaps else ""),
           "| kernel | class | ms | launches |" + (" gap before (ms) |" if gaps else ""), "| --- | --- | --- | --- |" + (" --- |" if gaps else "")]
    out += [f"| `{k['kernel'][:100]}` | {k['class']} | {k['ms']:.4f} | {k['calls']:g} |" + (f" {k['gap_before_ms']:.4f} |" if gaps else "")
            for k in row["top"][:count]]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, help="a gpu_quant.py JSON (h200_quant.json)")
    parser.add_argument("--kernels", action="append", default=[], metavar="MODEL:BATCH:VARIANT", help="also list that row's kernels")
    args = parser.parse_args(argv)
    try:
        rows = json.loads(args.results.read_text())
    except (OSError, ValueError) as exc:
        parser.exit(2, f"quant_table.py: cannot read {args.results}: {exc}\n")
    print(table(rows))
    if any("interleaved_ms" in r for r in rows):
        print("\nTimed again together, in interleaved rounds (interleaved_ms):\n")
        print(table(rows, "interleaved_ms"))
    for spec in args.kernels:
        model, batch, variant = spec.split(":", 2)
        print()
        print(kernels(rows, model, int(batch), variant))


if __name__ == "__main__":
    main()
