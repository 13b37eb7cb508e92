"""Turn bench/gpu_models.py runs into the recorded results: h200.json, h200.profile.json, h200.md, h200.png.

Each (model, dtype, batch, variant) keeps the smallest median over the runs given, with every
run's median beside it (`median_ms_runs`): another process on the machine can only slow a
variant down, so the smallest median is the best estimate of its uncontended time, and every
variant of both sides is treated alike. Its `gpu_ms` and kernel profile come from that run.

Per row the best alternative is the fastest variant not starting with `deployfuse`, the best
deployfuse one the fastest starting with it. Verdict on host time (what a caller waits for):
`ahead` at or below 0.95x the best alternative, `behind` at or above 1.05x, `level` between;
with a note when the GPU-time ratio (CUPTI kernel sum) says otherwise, i.e. when the difference
is launch overhead rather than kernels.

    python bench/report_h200.py RUN1.json [RUN2.json ...]     (each with its .profile.json beside it)
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
NAMES = {"bert": "BERT-base", "vit": "ViT-B/16", "gpt2": "GPT-2", "resnet50": "ResNet-50"}
SHAPES = {"bert": "{}x128", "gpt2": "{}x128", "vit": "{}", "resnet50": "{}"}
VARIANT_ORDER = ("eager", "compile", "compile-reduce-overhead", "compile-max-autotune", "ort-plain", "ort-plain+cudagraph", "ort-opt", "ort-opt+cudagraph", "onnxscript",
                 "onnxscript+cudagraph", "deployfuse", "deployfuse+cudagraph")
BATCH_ORDER = {"bert": (1, 8, 64), "vit": (1, 8, 64), "gpt2": (1, 8, 64), "resnet50": (1, 32, 128)}


def merge(paths: list[str]) -> tuple[list[dict], list[dict]]:
    """Rows keeping each variant's fastest run, and the kernel profiles of those runs."""
    best: dict[tuple, dict] = {}
    runs: dict[tuple, list[float]] = defaultdict(list)
    profiles: dict[tuple, dict] = {}
    for path in paths:
        profile_path = Path(path).with_suffix(".profile.json")
        run_profiles = {_key(p): p for p in json.loads(profile_path.read_text())} if profile_path.exists() else {}
        for row in json.loads(Path(path).read_text()):
            k = _key(row)
            if "median_ms" in row:
                runs[k].append(row["median_ms"])
            old = best.get(k)
            if old is None or ("median_ms" in row and ("median_ms" not in old or row["median_ms"] < old["median_ms"])):
                best[k] = dict(row)
                if k in run_profiles:
                    profiles[k] = _slim(run_profiles[k])
    for k, row in best.items():
        if len(runs[k]) > 1:
            row["median_ms_runs"] = runs[k]
    return list(best.values()), [profiles[k] for k in best if k in profiles]


def _key(r: dict) -> tuple:
    return (r["model"], r["dtype"], r["batch"], r["variant"])


def _slim(profile: dict) -> dict:
    return {k: v for k, v in profile.items() if k != "top"} | {"top": profile.get("top", [])[:5]}


def _band(ratio: float) -> str:
    return "ahead" if ratio <= 0.95 else "behind" if ratio >= 1.05 else "level"


def verdict(ratio: float, gpu_ratio: float | None) -> str:
    host = _band(ratio)
    if gpu_ratio is None or _band(gpu_ratio) == host:
        return host
    return f"{host} (kernels {_band(gpu_ratio)})"


