"""`deployfuse build`: a TensorRT engine from a (fused) ONNX model."""

from __future__ import annotations

import argparse

from deployfuse.engine import BUILDERS, build_engine
from deployfuse.engine.profiles import parse_profile

SUMMARY = "build a TensorRT engine from an ONNX model"
DESCRIPTION = """\
Build a TensorRT engine (TensorRT >= 10 or TensorRT-RTX) from an ONNX model, ideally one
exported with --target tensorrt. Each --profile is one optimisation profile; dynamic inputs a
profile leaves out follow a given input through a shared axis name, else get min 1, opt = the
export shape, max = 2x the export shape.
"""
EPILOG = "exit codes: 0 built, 2 bad input, 3 internal failure (the message names a log file with the traceback), 130 interrupted."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("onnx", help="the ONNX model")
    parser.add_argument("-o", "--output", required=True, metavar="ENGINE.plan", help="where to write the engine")
    precision = parser.add_mutually_exclusive_group()
    precision.add_argument("--fp16", dest="precision", action="store_const", const="fp16", help="build in float16 (inputs and outputs stay float32)")
    precision.add_argument("--bf16", dest="precision", action="store_const", const="bf16", help="build in bfloat16 (inputs and outputs stay float32)")
    parser.set_defaults(precision="fp32")
    parser.add_argument("--profile", action="append", default=[], metavar="NAME:MIN:OPT:MAX[,NAME:MIN:OPT:MAX...]",
                        help="one optimisation profile, its inputs comma-separated, e.g. input_ids:1x16:1x64:1x128 "
                        "(repeat for several profiles: --profile input_ids:1x16:1x64:1x128 --profile input_ids:8x16:32x128:64x128)")
    parser.add_argument("--plugins", action="append", default=[], metavar="LIB",
                        help="a TensorRT plugin library to load (repeatable); deployfuse's own is loaded when the model needs it")
    parser.add_argument("--timing-cache", metavar="FILE", help="read the timing cache from FILE if it exists and write it back")
    parser.add_argument("--workspace", type=int, metavar="MiB", help="cap on the builder's workspace memory")
    parser.add_argument("--compute-capability", metavar="X.Y", help="GPU generation to build for (TensorRT-RTX only), e.g. 8.9")
    parser.add_argument("--builder", choices=BUILDERS, default="auto", help="which TensorRT builds (default: TensorRT when installed, else TensorRT-RTX)")
    parser.add_argument("--log-file", metavar="FILE", help="write a log of the build there: each phase, and TensorRT's and Polygraphy's "
                        "own warnings and notes (which the terminal does not show; a failure's reason is in its one-line error)")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only the summary")


def run(args: argparse.Namespace) -> int:
    """Build and print the summary; errors reach the CLI as DeployfuseError."""
    from deployfuse.cli._progress import log, log_to_file, stage_printer

    profiles = [parse_profile(p) for p in args.profile]
    reads = {"ONNX": args.onnx, **{f"--plugins {p}": p for p in args.plugins}, "--timing-cache": args.timing_cache}
    with log_to_file(args.log_file, reads, {"-o": args.output}):
        result = build_engine(
            args.onnx, args.output, precision=args.precision, profiles=profiles, plugins=args.plugins,
            timing_cache=args.timing_cache, workspace_mib=args.workspace, compute_capability=args.compute_capability,
            builder=args.builder, progress=stage_printer(show=not args.quiet),
        )
        log.info("%s", result.summary())
    from deployfuse.tables import show

    show(result.tables())
    return 0
