"""Turn bench/gpu_models.py runs into the recorded results: h200.json, h200.md and h200.png.

The two deployfuse columns are the artefacts `deployfuse export --target ort-cuda` writes, with
the CUDA options each carries (see `deployfuse.pipeline.cuda_provider_options`): by default,
prefer_nhwc for convolutional networks and sdpa_kernel=2 for fp32 transformers; with
`--cuda-graph`, enable_cuda_graph as well.
A later file's row replaces an earlier one for the same model, dtype and variant (a re-run).

    python bench/report_h200.py RUN1.json RUN2.json ...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
ANCHORS = ("eager", "compile", "ort-plain", "ort-opt", "onnxscript")
ATTENTION_MODELS = {"bert", "vit", "gpt2"}
NAMES = {"bert": "BERT-base (8x128)", "vit": "ViT-B/16 (8)", "gpt2": "GPT-2 (8x128)", "resnet50": "ResNet-50 (32)"}


def shipped(model: str, dtype: str, cuda_graph: bool) -> str:
    """The measured variant that equals deployfuse's artefact for this model and dtype: the
    artefact as exported (it carries prefer_nhwc where it applies), with the CUDA graph lever for
    `--cuda-graph` and the sdpa_kernel lever (measured before the artefact carried it) for fp32
    transformers."""
    parts = ["deployfuse"] + (["cudagraph"] if cuda_graph else []) + (["effattn"] if dtype == "fp32" and model in ATTENTION_MODELS else [])
    return "+".join(parts)


def main(paths: list[str]) -> None:
    table = {(r["model"], r["dtype"], r["variant"]): r for path in paths for r in json.loads(Path(path).read_text())}
    (RESULTS / "h200.json").write_text(json.dumps(list(table.values()), indent=1))
    lines = [
        "| model | dtype | eager | compile | ORT plain | ORT-opt | onnxscript | deployfuse | deployfuse --cuda-graph | best anchor | ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    chart = []
    for model in NAMES:
        for dtype in ("fp16", "fp32"):
            if (model, dtype, "eager") not in table:
                continue
            cells, times = [], {}
            for variant in (*ANCHORS, shipped(model, dtype, False), shipped(model, dtype, True)):
                row = table.get((model, dtype, variant), {})
                if "median_ms" in row:
                    times[variant] = row["median_ms"]
                    cells.append(f"{row['median_ms']:.2f}")
                else:
                    cells.append("n/a" if "no model type" in row.get("error", "") else "fails" if "error" in row else "—")
            best = min(times[a] for a in ANCHORS if a in times)
            ours = min(times.get(shipped(model, dtype, False), 1e9), times.get(shipped(model, dtype, True), 1e9))
            lines.append(f"| {NAMES[model]} | {dtype} | " + " | ".join(cells) + f" | {best:.2f} | {ours / best:.2f} |")
            chart.append((f"{model} {dtype}", best, times.get(shipped(model, dtype, False)), times.get(shipped(model, dtype, True))))
    (RESULTS / "h200.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    _plot(chart)


def _plot(chart: list[tuple[str, float, float | None, float | None]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    labels = [c[0] for c in chart]
    x = np.arange(len(chart))
    fig, ax = plt.subplots(figsize=(10, 4))
    for i, (name, values) in enumerate((("best anchor", [c[1] for c in chart]), ("deployfuse", [c[2] or 0 for c in chart]), ("deployfuse --cuda-graph", [c[3] or 0 for c in chart]))):
        ax.bar(x + (i - 1) * 0.27, values, 0.27, label=name)
    ax.set_xticks(x, labels, rotation=30, ha="right")
    ax.set_ylabel("median ms (H200, lower is better)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "h200.png", dpi=90)


if __name__ == "__main__":
    main(sys.argv[1:])
