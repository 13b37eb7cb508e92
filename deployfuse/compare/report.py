"""The `--report` HTML page: the tables, a latency plot and an error histogram per output.

Plots are PNGs drawn with matplotlib's object API (no pyplot global state) and embedded as
data URIs, so the report is one file that can be mailed or attached to a CI run.
"""

from __future__ import annotations

import base64
import html
import io
from collections import Counter

import numpy as np

from deployfuse import provenance
from deployfuse.compare.accuracy import OutputStats
from deployfuse.compare.result import CompareResult


def _png(figure) -> str:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def latency_png(result: CompareResult) -> str:
    """Median latency per backend, with the p90 as a whisker, on a log axis so that a backend
    100x faster than another still shows (base64 PNG)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6, 0.6 + 0.5 * len(result.latency)))
    axes = figure.add_subplot()
    names = [lat.backend for lat in result.latency]
    medians = [lat.median_ms for lat in result.latency]
    whiskers = [[0.0] * len(medians), [lat.p90_ms - lat.median_ms for lat in result.latency]]
    axes.barh(names, medians, xerr=whiskers, color="#4c72b0", capsize=4)
    axes.set_xscale("log")
    axes.invert_yaxis()
    axes.set_xlabel("latency, ms, log scale (bar: median, whisker: p90)")
    return _png(figure)


def error_png(result: CompareResult, output: str, feed: int = 0) -> str | None:
    """Histogram of each element's error as a share of its tolerance, log10 of
    |actual - reference| / (atol + rtol |reference|), for every backend on one feed; the red
    line at 0 is the tolerance (elements right of it fail). Outputs compared exactly (atol =
    rtol = 0) show log10 |error| with the line at the smallest float32 step. None when no
    backend has that output at the reference's shape."""
    from matplotlib.figure import Figure

    runs = list(result.run_results.items())
    reference = runs[0][1][feed] if feed < len(runs[0][1]) else {}
    if output not in reference:
        return None
    ref = np.asarray(reference[output], dtype=np.float64)
    figure = Figure(figsize=(6, 3))
    axes = figure.add_subplot()
    drawn = exact = False
    for k, (name, iterations) in enumerate(runs[1:], start=1):
        got = iterations[feed] if feed < len(iterations) else {}
        stats = _stats(result, result.backends[k] if k < len(result.backends) else name, feed, output)
        if output not in got or np.shape(got[output]) != ref.shape or stats is None:
            continue
        diff = np.abs(np.asarray(got[output], dtype=np.float64) - ref)
        tolerance = stats.atol + stats.rtol * np.abs(ref)
        exact = exact or not np.any(tolerance)
        share = diff if exact else diff / np.maximum(tolerance, np.finfo(np.float64).tiny)
        share = share[np.isfinite(share)].ravel()
        axes.hist(np.log10(np.maximum(share, 1e-12)), bins=60, alpha=0.6, label=name)
        drawn = True
    if not drawn:
        return None
    axes.axvline(np.log10(np.finfo(np.float32).eps) if exact else 0.0, color="#c0392b", linewidth=1.5, label="tolerance")
    what = "log10 |error|, compared exactly" if exact else "log10 |error| / (atol + rtol |reference|)"
    axes.set_xlabel(f"{what} of {output} vs {result.reference} (-12 = exact)")
    axes.set_ylabel("elements")
    axes.legend()
    return _png(figure)


def _stats(result: CompareResult, backend: str, feed: int, output: str) -> OutputStats | None:
    for a in result.accuracy:
        if a.backend == backend and a.feed == feed:
            return next((o for o in a.outputs if o.name == output), None)
    return None


def _table(headers: list[str], rows: list[list[str]], failed: list[bool] | None = None) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        f"<tr{' class=fail' if failed and failed[i] else ''}>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
        for i, row in enumerate(rows)
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def fusion_summary(onnx_path: str) -> list[tuple[str, str, int]]:
    """(rule, fused op, nodes) for every fusion the artefact's nodes record, most used first;
    empty when the file has none or cannot be read."""
    import onnx

    from deployfuse.compare.localize import fused_nodes

    try:
        model = onnx.load(onnx_path, load_external_data=False)
    except Exception:  # the report must not fail over the summary
        return []
    counts = Counter((rule, f"{node.domain + '.' if node.domain else ''}{node.op_type}") for node, rule in fused_nodes(model))
    return [(rule, op, n) for (rule, op), n in counts.most_common()]


def _environment(block: dict) -> str:
    """The provenance block as a two-column table (left-aligned: command lines are long)."""
    rows = "".join(f"<tr><th>{html.escape(label)}</th><td class=text>{html.escape(text)}</td></tr>" for label, text in provenance.summary(block))
    return f"<table>{rows}</table>"


