"""Issue 19 on CPU: deployfuse's int8 ort-cpu artefact against the ORT transformers optimizer's fp32
graph and against ORT's own quantize_dynamic of that optimized graph (the best-configured int8
alternative: per-tensor, per-channel, per-channel with reduce_range), on BERT-base (random
weights from its config with `anchors.trained_like` biases and norms), seq 128; or on ViT-B/16 or
GPT-2 (124M, seq 128, whose Conv1D GEMMs export as Gemm).

deployfuse's variants: its default (dynamic int8, GPTQ-rounded weights, the accuracy gate at
`--budget`), the same gated as before issue 19 (the most sensitive layers back in fp32, whatever
they cost: `_gate_search`), the same with ONNX Runtime's nearest rounding (the default before GPTQ: its gate
puts layers back in fp32, ranked and searched on the switchboard), and `--int8-mode static`
(not gated: Q/DQ scales fitted on the random calibration samples).

Every variant is exported once with a dynamic batch axis; every variant runs in ONNX Runtime with its normal optimisations and the same intra-op threads;
runs are interleaved (one of each per round, the order rotating) and the figure is the median.
Each int8 variant's accuracy is measured the way deployfuse's gate does (worst cosine and
max|error| / max|reference| per output against PyTorch fp32) on fresh inputs: one draw with
all-ones attention masks and one padded (BERT), or the timed input and another draw (ViT, GPT-2).
deployfuse's `--int8-mode dynamic-7bit` (weights in -64..64, for CPUs without VNNI) is timed beside its default.
`gpt2-lm` is GPT-2 with its LM head, tied to the token embedding (50257 x 768, the largest GEMM).

    python bench/cpu_int8.py --batches 8,1 --rounds 30      # bench/results/cpu_int8.md
    python bench/cpu_int8.py --model vit --batches 1,8 --rounds 15 --default-only
    python bench/cpu_int8.py --model gpt2 --batches 1,8 --rounds 15 --default-only
    python bench/cpu_int8.py --model gpt2-lm --batches 1 --rounds 10 --default-only   # the gate's two searches
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench")]

from anchors import ORT_OPT_TYPES, build  # noqa: E402


def _ort_optimized(plain: Path, out: Path, model: str) -> Path:
    from onnxruntime.transformers.optimizer import optimize_model

    model_type, heads, hidden = ORT_OPT_TYPES[model]
    optimize_model(str(plain), model_type=model_type, num_heads=heads, hidden_size=hidden, opt_level=0, use_gpu=False).save_model_to_file(str(out))
    return out


def _ort_int8(source: Path, out: Path, per_channel: bool, reduce_range: bool = False) -> Path:
    from onnx import TensorProto
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # DefaultTensorType: the type of a tensor shape inference cannot type (the ORT optimizer's GPT-2
    # graph has com.microsoft FullyConnect outputs); every tensor here is fp32
    quantize_dynamic(str(source), str(out), per_channel=per_channel, reduce_range=reduce_range, weight_type=QuantType.QInt8,
                     extra_options={"DefaultTensorType": TensorProto.FLOAT})
    return out


def _fuse_after_quantize(plain: Path, out: Path, feed: dict[str, np.ndarray]) -> Path:
    """The other order: ORT quantizes the plain export, then deployfuse's ort-cpu fusions run."""
    import onnx

    from deployfuse.rewrite import fuse

    quantized = _ort_int8(plain, out.with_suffix(".q.onnx"), per_channel=True)
    fused, _ = fuse(onnx.load(str(quantized)), "ort-cpu", [feed])
    onnx.save(fused, str(out))
    return out