def summary(rows: list[dict]) -> list[dict]:
    """Per (model, dtype, batch): the best alternative, the best deployfuse variant, ratios, verdict."""
    table: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for r in rows:
        table[(r["model"], r["dtype"], r["batch"])][r["variant"]] = r
    out = []
    for (model, dtype, batch), variants in table.items():
        timed = {v: r for v, r in variants.items() if "median_ms" in r}
        alternatives = [v for v in timed if not v.startswith("deployfuse")]
        ours = [v for v in timed if v.startswith("deployfuse")]
        if not alternatives or not ours:
            continue
        alt = min(alternatives, key=lambda v: timed[v]["median_ms"])
        best = min(ours, key=lambda v: timed[v]["median_ms"])
        a, d = timed[alt], timed[best]
        gpu_ratio = d["gpu_ms"] / a["gpu_ms"] if a.get("gpu_ms") and d.get("gpu_ms") else None
        ratio = d["median_ms"] / a["median_ms"]
        out.append({
            "model": model, "dtype": dtype, "batch": batch,
            "alternative": alt, "alternative_ms": a["median_ms"], "alternative_gpu_ms": a.get("gpu_ms"),
            "deployfuse": best, "deployfuse_ms": d["median_ms"], "deployfuse_gpu_ms": d.get("gpu_ms"),
            "ratio": round(ratio, 3), "gpu_ratio": round(gpu_ratio, 3) if gpu_ratio else None, "verdict": verdict(ratio, gpu_ratio),
            "not_run": sorted(v for v, r in variants.items() if "skipped" in r), "failed": sorted(v for v, r in variants.items() if "error" in r),
        })
    return sorted(out, key=lambda s: (list(NAMES).index(s["model"]), BATCH_ORDER[s["model"]].index(s["batch"]), s["dtype"]))


def markdown(summaries: list[dict], rows: list[dict]) -> str:
    lines = [
        "| model | batch | dtype | best alternative | ms (GPU ms) | best deployfuse | ms (GPU ms) | ratio | GPU-time ratio | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        lines.append(
            f"| {NAMES[s['model']]} | {SHAPES[s['model']].format(s['batch'])} | {s['dtype']} | {s['alternative']} | {s['alternative_ms']:.3f} ({_ms(s['alternative_gpu_ms'])}) "
            f"| {s['deployfuse']} | {s['deployfuse_ms']:.3f} ({_ms(s['deployfuse_gpu_ms'])}) | {s['ratio']:.2f} | {_ratio(s['gpu_ratio'])} | {s['verdict']} |"
        )
    lines += ["", "Every variant (median host ms / GPU ms; `fails` = error recorded in h200.json, `-` = not run):", ""]
    seen = {r["variant"].replace("+tf32", "") for r in rows}
    variants = [v for v in VARIANT_ORDER if v in seen] + sorted(seen - set(VARIANT_ORDER))
    lines.append("| row | " + " | ".join(variants) + " |")
    lines.append("|---" * (len(variants) + 1) + "|")
    by_row: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for r in rows:
        by_row[(r["model"], r["dtype"], r["batch"])][r["variant"].replace("+tf32", "")] = r
    for s in summaries:
        cells = []
        for v in variants:
            r = by_row[(s["model"], s["dtype"], s["batch"])].get(v, {})
            cells.append(f"{r['median_ms']:.2f} / {_ms(r.get('gpu_ms'))}" if "median_ms" in r else "fails" if "error" in r else "-")
        lines.append(f"| {NAMES[s['model']]} {SHAPES[s['model']].format(s['batch'])} {s['dtype']} | " + " | ".join(cells) + " |")
    lines += ["", "fp32 torch.compile variants and eager+tf32 run with TF32 allowed (`+tf32` in h200.json)."]
    return "\n".join(lines) + "\n"


def _ms(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else "-"


def _ratio(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else "-"


def main(paths: list[str]) -> None:
    if not paths:
        sys.exit("usage: python bench/report_h200.py RUN1.json [RUN2.json ...]")
    rows, profiles = merge(paths)
    (RESULTS / "h200.json").write_text(json.dumps(rows, indent=1))
    (RESULTS / "h200.profile.json").write_text(json.dumps(profiles, indent=1))
    summaries = summary(rows)
    text = markdown(summaries, rows)
    (RESULTS / "h200.md").write_text(text)
    print(text)
    _plot(summaries)


def _plot(summaries: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    labels = [f"{s['model']} {s['batch']} {s['dtype']}" for s in summaries]
    x = np.arange(len(summaries))
    fig, ax = plt.subplots(figsize=(12, 4))
    ax.bar(x, [s["ratio"] for s in summaries], 0.6, color=[{"ahead": "tab:green", "behind": "tab:red"}.get(s["verdict"].split()[0], "tab:gray") for s in summaries])
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(x, labels, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("deployfuse / best alternative (host ms)")
    ax.set_title("H200: best deployfuse artefact over the fastest alternative (below 1 = faster)")
    fig.tight_layout()
    fig.savefig(RESULTS / "h200.png", dpi=90)


if __name__ == "__main__":
    main(sys.argv[1:])
