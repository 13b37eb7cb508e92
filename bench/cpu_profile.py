"""Where ONNX Runtime CPU spends an inference, by op type, for each variant of a model.

Issue 3 asks deployfuse to be >= 15 % faster than the ORT transformers optimizer on CPU. Fusion
can only remove time spent outside the matrix products (it does not make a GEMM faster), so the
share of time in GEMM-bearing ops (MatMul, Gemm, and Attention, whose time is mostly its
projection and score GEMMs) bounds what any fusion can win. ORT's own profiler times every node
(`enable_profiling`); the figure is the median over runs of each op type's summed node time.

    python bench/cpu_profile.py --models bert,vit --out bench/results/cpu_profile.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import onnxruntime as ort
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from anchors import build, variants  # noqa: E402

GEMM_OPS = frozenset({"MatMul", "Gemm", "FusedMatMul", "FusedGemm", "Attention", "MultiHeadAttention"})


def op_times(path: Path, feed: dict, runs: int, threads: int, warmup: int = 3) -> tuple[float, dict[str, float]]:
    """(median wall ms, median ms per op type) over `runs` profiled runs after `warmup` runs."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.enable_profiling = True
    options.profile_file_prefix = str(path.with_suffix(""))
    sess = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feed = {i.name: feed[i.name] for i in sess.get_inputs()}  # the ORT optimizer may drop an input
    for _ in range(warmup + runs):
        sess.run(None, feed)
    trace = json.loads(Path(sess.end_profiling()).read_text())
    timed = [e for e in trace if e.get("cat") == "Session" and e.get("name") == "model_run"][warmup:]
    nodes = [e for e in trace if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    per_run: list[dict[str, float]] = []
    for run_event in timed:
        begin, end = run_event["ts"], run_event["ts"] + run_event["dur"]
        times: dict[str, float] = defaultdict(float)
        for e in nodes:
            if begin <= e["ts"] <= end:
                times[e["args"]["op_name"]] += e["dur"] / 1e3
        per_run.append(times)
    ops = {op for t in per_run for op in t}
    wall = statistics.median(e["dur"] / 1e3 for e in timed)
    return wall, {op: statistics.median(t.get(op, 0.0) for t in per_run) for op in ops}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="bert,vit")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for name in args.models.split(","):
        module, inputs = build(name, 1)
        feed = {k: v.numpy() for k, v in inputs.items()}
        with tempfile.TemporaryDirectory() as tmp:
            for variant, made in variants(name, module, inputs, Path(tmp), "ort-cpu", "fp32").items():
                if isinstance(made, str):
                    print(f"{name:6s} {variant:12s} failed: {made}", flush=True)
                    continue
                wall, ops = op_times(made, feed, args.runs, args.threads)
                gemm = sum(ms for op, ms in ops.items() if op in GEMM_OPS)
                rows.append({"model": name, "variant": variant, "median_ms": round(wall, 2), "gemm_ms": round(gemm, 2),
                             "gemm_share": round(gemm / wall, 3), "ops_ms": {op: round(ms, 2) for op, ms in sorted(ops.items(), key=lambda kv: -kv[1])}})
                print(f"{name:6s} {variant:12s} {wall:8.2f} ms   GEMM-bearing {gemm:8.2f} ms ({gemm / wall:5.1%})   "
                      + ", ".join(f"{op} {ms:.1f}" for op, ms in sorted(ops.items(), key=lambda kv: -kv[1])[:6]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