def html_report(result: CompareResult) -> str:
    """The whole page."""
    parts = [
        "<!doctype html><meta charset=utf-8><title>deployfuse compare</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}.fail{background:#fdd}.verdict{font-size:1.3em;padding:.4em .8em;display:inline-block}"
        ".verdict.pass{background:#d4edda;color:#155724}.verdict.fail{background:#f8d7da;color:#721c24}.warn{background:#fff3cd;padding:.3em .6em}"
        ".text{text-align:left;font-family:monospace}</style>",
        f"<h1>deployfuse compare</h1><p>model <code>{html.escape(result.model)}</code>"
        + (f" (Hugging Face task <b>{html.escape(result.task)}</b>)" if result.task else "")
        + f", ONNX <code>{html.escape(result.onnx)}</code>, reference backend <b>{html.escape(result.reference)}</b></p>",
        f"<p class='verdict {'pass' if result.passed else 'fail'}'>"
        f"{'PASSED: every backend matches ' + html.escape(result.reference) if result.passed else 'FAILED: ' + html.escape(', '.join(result.failures()))}</p>",
    ]
    first = result.first_divergence
    if first is not None:
        parts.append(f"<h2>First divergence</h2><p>node <b>{html.escape(first['node'])}</b> ({html.escape(first['op_type'])}, rule "
                     f"<b>{html.escape(first['rule'])}</b>), tensor <code>{html.escape(first['tensor'])}</code>, max abs error {first['max_abs_error']:.3e}</p>")
    elif result.localization is not None:
        parts.append(f"<h2>Localisation</h2><p>{html.escape(result.localization.note)}</p>")
    parts.append("<h2>Accuracy</h2>")
    for a in result.accuracy:
        shapes = ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in a.shapes.items())
        rows = [[o.name, f"{o.max_abs_error:.2e}", f"{o.mean_abs_error:.2e}", f"{o.median_abs_error:.2e}", f"{o.p99_abs_error:.2e}",
                 f"{o.max_rel_error:.2e}", f"{o.p99_rel_error:.2e}", f"{o.cosine_similarity:.6f}", f"{o.atol:g}", f"{o.rtol:g}",
                 "ok" if o.passed else f"FAIL ({o.reason or f'{o.mismatched} elements'})"] for o in a.outputs]
        parts.append(f"<h3>{html.escape(a.backend)} vs {html.escape(a.reference)} at {html.escape(shapes)}</h3>")
        parts.append(_table(["output", "max abs", "mean abs", "median abs", "p99 abs", "max rel", "p99 rel", "cosine", "atol", "rtol", "result"],
                            rows, [not o.passed for o in a.outputs]))
    if result.run_results is not None and len(result.backends) > 1:
        parts.append("<h2>Error distribution</h2><p>Each element's error as a share of its tolerance; the red line is the tolerance.</p>")
        for feed, shapes in dict.fromkeys((a.feed, ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in a.shapes.items())) for a in result.accuracy):
            parts.append(f"<h3>at {html.escape(shapes)}</h3>")
            for output in dict.fromkeys(o.name for a in result.accuracy if a.feed == feed for o in a.outputs):
                png = error_png(result, output, feed)
                if png is not None:
                    parts.append(f"<img alt='error histogram of {html.escape(output)} at {html.escape(shapes)}' src='data:image/png;base64,{png}'>")
    if result.latency:
        rows = [[lat.backend, f"{lat.median_ms:.3f}", f"{lat.p90_ms:.3f}", f"{lat.mean_ms:.3f}", f"{lat.min_ms:.3f}", f"{lat.throughput_per_s:.1f}",
                 f"{lat.samples_per_s:.1f}", f"{lat.timing}, {lat.iterations} runs after {lat.warmup} warm-up"] for lat in result.latency]
        noisy = "".join(f"<p class=warn>noisy timing, {html.escape(n)}: rerun on a quieter machine or with more --iterations</p>" for n in result.noisy_timings())
        parts.append("<h2>Latency</h2>" + noisy + _table(["backend", "median ms", "p90 ms", "mean ms", "min ms", "inferences/s", "samples/s", "timing"], rows))
        parts.append(f"<img alt='latency per backend' src='data:image/png;base64,{latency_png(result)}'>")
    fusions = fusion_summary(result.onnx)
    parts.append("<h2>Fusions in the ONNX file</h2>" + (_table(["rule", "fused op", "nodes"], [[r, op, str(n)] for r, op, n in fusions])
                                                         if fusions else "<p>none (an unfused graph, or not written by deployfuse export)</p>"))
    parts.append("<h2>Environment</h2>" + _environment(result.provenance))
    return "\n".join(parts) + "\n"
