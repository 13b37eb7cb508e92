"""Which fusion families pay on ONNX Runtime CPU? A per-family ablation, one process, 2 threads.

For each model: the plain dynamo export, deployfuse `ort-cpu` with every family, the plain
export plus one family at a time, and what a user could pick instead (bench/anchors.py: the ORT
transformers optimizer's and onnxscript's outputs) beside deployfuse's own artefact (folded,
fused, verified). Sessions use ORT's normal optimisations (what a user runs).
Runs are interleaved (one run of every variant per round) so that load from other processes
on a shared machine falls on all variants alike; the figure is the median over `--runs`
rounds after `--warmup`. A family whose "only X" row is slower than "plain" should leave the
ort-cpu profile.

    python bench/cpu_fusion.py --models bert,vit --out bench/results/cpu_fusion.json
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
import onnx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from anchors import build, variants  # noqa: E402


def _interleaved(models: dict[str, onnx.ModelProto], feed: dict[str, np.ndarray], warmup: int, runs: int, threads: int) -> dict[str, float]:
    """Median ms per variant, timing one run of each variant per round."""
    from deployfuse.backends.ort import run, session

    sessions = {name: session(model, threads=threads) for name, model in models.items()}
    for sess in sessions.values():
        for _ in range(warmup):
            run(sess, feed)
    times: dict[str, list[float]] = {name: [] for name in sessions}
    for _ in range(runs):
        for name, sess in sessions.items():
            start = time.perf_counter()
            run(sess, feed)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def bench(name: str, batch: int, warmup: int, runs: int, threads: int) -> list[dict]:
    from deployfuse.export import clean
    from deployfuse.rewrite import family_names, fuse

    module, inputs = build(name, batch)
    with tempfile.TemporaryDirectory() as tmp:
        program = torch.onnx.export(module, (), kwargs=inputs, dynamo=True, opset_version=18, optimize=True, verbose=False)
        path = Path(tmp) / "plain.onnx"
        program.save(str(path), external_data=False)
        plain = clean(onnx.load(str(path)))
    feed = {k: v.numpy() for k, v in inputs.items()}
    candidates: dict[str, onnx.ModelProto] = {"plain": plain}
    fused, report = fuse(plain, "ort-cpu", [feed])
    candidates["all families"] = fused
    for family in family_names():
        kept = sum(f.fused for f in report.families if f.family == family)
        if kept:
            candidates[f"only {family}"], _ = fuse(plain, "ort-cpu", [feed], families=[family])
    with tempfile.TemporaryDirectory() as tmp:  # what a user could pick instead, and deployfuse's own artefact
        for variant, made in variants(name, module, inputs, Path(tmp), "ort-cpu", "fp32").items():
            if variant != "ort-plain" and not isinstance(made, str):
                candidates[variant] = onnx.load(str(made))
    rows = []
    for variant, ms in _interleaved(candidates, feed, warmup, runs, threads).items():
        rows.append({"model": name, "batch": batch, "variant": variant, "median_ms": round(ms, 2)})
        print(f"{name:8s} {variant:24s} {ms:9.2f} ms", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="bert,vit")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = [r for name in args.models.split(",") for r in bench(name, args.batch, args.warmup, args.runs, args.threads)]
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
