"""`deployfuse export`: fold, export, fuse and verify a PyTorch model as ONNX."""

from __future__ import annotations

import argparse
import sys

from deployfuse.cli._args import add_model_input_arguments
from deployfuse.export import EXPORTERS
from deployfuse.hf import SYNONYMS, TASKS
from deployfuse.pipeline import DEFAULT_OPSET, MAX_OPSET, MIN_OPSET, PRECISIONS, TARGETS, Progress, export
from deployfuse.quantize.gate import BUDGET_HELP, table as gate_table
from deployfuse.quantize.ort_int8 import MODES

EPILOG = """\
MODEL forms:
  model.ts / model.pt       TorchScript archive (torch.jit.save)
  model.pt2                 torch.export program (torch.export.save); carries its example inputs
  model.pt                  pickled module (torch.save(model)); runs code when loaded: --trust-pickle
  pkg.module:make_model     a callable returning a module, or (module, example_inputs)
  my_model/                 a Hugging Face folder (save_pretrained, with config.json): --task picks the
                            head; inputs as its processor names them; batch and sequence axes dynamic

examples:
  deployfuse export bert-folder/ -o bert.onnx --task fill-mask
  deployfuse export resnet.ts -o resnet.onnx --input x:1x3x224x224 --dynamic x:0:batch
  deployfuse export bert.pt2 -o bert.onnx --dynamic input_ids:0:batch --dynamic input_ids:1:seq
  deployfuse export deployfuse.examples.tiny_bert:build -o bert.onnx --target ort-cuda --report bert.json
  deployfuse export deployfuse.examples.tiny_bert:build -o bert-int8.onnx --precision int8 --calibration-data samples.npz

quantized exports (--precision int8 | fp8): exported in fp32, then quantized (ort-cpu int8: ONNX Runtime's
int8 kernels; tensorrt / ort-cuda: QuantizeLinear/DequantizeLinear pairs) and judged by an accuracy gate
against PyTorch fp32 instead of --rtol. Over --accuracy-budget, the most sensitive layers go back to fp32
one at a time until it passes; the report lists them.

exit codes: 0 exported and verified, 1 the export does not match PyTorch (or stays over its accuracy budget), 2 bad input,
3 internal failure (the message names a log file with the traceback; --report is still
written, with the failing step), 130 interrupted (143 on SIGTERM); no file is left half-written.
"""


