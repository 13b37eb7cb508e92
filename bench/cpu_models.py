"""Issue 3's CPU benchmark: ONNX Runtime CPU, 2 threads, every graph of a model in one run.

Variants (bench/anchors.py): the plain dynamo export, the ORT transformers optimizer's output,
onnxscript's `optimize_for_ort` output and deployfuse `--target ort-cpu`. Each runs on the
same fresh inputs; the figure is the median wall-clock of `--runs` runs after `--warmup`;
outputs are checked against the plain export.

    python bench/cpu_models.py --models bert,vit --out bench/results/cpu.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from anchors import build, variants  # noqa: E402


def bench(name: str, batch: int, warmup: int, runs: int, threads: int, workdir: Path) -> list[dict]:
    from deployfuse.backends.ort import run, session

    module, inputs = build(name, batch)
    files = variants(name, module, inputs, workdir, "ort-cpu", "fp32")
    feed = {k: v.numpy() for k, v in inputs.items()}
    rows, reference = [], None
    for variant in ("ort-plain", "ort-opt", "onnxscript", "deployfuse"):
        row: dict[str, object] = {"model": name, "batch": batch, "variant": variant}
        made = files[variant]
        try:
            if isinstance(made, str):
                raise RuntimeError(made)
            sess = session(made, threads=threads)
            first = next(iter(run(sess, feed).values()))
            reference = first if reference is None else reference
            row["max_abs_err"] = float(np.abs(first - reference).max())
            for _ in range(warmup):
                run(sess, feed)
            times = []
            for _ in range(runs):
                start = time.perf_counter()
                run(sess, feed)
                times.append((time.perf_counter() - start) * 1e3)
            row["median_ms"] = round(statistics.median(times), 3)
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="bert,vit")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="bench/results/cpu.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            rows += bench(name, args.batch, args.warmup, args.runs, args.threads, Path(tmp))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
