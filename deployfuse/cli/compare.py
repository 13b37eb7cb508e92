"""`deployfuse compare`: an artefact against PyTorch across backends: accuracy, latency, where it diverges."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from deployfuse.cli._args import add_model_input_arguments, argument_type
from deployfuse.compare import BACKENDS, Tolerances, compare
from deployfuse.compare.tolerances import parse_tolerance
from deployfuse.hf import SYNONYMS, TASKS
from deployfuse.tables import show

EPILOG = """\
examples:
  deployfuse compare bert-folder/ bert.onnx --json cmp.json     a save_pretrained folder, loaded for the task bert.onnx records
  deployfuse compare bert.pt2 bert.onnx --json cmp.json --report cmp.html
  deployfuse compare resnet.ts resnet.onnx --input x:8x3x224x224 --backends torch,ort-cpu,ort-cuda --atol logits:1e-3
  deployfuse compare bert.pt2 bert.onnx --backends torch,trt --engine bert.plan --plugins libdeployfuse_trt.so

The first backend is the reference. On a failure the first fused node whose output departs
from the unfused export (--reference-onnx, or exported again from MODEL) is named.
ort-cuda and trt need a CUDA GPU (onnxruntime-gpu; TensorRT or TensorRT-RTX).

exit codes: 0 every backend matches the first, 1 an accuracy failure, 2 bad input,
3 internal failure (the message names a log file with the traceback), 130 interrupted.
"""


def _tolerance(flag: str):
    """An argparse type that checks `[OUT:]V` now (exit 2 with our message) and keeps the text."""

    def check(text: str) -> str:
        parse_tolerance(text, flag)
        return text

    check.__qualname__ = f"{flag} value"
    return argument_type(check)


SUMMARY = "compare an ONNX model / TensorRT engine with PyTorch: accuracy, latency, first divergence"
DESCRIPTION = """\
Run the same inputs through PyTorch, ONNX Runtime and TensorRT with Polygraphy's Comparator,
compare every output with the first backend, time each backend, and localise a failure to a
fused node.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="the PyTorch model: file, package.module:callable or a Hugging Face folder (save_pretrained)")
    p.add_argument("onnx", metavar="ONNX", help="the ONNX model to check")
    add_model_input_arguments(p)
    p.add_argument("--task", choices=[*TASKS, *SYNONYMS], metavar="TASK",
                   help="Hugging Face folder: the task to load it for (default: the task the export recorded in ONNX, else the saved architecture's)")
    p.add_argument("--backends", default="torch,ort-cpu", metavar="B,B,...",
                   help=f"comma-separated, from {', '.join(BACKENDS)}; the first is the reference (default: torch,ort-cpu)")
    p.add_argument("--engine", metavar="PLAN", help="a TensorRT engine for the trt backend (built from ONNX when absent)")
    p.add_argument("--atol", action="append", default=[], type=_tolerance("--atol"), metavar="[OUT:]V",
                   help="absolute tolerance, for all outputs or one (repeat); default by dtype: fp32 1e-4 (5e-3 on an ort-cuda session using TF32), fp16 1e-2, bf16 5e-2")
    p.add_argument("--rtol", action="append", default=[], type=_tolerance("--rtol"), metavar="[OUT:]V",
                   help="relative tolerance: an element passes when |actual - reference| <= atol + rtol * |reference| (export's --rtol is the same, "
                   "with atol = rtol * the output's max |value|), for all outputs or one; default fp32 1e-3 (TF32 5e-3), fp16 1e-2, bf16 5e-2")
    p.add_argument("--iterations", type=int, default=20, metavar="N", help="timed runs per backend; 0 skips latency (default: 20)")
    p.add_argument("--warmup", type=int, default=3, metavar="N", help="untimed runs before timing (default: 3)")
    p.add_argument("--custom-ops", metavar="LIB", help="the deployfuse ONNX Runtime custom-op library to register")
    p.add_argument("--plugins", action="append", default=[], metavar="LIB", help="a TensorRT plugin library to load (repeat)")
    p.add_argument("--reference-onnx", metavar="UNFUSED.onnx", help="the unfused export, to localise a failure (exported again from MODEL when absent)")
    p.add_argument("--no-localize", action="store_true", help="do not look for the first diverging fused node on failure")
    p.add_argument("--torch-device", default="cpu", choices=["cpu", "cuda"], help="where the PyTorch runner runs (default: cpu)")
    p.add_argument("--seed", type=int, metavar="N", help="random seed for the inputs")
    p.add_argument("--json", metavar="FILE", help="write every figure as JSON")
    p.add_argument("--report", metavar="FILE.html", help="write an HTML report with latency and error plots")
    p.add_argument("--save-results", metavar="FILE.json",
                   help="write Polygraphy RunResults, and the inputs beside it as NAME.inputs.json (polygraphy run --load-inputs/--load-outputs)")
    p.add_argument("--log-file", metavar="FILE", help="write a log of the run there: each stage, and the warnings of torch, transformers "
                   "and the runners (which the terminal does not show)")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the verdict")
    p.add_argument("-v", "--verbose", action="store_true", help="show Polygraphy's log and warnings")


def run(args: argparse.Namespace) -> int:
    if args.iterations < 0 or args.warmup < 0:
        from deployfuse.errors import UsageError

        raise UsageError(f"--iterations and --warmup must be >= 0 (got {args.iterations}, {args.warmup})")
    from deployfuse.cli._progress import log_to_file, stage_printer

    reads = {"MODEL": args.model, "ONNX": args.onnx, "--reference-onnx": args.reference_onnx, "--engine": args.engine, "--custom-ops": args.custom_ops,
             "--example-inputs": args.example_inputs}
    writes = {"--json": args.json, "--report": args.report, "--save-results": args.save_results}
    with log_to_file(args.log_file, reads, writes):
        return _compare(args, stage_printer(show=not args.quiet))


def _compare(args: argparse.Namespace, progress: Callable[[str], None]) -> int:
    result = compare(
        args.model, args.onnx, backends=args.backends.split(","), inputs=args.inputs, example_inputs=args.example_inputs,
        dynamic=args.dynamic, trust_pickle=args.trust_pickle, task=args.task, atol=Tolerances.parse(args.atol, args.rtol),
        iterations=args.iterations, warmup=args.warmup, engine=args.engine, custom_ops=args.custom_ops, plugins=args.plugins,
        reference_onnx=args.reference_onnx, localize_failures=not args.no_localize, torch_device=args.torch_device, seed=args.seed,
        json_path=args.json, report_path=args.report, save_results=args.save_results, verbose=args.verbose,
        progress=progress,
    )
    if not args.quiet:
        show(result.tables())
        for kind, path in result.files.items():
            print(f"wrote {kind}: {path}")
    if not result.passed:
        where = f"; first divergence at {result.first_divergence['node']} (rule {result.first_divergence['rule']})" if result.first_divergence else ""
        print(f"deployfuse compare: error: outputs differ from {result.reference} beyond tolerance: {', '.join(result.failures())}{where}", file=sys.stderr)
        return 1
    return 0


__all__ = ["DESCRIPTION", "EPILOG", "SUMMARY", "add_arguments", "run"]