def _accuracy(path: Path, module: torch.nn.Module, feeds: list[dict[str, np.ndarray]], threads: int) -> dict[str, float]:
    from deployfuse.backends.ort import run, session
    from deployfuse.export import flatten_outputs
    from deployfuse.quantize.gate import output_error

    sess = session(path, threads=threads)
    worst = {"cos": 1.0, "rel": 0.0}
    for feed in feeds:
        with torch.no_grad():
            reference = flatten_outputs(module(**{k: torch.from_numpy(v) for k, v in feed.items()}))
        got = run(sess, feed)
        for name, ref in reference.items():
            name_in_graph = name if name in got else next(iter(got))
            error = output_error(name, "fresh", [ref.numpy()], [got[name_in_graph]])
            worst = {"cos": min(worst["cos"], error.cos), "rel": max(worst["rel"], error.rel)}
    return worst


@contextmanager
def _rounding(kind: str) -> Iterator[None]:
    """deployfuse's int8 weights rounded as `kind` says: "gptq" (its default) or "nearest" (ONNX
    Runtime's own, as before GPTQ: the rounding step then hands the quantizer no weights)."""
    from deployfuse.quantize import lowering

    default = lowering.rounded_weights
    if kind == "nearest":
        lowering.rounded_weights = lambda *_: {}
    try:
        yield
    finally:
        lowering.rounded_weights = default


@contextmanager
def _gate_search(kind: str) -> Iterator[None]:
    """deployfuse's gate choosing its fp32 layers as `kind` says: "cost" (its default: the passing
    choice of least GEMM cost over its searches) or "sensitivity" (as before issue 19: the fewest
    of the most sensitive layers, whatever they cost)."""
    from deployfuse.quantize import gate

    default = gate.fallback_orders
    if kind == "sensitivity":
        gate.fallback_orders = lambda ranking, costs: default(ranking, costs)[:1]
    try:
        yield
    finally:
        gate.fallback_orders = default


