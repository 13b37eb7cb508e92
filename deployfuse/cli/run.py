"""`deployfuse run`: a quick latency check of an artefact through `deployfuse.InferenceSession`."""

from __future__ import annotations

import argparse
import time

import numpy as np

from deployfuse.cli._args import argument_type
from deployfuse.errors import UsageError, first_line
from deployfuse.inputs import InputSpec

SUMMARY = "time an ONNX artefact through deployfuse.InferenceSession"
DESCRIPTION = """\
Run MODEL.onnx on random inputs the way deployfuse.InferenceSession runs it in your code (the
artefact's CUDA options applied, the deployfuse custom-op library registered when built) and
print its latency. Input shapes default to those the export recorded.
"""
EPILOG = "example: deployfuse run tiny_bert.onnx --input input_ids:8x128:int64 --input attention_mask:8x128:int64 --iterations 50"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL.onnx", help="the ONNX artefact")
    parser.add_argument("--input", dest="inputs", action="append", default=[], type=argument_type(InputSpec.parse), metavar="NAME:SHAPE[:DTYPE]",
                        help="the shape of one input (repeatable); the dtype is the model's; default: the shape the export recorded")
    parser.add_argument("--iterations", type=int, default=20, metavar="N", help="timed runs (default 20)")
    parser.add_argument("--warmup", type=int, default=3, metavar="N", help="untimed runs first (default 3)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="execution provider (default: CUDA when onnxruntime has it)")
    parser.add_argument("--no-custom-ops", action="store_true", help="run deployfuse.* nodes as their ONNX function bodies even when the library is built")


def run(args: argparse.Namespace) -> int:
    """Open the session, run warm-up and timed iterations, print a short table (`deployfuse.tables`)."""
    import onnx

    from deployfuse.runtime import CPU, CUDA, InferenceSession, input_shapes, random_feed
    from deployfuse.tables import add, grid, show

    if args.iterations < 1 or args.warmup < 0:
        raise UsageError("--iterations must be >= 1 and --warmup >= 0")
    providers = {"auto": None, "cpu": [CPU], "cuda": [CUDA, CPU]}[args.device]
    session = InferenceSession(args.model, providers=providers, custom_ops_library=not args.no_custom_ops)
    if args.device == "cuda" and CUDA not in session.get_providers():
        raise UsageError("--device cuda: this onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu)")
    model = onnx.load(args.model, load_external_data=False)
    shapes = input_shapes(model, {spec.name: spec.shape for spec in args.inputs})
    feed = random_feed(model, shapes)
    try:
        outputs = session.run(None, feed)
    except Exception as exc:  # onnxruntime raises its own types; the first line says what is wrong
        raise UsageError(f"the model rejects these inputs: {first_line(exc)}") from exc
    for _ in range(args.warmup):
        session.run(None, feed)
    times = []
    for _ in range(args.iterations):
        start = time.perf_counter()
        outputs = session.run(None, feed)
        times.append((time.perf_counter() - start) * 1e3)
    ms = np.array(times)
    first = next(iter(shapes.values()), ())
    batch = first[0] if first else 1
    ops = "native library" if session.native_ops else ("ONNX function bodies" if session.uses_deployfuse_ops else "none in the model")
    summary = grid("", "", header=False)
    for key, value in [
        ("model", args.model),
        ("providers", ", ".join(session.get_providers())),
        ("deployfuse", ops),
        ("inputs", ", ".join(f"{n} {'x'.join(map(str, s))} {feed[n].dtype}" for n, s in shapes.items())),
        ("outputs", ", ".join(f"{o.name} {'x'.join(map(str, v.shape))}" for o, v in zip(session.get_outputs(), outputs))),
        ("latency", f"median {np.median(ms):.3f} ms, p90 {np.percentile(ms, 90):.3f} ms, min {ms.min():.3f} ms over {args.iterations} runs"),
        ("throughput", f"{1e3 / np.median(ms):.1f} runs/s ({batch * 1e3 / np.median(ms):.1f} samples/s at batch {batch})"),
    ]:
        add(summary, key, value)
    show([summary])
    return 0