SUMMARY = "fold BN, export to ONNX, fuse for a target, verify against PyTorch"
DESCRIPTION = """\
Fold BatchNorm, export to ONNX (dynamo, TorchScript fallback), fuse for the target, verify
against PyTorch on fresh random inputs, and write the ONNX file atomically.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="model file, package.module:callable, or Hugging Face folder (see forms below)")
    p.add_argument("-o", "--output", required=True, metavar="OUT.onnx", help="the ONNX file to write")
    add_model_input_arguments(p)
    p.add_argument("--task", choices=[*TASKS, *SYNONYMS], metavar="TASK",
                   help=f"Hugging Face folder: the task to export, Optimum's names ({', '.join(TASKS)}; also its older "
                   f"{', '.join(SYNONYMS)}); default: the saved architecture's")
    p.add_argument("--static", action="store_true", help="pin the batch and sequence axes a Hugging Face task makes dynamic by default")
    p.add_argument("--target", choices=TARGETS, default="ort-cpu", help="runtime the fusions lower for (default: ort-cpu)")
    p.add_argument("--precision", choices=list(PRECISIONS), default="fp32",
                   help="dtype to export in; int8 and fp8 quantize the GEMM-bearing layers behind an accuracy gate (default: fp32)")
    p.add_argument("--calibration-data", metavar="FILE", help="int8/fp8: samples to calibrate and gate on: a torch.save'd list of input dicts "
                   "(name -> tensor), an .npz with one array per input (a leading sample axis), or a folder of .npz files; the last "
                   "quarter is held out. Default: random inputs, with a warning")
    p.add_argument("--accuracy-budget", metavar="BUDGET", help=BUDGET_HELP)
    p.add_argument("--int8-mode", choices=MODES, help="--precision int8 --target ort-cpu: dynamic (activation scales computed at run time; "
                   "the default), dynamic-7bit (the same with weights in -64..64: for x86 CPUs without VNNI, where 8-bit weights "
                   "need ONNX Runtime's slower uint8 kernels) or static (fitted on --calibration-data)")
    p.add_argument("--opset", type=int, default=DEFAULT_OPSET, metavar="N", help=f"ONNX opset, {MIN_OPSET} to {MAX_OPSET} (default: {DEFAULT_OPSET})")
    p.add_argument("--exporter", choices=("auto", *EXPORTERS), default="auto",
                   help="auto: the dynamo exporter, then the TorchScript exporter if it fails (default: auto)")
    p.add_argument("--rtol", type=float, metavar="R", help="verification tolerance, compare's rule: an element passes when |onnx - torch| <= "
                   "atol + R * |torch|, atol being R * the output's max |value| (default: fp32 1e-4, fp16 1e-2, bf16 5e-2)")
    p.add_argument("--cuda-graph", action="store_true",
                   help="ort-cuda, static shapes: the artefact asks ORT to replay it as a CUDA graph (run it with IO binding); "
                   "also fuses the embeddings (embed_layer_norm), whose ORT kernel syncs the stream outside a graph")
    p.add_argument("--no-tf32", action="store_true",
                   help="ort-cuda: full fp32 MatMul/Conv (ORT's default rounds their inputs to TF32: faster, ~1e-3 relative error)")
    p.add_argument("--autotune", action="store_true",
                   help="time each fusion family on the target and keep only those that do not slow the model; "
                   "on ort-cuda with a GPU, also pick each GemmAct / Fp8GemmAct / Fp8Mlp node's fastest cuBLASLt algorithm(s), "
                   "after turning each Fp8GemmAct slower than the fp16 GEMM of its shape back into that fp16 GEMM")
    p.add_argument("--debug", action="store_true", help="show near misses: why fusion candidates did not fuse")
    p.add_argument("--no-fold", action="store_true", help="do not fold BatchNorm into Conv/Linear")
    p.add_argument("--no-fuse", action="store_true", help="do not rewrite the graph into fused nodes")
    p.add_argument("--skip-fusion", metavar="FAMILY[,FAMILY]", default="",
                   help="do not run these fusion families (the names the fusion table prints, e.g. split_qkv,bias_gelu): "
                   "to rule one out when a model misbehaves, or to time the model without it")
    p.add_argument("--no-verify", action="store_true", help="do not compare the ONNX model with PyTorch")
    p.add_argument("--verify-draws", type=int, default=3, metavar="N",
                   help="independent random input draws verified at each shape; after the first, attention masks are padded (default: 3)")
    p.add_argument("--seed", type=int, metavar="S", help="seed of the first verification draw, to repeat a verification (the report lists every seed)")
    p.add_argument("--allow-traced-control-flow", action="store_true",
                   help="accept a TorchScript trace that follows one branch of an `if` on tensor values (refused by default: "
                   "the ONNX model would compute that branch for every input)")
    p.add_argument("--report", metavar="FILE.json", help="write the report (steps, times, folds, exporter, ops, errors) as JSON")
    p.add_argument("--log-file", metavar="FILE", help="write a log of the run there: each step, each fusion family, and the warnings "
                   "of torch, transformers and the exporters (which the terminal does not show)")
    p.add_argument("-q", "--quiet", action="store_true", help="print only errors")
    p.add_argument("-v", "--verbose", action="store_true", help="show warnings from torch and the exporters")


def run(args: argparse.Namespace) -> int:
    from deployfuse.cli._progress import ExportProgress, log_to_file

    reads = {"MODEL": args.model, "--example-inputs": args.example_inputs, "--calibration-data": args.calibration_data}
    with log_to_file(args.log_file, reads, {"-o": args.output, "--report": args.report}), ExportProgress(show=not args.quiet) as progress:
        return _export(args, progress)


def _export(args: argparse.Namespace, progress: Progress) -> int:
    result = export(
        args.model, args.output, inputs=args.inputs, example_inputs=args.example_inputs, dynamic=args.dynamic,
        target=args.target, precision=args.precision, opset=args.opset, exporter=args.exporter, fold=not args.no_fold, fuse=not args.no_fuse,
        verify=not args.no_verify, cuda_graph=args.cuda_graph, tf32=not args.no_tf32, autotune=args.autotune, debug=args.debug, trust_pickle=args.trust_pickle,
        report_path=args.report, rtol=args.rtol, task=args.task, static=args.static,
        verify_draws=args.verify_draws, seed=args.seed, allow_traced_control_flow=args.allow_traced_control_flow,
        calibration_data=args.calibration_data, accuracy_budget=args.accuracy_budget, int8_mode=args.int8_mode, progress=progress,
        skip_fusions=args.skip_fusion,
    )
    warning = (result.report.quantization or {}).get("warning")
    if warning:
        print(warning, file=sys.stderr)  # even with --quiet
    note = (result.report.quantization or {}).get("cpu_note")
    if note and not args.quiet:
        print(note, file=sys.stderr)
    if not args.quiet:
        from deployfuse.tables import line, show

        items = result.report.tables()
        if result.gate is not None:
            items += [line(""), line(gate_table(result.gate))]
        if result.fusion is not None:
            items += [line(""), result.fusion.grid(title=f"fusions for {result.report.target}")]
        show([*items, line(""), line(f"wrote {result.onnx_path}" + (f" and {result.report_path}" if result.report_path else ""))])
    return 0


__all__ = ["DESCRIPTION", "EPILOG", "SUMMARY", "add_arguments", "run"]