def bench(model: str, batches: list[int], rounds: int, threads: int, budget: str, workdir: Path, every_variant: bool = True) -> list[dict[str, object]]:
    """Export every variant once with a dynamic batch axis (at batch 1), then time each batch;
    without `every_variant`, only ORT's fp32 and int8, deployfuse's default and its dynamic-7bit mode."""
    import deployfuse
    from deployfuse.backends.ort import run, session
    from deployfuse.inputs import DynamicAxis

    module, inputs = build(model, 1)
    batch_axis = [DynamicAxis(name, 0, "batch") for name in inputs]
    plain = workdir / f"{model}_plain.onnx"
    deployfuse.export(module, plain, example_inputs=inputs, dynamic=batch_axis, fuse=False, verify=False)
    feed1 = {k: v.numpy() for k, v in inputs.items()}
    ortopt = _ort_optimized(plain, workdir / f"{model}_ortopt.onnx", model)
    paths = {"ORT optimizer fp32": ortopt,
             "ORT optimizer + quantize_dynamic": _ort_int8(ortopt, workdir / f"{model}_ortopt_int8.onnx", per_channel=False),
             "ORT optimizer + quantize_dynamic per-channel": _ort_int8(ortopt, workdir / f"{model}_ortopt_int8pc.onnx", per_channel=True),
             "ORT optimizer + quantize_dynamic per-ch. reduce_range": _ort_int8(ortopt, workdir / f"{model}_ortopt_int8pcrr.onnx", per_channel=True, reduce_range=True)}
    if every_variant:
        paths["ORT quantize_dynamic, then deployfuse fusions"] = _fuse_after_quantize(plain, workdir / f"{model}_q_then_fuse.onnx", feed1)
    gated: dict[str, Any] = {}
    gates = (("deployfuse int8 (GPTQ rounding, gated)", "gptq", "cost", "dynamic"), ("deployfuse int8 (GPTQ, gated by sensitivity only)", "gptq", "sensitivity", "dynamic"),
             ("deployfuse int8 7-bit weights (GPTQ, gated)", "gptq", "cost", "dynamic-7bit"), ("deployfuse int8 (nearest rounding, gated)", "nearest", "cost", "dynamic"))
    for name, rounding, search, mode in gates if every_variant else gates[:3]:
        path = workdir / f"{model}_deployfuse_int8_{rounding}_{search}_{mode}.onnx"
        start = time.perf_counter()
        with _rounding(rounding), _gate_search(search):
            result = deployfuse.export(module, path, example_inputs=inputs, dynamic=batch_axis, precision="int8", int8_mode=mode, accuracy_budget=budget,
                                       seed=0)
        assert result.gate is not None
        steps = {step.name: step.seconds for step in result.report.steps}
        attempts = [(a["model"], a.get("search", ""), a["fp32_layers"], a.get("cost_share"), round(a["worst_rel"], 5), a["passed"]) for a in result.gate.attempts]
        print(f"{name}: export {time.perf_counter() - start:.0f} s, quantize step (rounding + gate) {steps.get('quantize', 0):.0f} s; "
              f"gate attempts (model, search, fp32 layers, their cost share, rel, passed) {attempts}; "
              f"fp32 layers {[(layer.node, layer.cost_share) for layer in result.gate.fp32_layers]}, cost share {result.gate.cost_share}", flush=True)
        paths[name] = path
        gated[name] = result.gate
    if every_variant:
        static = workdir / f"{model}_deployfuse_int8_static.onnx"
        deployfuse.export(module, static, example_inputs=inputs, dynamic=batch_axis, precision="int8", int8_mode="static", verify=False, seed=0)
        paths["deployfuse int8 static (not gated)"] = static
    sessions = {name: session(path, threads=threads) for name, path in paths.items()}
    rows = []
    for batch in batches:
        _, batch_inputs = build(model, batch)
        feed = {k: v.numpy() for k, v in batch_inputs.items()}
        generator = np.random.default_rng(batch)
        if "attention_mask" in feed:  # a padded mask
            lengths = generator.integers(16, feed["attention_mask"].shape[1] + 1, (batch, 1))
            second = dict(feed, attention_mask=(np.arange(feed["attention_mask"].shape[1]) < lengths).astype(np.int64))
        else:  # another image, or the token ids shuffled along the sequence
            second = {k: generator.permuted(v, axis=-1) if v.dtype.kind == "i" else generator.standard_normal(v.shape).astype(v.dtype) for k, v in feed.items()}
        times: dict[str, list[float]] = {name: [] for name in sessions}
        for sess in sessions.values():
            run(sess, feed)
        names = list(sessions)
        for round_ in range(rounds):
            for name in names[round_ % len(names):] + names[: round_ % len(names)]:  # rotate who goes first
                start = time.perf_counter()
                run(sessions[name], feed)
                times[name].append((time.perf_counter() - start) * 1e3)
        base = statistics.median(times["ORT optimizer fp32"])
        for name, path in paths.items():
            median = statistics.median(times[name])
            accuracy = _accuracy(path, module, [feed, second], threads)
            row = {"batch": batch, "variant": name, "median_ms": round(median, 2), "vs_ort_opt_fp32": round(median / base, 3),
                   "worst_cos": round(accuracy["cos"], 6), "worst_rel": float(f"{accuracy['rel']:.3e}")}
            if name in gated:
                row.update(budget=budget, fp32_layers=[layer.node for layer in gated[name].fp32_layers], quantized_layers=gated[name].quantized_layers,
                           fp32_cost_share=gated[name].cost_share)
            rows.append(row)
            print(f"batch {batch}  {name:46s} {median:9.2f} ms  x{median / base:5.3f} of ORT opt fp32   worst cos {accuracy['cos']:.6f}  "
                  f"rel {accuracy['rel']:.2e}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("bert", "vit", "gpt2", "gpt2-lm"), default="bert",
                        help="BERT-base (seq 128), ViT-B/16 (224), GPT-2 124M (seq 128) or GPT-2 with its tied LM head")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--default-only", action="store_true", help="time ORT fp32, ORT int8 and deployfuse's GPTQ int8 gated two ways (its default, by sensitivity only) "
                        "and in dynamic-7bit only")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--budget", default="cos=0.999,rel=2e-2", help="deployfuse's --accuracy-budget (the default budget)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="deployfuse-int8-bench-") as tmp:
        rows = bench(args.model, [int(b) for b in args.batches.split(",")], args.rounds, args.threads, args.budget, Path(tmp), not args.default_only)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
