"""`deployfuse.export`: load, fold, export, clean, fuse, verify, save — the product's spine.

Each step is timed and reported. Bad input raises UsageError before anything is written; an
artefact that does not match PyTorch raises AccuracyError and is not written either (the
report, when asked for, is written in both cases so the failure can be read).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import secrets
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
import torch

from deployfuse import metadata
from deployfuse.backends import ort as ort_backend, u8s8
from deployfuse.errors import AccuracyError, DeployfuseError, UsageError, first_line
from deployfuse.export import EXPORTERS, clean, flatten_outputs, to_onnx
from deployfuse.inputs import DynamicAxis, InputSpec, Inputs, as_specs, checked_dynamic, make_inputs, mask_like, resized, specs_of
from deployfuse.io import check_outputs, check_writable_target, default_opset, temporary_folder, write_text_atomic
from deployfuse.loading import LoadedModel, given_inputs, load_model
from deployfuse.quantize.calibration import RANDOM_WARNING, Calibration, load_calibration, random_calibration
from deployfuse.quantize.gate import GATE_SAMPLES, GateResult
from deployfuse.quantize.lowering import QuantizeOptions, before_fusion, check_options
from deployfuse.report import ExportReport, Step
from deployfuse.rewrite import FusionReport, fuse as fuse_graph
from deployfuse.targets import DEPLOYFUSE, ORT_CUDA, TARGETS, Target, get_target
from deployfuse.verify import ABS_FLOOR, DEFAULT_RTOL, compare_outputs, to_numpy

# The dtype each precision exports in: int8/fp8 export fp32, then quantize it (deployfuse.quantize).
PRECISIONS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "int8": torch.float32, "fp8": torch.float32}
DEFAULT_OPSET = 20
# Opsets an export honours (checked with torch 2.14, onnx 1.23, ONNX Runtime 1.32): the dynamo
# exporter writes 18 to 25 (asked for less, it writes 18, or a 17 whose ReduceMean ONNX Runtime
# rejects), the TorchScript exporter 14 to 20, which the ONNX version converter takes up to 25.
MIN_OPSET, MAX_OPSET, MIN_DYNAMO_OPSET = 14, 25, 18
EXTERNAL_DATA_THRESHOLD = 2 * 1024**3  # protobuf cannot serialise a model above 2 GiB

Progress = Callable[[str, Step | None], None]  # (step name, None when it starts / the Step when it ends)


@dataclass
class ExportResult:
    """What `export` produced: the ONNX file, the report, where the report went, the fusion
    report (None with fuse=False) and, for a quantized export, the accuracy gate's result."""

    onnx_path: Path
    report: ExportReport
    report_path: Path | None = None
    fusion: FusionReport | None = None
    gate: GateResult | None = None  # int8/fp8: what the accuracy gate measured


@dataclass(frozen=True)
class _Request:
    """What `export` was asked to do (its arguments, checked), for the steps to read."""

    model: str | os.PathLike[str] | torch.nn.Module
    target: Target
    precision: str
    inputs: Sequence[InputSpec]
    example_inputs: Any
    dynamic: Sequence[DynamicAxis]
    exporter: str
    fold: bool
    fuse: bool
    verify: bool
    cuda_graph: bool
    tf32: bool
    autotune: bool
    debug: bool
    trust_pickle: bool
    rtol: float | None
    task: str | None = None
    static: bool = False
    quantize: QuantizeOptions | None = None
    skip_fusions: tuple[str, ...] = ()


class _Steps:
    """Times steps, records them in the report and tells the progress callback."""

    def __init__(self, report: ExportReport, progress: Progress | None):
        self.report, self.progress = report, progress

    @contextmanager
    def step(self, name: str) -> Iterator[Step]:
        if self.progress:
            self.progress(name, None)
        record = Step(name, "ok", 0.0)
        start = time.perf_counter()
        try:
            yield record
        except BaseException as exc:
            record.status = "failed"
            record.detail = record.detail or (str(exc).splitlines() or [type(exc).__name__])[0]
            raise
        finally:
            record.seconds = time.perf_counter() - start
            self.report.steps.append(record)
            if self.progress:
                self.progress(name, record)

    def skip(self, name: str, why: str) -> None:
        record = Step(name, "skipped", 0.0, why)
        self.report.steps.append(record)
        if self.progress:
            self.progress(name, record)


def export(
    model: str | os.PathLike[str] | torch.nn.Module,
    output: str | os.PathLike[str],
    *,
    inputs: Sequence[InputSpec | str] = (),
    example_inputs: str | os.PathLike[str] | Sequence[torch.Tensor] | Mapping[str, torch.Tensor] | None = None,
    dynamic: Sequence[DynamicAxis | str] = (),
    target: str | Target = "ort-cpu",
    precision: str = "fp32",
    opset: int | None = None,
    exporter: str = "auto",
    fold: bool = True,
    fuse: bool = True,
    verify: bool = True,
    cuda_graph: bool = False,
    tf32: bool = True,
    autotune: bool = False,
    debug: bool = False,
    trust_pickle: bool = False,
    report_path: str | os.PathLike[str] | None = None,
    rtol: float | None = None,
    verify_draws: int = 3,
    seed: int | None = None,
    allow_traced_control_flow: bool = False,
    progress: Progress | None = None,
    task: str | None = None,
    static: bool = False,
    calibration_data: str | os.PathLike[str] | None = None,
    accuracy_budget: str | None = None,
    int8_mode: str | None = None,
    skip_fusions: Sequence[str] = (),
) -> ExportResult:
    """Export `model` to a fused, verified ONNX file at `output`.

    Args:
        model: a model file (TorchScript, .pt2, pickled module), `package.module:callable`,
            or an `nn.Module`.
        output: the ONNX path to write (atomically).
        inputs: shapes and dtypes to make random inputs from: `InputSpec`s, or `--input`'s strings
            ("input_ids:1x128:int64").
        example_inputs: a `torch.save`d tuple/dict of tensors, or the tensors themselves.
        dynamic: axes that vary at run time, verified at a second shape too: `DynamicAxis`es, or
            `--dynamic`'s strings ("input_ids:0:batch").
        target: "ort-cpu", "ort-cuda" or "tensorrt": which ops the fusions may emit.
        precision: "fp32", "fp16" or "bf16": the dtype the model is exported in; "int8" or "fp8":
            exported in fp32, then quantized and checked by the accuracy gate (`deployfuse.quantize`).
        opset: the ONNX opset; default 20.
        exporter: "auto" (dynamo, then TorchScript if dynamo fails), "dynamo" or "torchscript".
        fold, fuse, verify: run those steps.
        cuda_graph: (ort-cuda, static shapes) have ORT capture the model in a CUDA graph; the
            caller must then bind inputs and outputs with IO binding at fixed addresses. Also runs
            the fusions that only pay inside a graph (`rewrite.rules.CUDA_GRAPH_ONLY`: embed_layer_norm).
        tf32: (ort-cuda) let ORT run fp32 MatMul/Conv on TF32 tensor cores, its default;
            False makes the artefact ask for full fp32 (use_tf32=0), slower and ~10x closer
            to PyTorch's fp32.
        autotune: time each fusion family on the target and keep only those that do not make
            the model slower (ort-cpu; ort-cuda where a CUDA build of ONNX Runtime is present);
            on ort-cuda also each GemmAct / Fp8GemmAct / Fp8Mlp node's cuBLASLt algorithm, timed on this
            machine's GPU with the built CUDA library (`rewrite.gemm_tuning`; fp8: after the gate, and after
            each Fp8GemmAct slower than the fp16 GemmAct of its shape became it, `quantize.speed_precision`).
        debug: record near misses of the fusion rules (why a candidate did not fuse).
        trust_pickle: allow loading a pickled module (runs code from the file).
        report_path: write the JSON report there.
        rtol: verification tolerance: |onnx - torch| <= atol + rtol * |torch| per element, atol = rtol x the output's max |value| (compare's rule).
        verify_draws: independent random input draws verified at each shape (different
            seeds, token ids and padded attention masks after the first draw).
        seed: the first verification draw's seed (the report records every seed); random when None.
        allow_traced_control_flow: accept a TorchScript trace that baked a branch on tensor
            values (`if x.sum() > 0:`) into the graph; refused by default.
        progress: called when each step starts and ends.
        task: for a Hugging Face folder, the task to export (Optimum's names, e.g. "fill-mask");
            default: the task of the saved architecture.
        static: pin the axes a Hugging Face task makes dynamic by default (batch, sequence);
            `cuda_graph` pins them too.
        calibration_data: int8/fp8: samples to calibrate on (a torch.save'd list of input dicts,
            an .npz, or a folder of them); random inputs, with a warning, when None.
        accuracy_budget: int8/fp8: the gate's budget, e.g. "cos=0.999,rel=2e-2" (the default).
        int8_mode: int8 on ort-cpu: "dynamic" (default) or "static" activation scales, or "dynamic-7bit" (weights
            in -64..64, for x86 CPUs without VNNI).
        skip_fusions: fusion families not to run (names as `deployfuse.rewrite.fuser.family_names()`
            lists them), e.g. to rule one out when a model misbehaves or to time a model without it.

    Raises:
        UsageError: bad input; nothing is written.
        AccuracyError: the export does not match PyTorch (or follows one branch of data-dependent
            control flow, or a quantized export stays over its accuracy budget); the ONNX file is
            not written.
    """
    if isinstance(verify_draws, bool) or not isinstance(verify_draws, int) or verify_draws < 1:
        raise UsageError(f"--verify-draws {verify_draws!r}: give a whole number of input draws per shape, 1 or more")
    checking = _Checking(verify_draws, seed, allow_traced_control_flow)
    inputs, dynamic = as_specs(inputs, InputSpec, "inputs"), as_specs(dynamic, DynamicAxis, "dynamic")
    resolved = get_target(target)  # UsageError for an unknown name
    if cuda_graph and (resolved != ORT_CUDA or dynamic):
        raise UsageError("--cuda-graph needs --target ort-cuda and static shapes (no --dynamic): a CUDA graph replays fixed shapes")
    if static and dynamic:
        raise UsageError("--static pins every axis: drop the --dynamic flags, or --static")
    if not tf32 and resolved != ORT_CUDA:
        raise UsageError("--no-tf32 is an ONNX Runtime CUDA option: it needs --target ort-cuda")
    if exporter != "auto" and exporter not in EXPORTERS:
        raise UsageError(f"unknown exporter {exporter!r}; choose auto or one of {', '.join(EXPORTERS)}")
    if precision not in PRECISIONS:
        raise UsageError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    if rtol is not None and not rtol > 0:  # also NaN
        raise UsageError(f"--rtol must be a positive number, got {rtol}")
    if opset is not None and not MIN_OPSET <= opset <= MAX_OPSET:
        raise UsageError(f"--opset {opset} is not supported: choose {MIN_OPSET} to {MAX_OPSET} (default {DEFAULT_OPSET})")
    if opset is not None and opset < MIN_DYNAMO_OPSET and exporter == "dynamo":
        raise UsageError(f"--opset {opset}: the dynamo exporter writes opset {MIN_DYNAMO_OPSET} and newer; use --exporter torchscript (or auto) for {opset}")
    quantize = check_options(precision, resolved, opset or DEFAULT_OPSET, None if calibration_data is None else str(calibration_data), accuracy_budget,
                             int8_mode, rtol)
    model_file = None if isinstance(model, torch.nn.Module) else model
    example_file = example_inputs if isinstance(example_inputs, (str, os.PathLike)) else None
    paths = check_outputs({"-o": output, "--report": report_path}, {"MODEL": model_file, "--example-inputs": example_file,
                                                                   "--calibration-data": calibration_data})
    out_path, report_file = paths["-o"], paths.get("--report")
    report = ExportReport(str(model) if not isinstance(model, torch.nn.Module) else type(model).__name__, str(out_path), resolved.name, precision, opset or DEFAULT_OPSET)
    report.provenance["seed"] = seed
    steps = _Steps(report, progress)
    try:
        request = _Request(model, resolved, precision, inputs, example_inputs, dynamic, exporter, fold, fuse, verify, cuda_graph, tf32, autotune, debug, trust_pickle, rtol,
                           task, static, quantize, _skip_fusions(skip_fusions))
        fusion, gate = _run(request, out_path, report, steps, checking)
    except Exception as exc:  # the report says which step failed, for a deployfuse bug too
        report.error = str(exc) if isinstance(exc, DeployfuseError) else f"internal error: {first_line(exc, typed=True)}"
        if report_file is not None and not isinstance(exc, UsageError):
            write_text_atomic(report_file, json.dumps(report.to_dict(), indent=2))
        raise
    if report_file is not None:
        write_text_atomic(report_file, json.dumps(report.to_dict(), indent=2))
    return ExportResult(out_path, report, report_file, fusion, gate)


@dataclass(frozen=True)
class _Checking:
    """How far the export is trusted: input draws verified per shape, their first seed, and
    whether a trace that baked in a branch on tensor values is accepted."""

    draws: int = 3
    seed: int | None = None
    allow_traced_control_flow: bool = False


@dataclass(frozen=True)
class _Draw:
    """One verification input set: which shape (0: the example's), which draw, its seed."""

    inputs: Inputs
    shape: int
    draw: int
    seed: int


def _run(request: _Request, out_path: Path, report: ExportReport, steps: _Steps, checking: _Checking) -> tuple[FusionReport | None, GateResult | None]:
    with steps.step("load") as step:
        # Folding and casting happen in place: work on a copy of a module the caller handed us.
        loaded = load_model(copy.deepcopy(request.model) if isinstance(request.model, torch.nn.Module) else request.model, trust_pickle=request.trust_pickle, task=request.task)
        report.task = loaded.task
        report.form = step.detail = loaded.form
        example = _example_inputs(loaded, request.inputs, request.example_inputs)
        if loaded.dynamic and not (request.dynamic or request.static or request.cuda_graph):
            # A Hugging Face task's batch and sequence axes, on the inputs the export runs with.
            request = dataclasses.replace(request, dynamic=[d for d in loaded.dynamic if d.name in example])
        request = dataclasses.replace(request, dynamic=_dynamic_axes(loaded, request.dynamic, example, step))
        report.dynamic = [f"{d.name}:{d.axis}:{d.label}" for d in request.dynamic]
        weights = metadata.weights_digest(loaded.module)  # as loaded: what compare recomputes from MODEL
        # A quantized export is exported in its float precision (fp8 on ort-cuda: fp16 around the fp8 GEMMs).
        dtype = PRECISIONS[request.quantize.float_precision if request.quantize is not None else request.precision]
        draws = _verification_inputs(loaded, example, request.dynamic, checking, dtype) if request.verify else []
        # References come from the unfolded fp32 model, so verification also checks the fold and
        # the cast; in fp16/bf16 they run on the same rounded inputs the ONNX model gets.
        references = [_reference_run(loaded, d.inputs if dtype == torch.float32 else _cast(d.inputs, torch.float32)) for d in draws]
        if request.quantize is not None:  # the gate's references too, from the fp32 model
            calibration, gate_references = _calibration(loaded, example, request, checking, dtype)
            step.detail += f"; calibration: {calibration.source}"
        same_precision: list[dict[str, torch.Tensor]] = []
        if dtype != torch.float32:
            loaded.module.to(dtype)
            example = _cast(example, dtype)
            same_precision = [_reference_run(loaded, d.inputs) for d in draws] if request.quantize is None else []
        output_names = list(_reference_run(loaded, example))
        checks = [d.inputs for d in draws] or [example]

    if request.fold:
        with steps.step("fold") as step:
            from deployfuse.fold import fold_batchnorm

            fold_report = fold_batchnorm(loaded.module, example)
            report.fold = fold_report.to_dict()
            step.detail = ", ".join(f"{k} {v}" for k, v in fold_report.counts.items() if v) or "nothing to fold"
    else:
        steps.skip("fold", "--no-fold")

    with steps.step("export") as step:
        # torch.export cannot trace TorchScript, so archives go straight to the TorchScript exporter.
        exporters = ("torchscript",) if loaded.form == "torchscript" else EXPORTERS if request.exporter == "auto" else (request.exporter,)
        if report.opset < MIN_DYNAMO_OPSET and request.exporter == "auto":
            exporters = ("torchscript",)  # the dynamo exporter cannot write opsets below 18
        onnx_model, attempts = to_onnx(loaded, _traceable(example, request.dynamic), request.dynamic, output_names, report.opset, exporters)
        report.export_attempts = [a.to_dict() for a in attempts]
        baked = attempts[-1].data_dependent
        if baked and not checking.allow_traced_control_flow:
            raise AccuracyError(
                f"the {attempts[-1].exporter} exporter followed one branch of data-dependent control flow ({baked[0]}"
                f"{f'; {len(baked) - 1} more in the report' if len(baked) > 1 else ''}): the ONNX model computes that branch for every "
                "input, so it differs from PyTorch on inputs that take another; write the branch with torch.where or torch.cond, "
                "or pass --allow-traced-control-flow to accept it (random-input verification is then the only check)")
        report.exporter = attempts[-1].exporter
        step.detail = report.exporter + (" (the dynamo exporter failed: see the report)" if len(attempts) > 1 else "")
        if baked:
            step.detail += f"; {len(baked)} branch(es) on tensor values baked in, accepted (--allow-traced-control-flow)"
        onnx_model = _at_opset(onnx_model, report.opset, report.exporter)

    with steps.step("clean") as step:
        onnx_model = clean(onnx_model)
        step.detail = f"{len(onnx_model.graph.node)} nodes"
        if request.precision == "bf16":
            _check_runnable(onnx_model, request.target, request.fuse, request.verify)

    gate = None
    quantize_first = before_fusion(request.target, request.quantize)
    tune_gemms = request.autotune and request.target == ORT_CUDA
    # Quantized after fusion (fp8 on ort-cuda: its Fp8GemmAct nodes), the GEMMs are tuned in the final artefact, after the gate.
    tunes_quantized = tune_gemms and request.quantize is not None and not quantize_first
    if quantize_first:  # the fusions then run on the Q/DQ graph
        onnx_model, gate = _quantize_step(onnx_model, request, calibration, gate_references, report, steps)

    if request.fuse:
        with steps.step("fuse") as step:
            # The guard checks each family on the first two draws of each shape (masks all ones,
            # then padded): more draws would multiply its runs without another mask path.
            guard_inputs = [d.inputs for d in draws if d.draw < 2] or checks
            feeds = [{k: to_numpy(v) for k, v in x.items()} for x in guard_inputs]
            onnx_model, fusion = fuse_graph(onnx_model, request.target, feeds, debug=request.debug, autotune=request.autotune,
                                            on_family=getattr(steps.progress, "family", None), families=_families(request))
            report.fusion = fusion.to_dict()
            if request.skip_fusions:
                report.fusion["skipped_by_request"] = list(request.skip_fusions)
            step.detail = f"{len(onnx_model.graph.node)} nodes"
            if quantize_first and gate is not None:
                _gate_fused(onnx_model, gate, calibration, gate_references, report)
            if tune_gemms and not tunes_quantized:  # GemmAct's cuBLASLt algorithm per shape, timed on this GPU
                from deployfuse.rewrite.gemm_tuning import tune

                step.detail += "; " + tune(onnx_model, {k: to_numpy(v) for k, v in example.items()})
    else:
        fusion = None
        steps.skip("fuse", "--no-fuse")
    metadata.write(onnx_model, metadata.INPUT_SHAPES, {k: list(v.shape) for k, v in example.items()})
    metadata.write(onnx_model, metadata.WEIGHTS_SHA256, weights)
    if loaded.task is not None:
        metadata.write(onnx_model, metadata.TASK, loaded.task)  # compare loads the folder for the same task
    if request.target == ORT_CUDA:
        timer = None
        if request.autotune:
            from deployfuse.rewrite.autotune import cuda_option_timer

            timer = cuda_option_timer(onnx_model, {k: to_numpy(v) for k, v in checks[0].items()})
        metadata.write(onnx_model, metadata.CUDA_PROVIDER_OPTIONS, cuda_provider_options(onnx_model, request.cuda_graph, request.tf32, request.precision, timer))
    report.op_histogram = _op_histogram(onnx_model)

    if request.quantize is not None:
        if not quantize_first:
            onnx_model, gate = _quantize_step(onnx_model, request, calibration, gate_references, report, steps,
                                              {k: to_numpy(v) for k, v in example.items()} if tunes_quantized else None)
            report.op_histogram = _op_histogram(onnx_model)
        steps.skip("verify", "the accuracy gate (quantize step) judged the quantized model against PyTorch fp32" if gate else "--no-verify")
    elif request.verify:
        with steps.step("verify") as step:
            tolerance = request.rtol if request.rtol is not None else DEFAULT_RTOL[request.precision]
            against = f"PyTorch fp32 (the model before the cast to {request.precision})" if same_precision else "PyTorch"
            shapes = list({d.shape: _shape_text(d.inputs) for d in draws}.values())
            report.verification = {"draws_per_shape": checking.draws, "shapes": shapes, "seeds": [d.seed for d in draws],
                                   "reference": against, "rtol": tolerance}
            _verify(onnx_model, draws, references, same_precision, tolerance, report)
            worst = max(o["max_rel_error"] for v in report.verify for o in v["outputs"])
            step.detail = f"{checking.draws} input draw(s) at each of {len(shapes)} shape(s) ({'; '.join(shapes)}), worst relative error {worst:.2e}"
            if same_precision:
                worst_same = max(o["same_precision_rel_error"] for v in report.verify for o in v["outputs"])
                step.detail += f" vs fp32, {worst_same:.2e} vs PyTorch in {request.precision}"
            vanishing = sorted({o["name"] for v in report.verify for o in v["outputs"] if o["near_zero"]})
            if vanishing:  # passed on the absolute floor alone: say so rather than let the pass read as proof
                step.detail += f"; every value of {', '.join(vanishing)} is below {ABS_FLOOR:g} in PyTorch too, so this check proves little there"
            failing = [v for v in report.verify if not all(o["passed"] for o in v["outputs"])]
            if failing:
                names = dict.fromkeys(o["name"] for v in failing for o in v["outputs"] if not o["passed"])
                raise AccuracyError(f"ONNX output differs from {against} beyond tolerance (rtol {tolerance:g}) on {len(failing)} of "
                                    f"{len(draws)} input draws: {', '.join(names)}")
    else:
        steps.skip("verify", "--no-verify")

    with steps.step("save") as step:
        if default_opset(onnx_model) != report.opset:  # a step changed it: a deployfuse bug, never a mislabelled file
            raise RuntimeError(f"the model is at opset {default_opset(onnx_model)}, not the {report.opset} the report records")
        size = save_model(onnx_model, out_path)
        step.detail = f"{out_path.name}, {size / 1e6:.1f} MB"
    return fusion, gate


def _op_histogram(model: onnx.ModelProto) -> dict[str, int]:
    """Node counts by [domain.]op_type, most frequent first (the report's `op_histogram`)."""
    return dict(Counter(f"{n.domain + '.' if n.domain else ''}{n.op_type}" for n in model.graph.node).most_common())


def _skip_fusions(names: Sequence[str]) -> tuple[str, ...]:
    """`skip_fusions`, checked against the known families (UsageError naming them)."""
    from deployfuse.rewrite.fuser import family_names

    if isinstance(names, str):
        names = [n for n in names.split(",") if n]
    unknown = sorted(set(names) - set(family_names()))
    if unknown:
        raise UsageError(f"--skip-fusion: unknown fusion famil{'ies' if len(unknown) > 1 else 'y'} {', '.join(unknown)}; known: {', '.join(family_names())}")
    return tuple(names)


def _families(request: _Request) -> list[str] | None:
    """The fusion families to run: all (None), less those the caller skips, those a quantized
    export runs without (`quantize.lowering.skipped_families`: fused nodes its quantization could
    not reach) and, without --cuda-graph, those that only pay inside a CUDA graph (`rules.CUDA_GRAPH_ONLY`)."""
    from deployfuse.quantize.lowering import skipped_families
    from deployfuse.rewrite.fuser import family_names
    from deployfuse.rewrite.rules import CUDA_GRAPH_ONLY

    graph_only = () if request.cuda_graph else CUDA_GRAPH_ONLY
    skipped = {*skipped_families(request.target, request.quantize), *request.skip_fusions, *graph_only}
    return [f for f in family_names() if f not in skipped] if skipped else None


def _calibration(loaded: LoadedModel, example: Inputs, request: _Request, checking: _Checking,
                 dtype: torch.dtype) -> tuple[Calibration, dict[str, list[dict[str, torch.Tensor]]] | None]:
    """The calibration samples of a quantized export, floats in the export's `dtype`, and, when
    it is verified, PyTorch fp32's outputs on those the gate judges (from the fp32 model as
    loaded, before the fold and the cast, on the samples as rounded to `dtype`)."""
    options = request.quantize
    assert options is not None
    if options.calibration_data is not None:
        calibration = load_calibration(options.calibration_data, example, request.dynamic)
    else:
        calibration = random_calibration(example, loaded.module, checking.seed if checking.seed is not None else 0)
    if dtype != torch.float32:
        calibration = dataclasses.replace(calibration, samples=[_cast(s, dtype) for s in calibration.samples],
                                          held_out=[_cast(s, dtype) for s in calibration.held_out])
    if not request.verify:
        return calibration, None

    def fp32_outputs(samples: list[Inputs]) -> list[dict[str, torch.Tensor]]:
        return [_reference_run(loaded, _cast(s, torch.float32)) for s in samples[:GATE_SAMPLES]]

    return calibration, {"calibration": fp32_outputs(calibration.samples), "held-out": fp32_outputs(calibration.held_out)}


def _quantize_step(model: onnx.ModelProto, request: _Request, calibration: Calibration, references: dict[str, list[dict[str, torch.Tensor]]] | None,
                   report: ExportReport, steps: _Steps, tune_feed: Mapping[str, Any] | None = None) -> tuple[onnx.ModelProto, GateResult | None]:
    """The quantize step; with `tune_feed` (the export's example), fp8's SkipLayerNormFp8 nodes are then timed against the
    GEMMs' own quantize passes and undone where slower (`fp8_norm.autotune`: the same float8 values), likewise the FusedMHA
    nodes writing their output projections' float8 X (`fp8_attention_out.autotune`), the Fp8GemmAct nodes
    slower than their float GemmAct turned into it (`speed_precision.choose_precision`: fp8 where it is faster), and the
    GEMMs' cuBLASLt algorithms tuned on this GPU (`gemm_tuning.tune`: `algo` picks a kernel, never the math); the gate has
    judged the model already (a GEMM back in float drops X's rounding to float8 and nothing else)."""
    options = request.quantize
    assert options is not None
    with steps.step("quantize") as step:
        quantized, gate = _quantized(model, request, calibration, references, report)
        step.detail = _quantize_detail(options, gate, quantized)
        if tune_feed is not None:
            from deployfuse.backends.ort import native_library
            from deployfuse.quantize.speed_precision import choose_precision
            from deployfuse.rewrite.gemm_tuning import tune
            from deployfuse.rewrite.rules import fp8_attention_out, fp8_norm

            quantized, norms = fp8_norm.autotune(quantized, tune_feed, native_library())  # fp8: the norms quantizing the GEMMs' X, A/B
            quantized, attention = fp8_attention_out.autotune(quantized, tune_feed, native_library())  # and the attentions
            quantized, speed = choose_precision(quantized, tune_feed, float_name=options.float_precision)
            if speed.line:  # beside the gate's layers kept in float for accuracy: the GEMMs kept in float for speed
                assert report.quantization is not None
                report.quantization[f"{options.float_precision}_for_speed"] = speed.to_dict()
                recorded = metadata.read(quantized, metadata.QUANTIZATION)
                if isinstance(recorded, dict):
                    metadata.write(quantized, metadata.QUANTIZATION, {**recorded, f"{options.float_precision}_for_speed_layers": list(speed.reverted)})
            step.detail += "".join(f"; {line}" for line in (norms, attention, speed.line, tune(quantized, tune_feed)) if line)
    return quantized, gate


def _gate_fused(model: onnx.ModelProto, gate: GateResult, calibration: Calibration, references: dict[str, list[dict[str, torch.Tensor]]] | None,
                report: ExportReport) -> None:
    """Hold the fused artefact of a graph quantized before fusion to the gate's budget: the guard
    kept each fusion close to the Q/DQ graph the gate passed; the gate's errors become the fused graph's."""
    from deployfuse.quantize.gate import GateFailed, measure

    assert references is not None and report.quantization is not None
    gate.errors = measure(model, calibration, references, batch=gate.budget.batch)
    broken = [f"{e.name} ({e.samples}) {', '.join(b)}" for e in gate.errors if (b := gate.budget.exceeded(e))]
    gate.passed = not broken
    report.quantization["gate"] = gate.to_dict()
    if broken:
        raise GateFailed(gate, f"the fused quantized model is over the accuracy budget ({gate.budget.text()}) that its unfused Q/DQ graph met: {broken[0]}")


def _quantized(model: onnx.ModelProto, request: _Request, calibration: Calibration, references: dict[str, list[dict[str, torch.Tensor]]] | None,
               report: ExportReport) -> tuple[onnx.ModelProto, GateResult | None]:
    """`model` quantized as asked, gated against `references`; the report and the artefact's
    metadata record the budget, the calibration source and the layers kept in float
    (`options.float_precision`)."""
    from deployfuse.quantize.gate import GateFailed
    from deployfuse.quantize.lowering import quantize

    options = request.quantize
    assert options is not None
    report.quantization = {"precision": options.precision, "mode": options.mode, "budget": options.budget.to_dict(), "calibration": calibration.source,
                           "warning": RANDOM_WARNING if calibration.random else None,
                           "cpu_note": u8s8.SATURATION_NOTE if options.mode == "dynamic" and u8s8.saturates() else None}
    try:
        quantized, gate = quantize(model, options, calibration, references)
    except GateFailed as exc:
        report.quantization["gate"] = exc.result.to_dict()
        raise
    if gate is not None:
        report.quantization["gate"] = gate.to_dict()
    metadata.write(quantized, metadata.QUANTIZATION, {"precision": options.precision, "mode": options.mode, "calibration": calibration.source,
                                                     f"{options.float_precision}_layers": [layer.node for layer in gate.fp32_layers] if gate else []})
    metadata.write(quantized, metadata.ACCURACY_BUDGET, options.budget.to_dict())
    return quantized, gate


def _quantize_detail(options: QuantizeOptions, gate: GateResult | None, quantized: onnx.ModelProto) -> str:
    head = f"{options.precision} {options.mode}"
    if options.fp8_gemms:  # what the fp8 GEMMs became, and what is left of the Q/DQ
        ops = Counter(n.op_type for n in quantized.graph.node)
        head += f" ({ops['Fp8GemmAct']} Fp8GemmAct, {ops['Fp8Mlp']} Fp8Mlp, {ops['QuantizeLinear'] + ops['DequantizeLinear']} Q/DQ left)"
    if gate is None:
        return f"{head}; not gated (--no-verify)"
    worst_cos, worst_rel = gate.attempts[-1]["worst_cos"], gate.attempts[-1]["worst_rel"]
    return (f"{head}, {gate.quantized_layers - len(gate.fp32_layers)} of {gate.quantized_layers} layers quantized; gate passed: worst cosine "
            f"{worst_cos:.6f}, rel {worst_rel:.2e} (budget {options.budget.text()})")


def cuda_provider_options(model: onnx.ModelProto, cuda_graph: bool, tf32: bool = True, precision: str = "fp32", timer: Any = None) -> dict[str, str]:
    """The ORT CUDA EP options an ort-cuda artefact carries, chosen from H200 measurements.

    prefer_nhwc: with `timer` (`--autotune` on a CUDA build of ORT, `autotune.cuda_option_timer`)
    set only when measured faster on this model (`autotune.measured_option`); without, only
    where 2-D convolutions dominate as in ResNet-50 (`autotune.nhwc_without_measurement`: at
    least 8 Conv2d of 64+ channels, 3/4 of all convolutions; batch 32: fp16 2.78 -> 1.92 ms,
    fp32 4.07 -> 3.17 ms). Not for a transformer with one patch convolution (ViT-B/16 fp16:
    2.32 -> 2.56 ms) nor a small Conv/ConvTranspose/Conv1d net (0.074 -> 0.118 ms), both of
    which the former rule (>= 4 convolutions) let through. enable_cuda_graph when
    asked (BERT-base fp16: 2.02 -> 1.00 ms), since it constrains how the caller runs the model; use_tf32=0 when full fp32 is asked for;
    sdpa_kernel=2 for fp32 models with ORT attention, which lifts ORT's 256-token minimum for
    its memory-efficient fp32 attention kernel (ViT-B/16 fp32, 197 tokens: 2.90 -> 2.72 ms with a
    CUDA graph; GPT-2 fp32 1.83 -> 1.73). See bench/results/h200.md.
    """
    from deployfuse.rewrite.autotune import measured_option, nhwc_without_measurement

    options: dict[str, str] = {}
    if cuda_graph:
        options["enable_cuda_graph"] = "1"
    if not tf32:
        options["use_tf32"] = "0"
    if precision == "fp32" and any(n.domain == "com.microsoft" and n.op_type in ("Attention", "MultiHeadAttention") for n in model.graph.node):
        options["sdpa_kernel"] = "2"  # AttentionBackend::EFFICIENT_ATTENTION
    nhwc = measured_option(timer, options, {"prefer_nhwc": "1"}).keep if timer is not None else nhwc_without_measurement(model)
    return {"prefer_nhwc": "1", **options} if nhwc else options


def _example_inputs(loaded: LoadedModel, specs: Sequence[InputSpec], example_inputs: Any) -> Inputs:
    inputs = given_inputs(loaded, specs, example_inputs)
    if inputs is None:
        names = ", ".join(loaded.input_names) or "the model's inputs"
        raise UsageError(f"no inputs to export with: give --input NAME:SHAPE[:DTYPE] for {names}, or --example-inputs FILE.pt")
    return inputs


def _check_runnable(model: onnx.ModelProto, target: Target, fuse: bool, verify: bool) -> None:
    """UsageError when ONNX Runtime cannot load `model` where the fuse guard (the target's
    providers) or verification (CPU) would run it: its CPU provider has no bfloat16 kernels
    for most ops (Conv, Add, MatMul), so a bf16 export cannot be fused or verified there."""
    from deployfuse.rewrite.guard import providers_for

    wanted = ([tuple(providers_for(target))] if fuse else []) + ([("CPUExecutionProvider",)] if verify else [])
    for providers in dict.fromkeys(wanted):
        try:
            ort_backend.session(model, providers=providers, optimize=False)
        except Exception as exc:
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0].split(" : ")[-1]
            raise UsageError(f"--precision bf16: ONNX Runtime ({', '.join(p.removesuffix('ExecutionProvider') for p in providers)}) cannot run this bfloat16 model ({reason}), "
                             "so it can be neither fused nor verified here; export in fp32 and build a TensorRT engine with --bf16, "
                             "use --precision fp16, or skip both steps with --no-fuse --no-verify") from exc


def _dynamic_axes(loaded: LoadedModel, dynamic: Sequence[DynamicAxis], example: Inputs, step: Step) -> list[DynamicAxis]:
    """The axes to export dynamic: those asked for, checked against the inputs, plus a `.pt2`
    program's own symbolic axes; otherwise extended to inputs that share them (see
    `checked_dynamic`), which the load step's detail names."""
    if loaded.form != "exported-program":
        axes, shared = checked_dynamic(dynamic, example)
        if shared:
            step.detail += "; also dynamic, sharing the size: " + ", ".join(f"{d.name}:{d.axis}:{d.label}" for d in shared)
        return axes
    axes, _ = checked_dynamic(dynamic, example, share=False)
    program = {(d.name, d.axis): d for d in loaded.dynamic}
    for d in axes:
        if (d.name, d.axis) not in program:
            raise UsageError(f"--dynamic {d.name}:{d.axis}:{d.label}: the .pt2 program fixes axis {d.axis} of {d.name} to {example[d.name].shape[d.axis]}; "
                             "export the program again with dynamic_shapes for that axis (torch.export.Dim), or drop --dynamic")
    given = {(d.name, d.axis) for d in axes}
    return axes + [d for key, d in program.items() if key not in given and d.name in example]


def _reference_run(loaded: LoadedModel, inputs: Inputs) -> dict[str, torch.Tensor]:
    try:
        outputs = flatten_outputs(loaded(inputs))
    except Exception as exc:
        shapes = ", ".join(f"{k}:{'x'.join(map(str, v.shape))}:{str(v.dtype).removeprefix('torch.')}" for k, v in inputs.items())
        raise UsageError(f"the model rejects inputs {shapes}: {first_line(exc, typed=True)}") from exc
    if not outputs:
        raise UsageError("the model returned no tensors")
    return {k: v.clone() for k, v in outputs.items()}


def _verification_inputs(loaded: LoadedModel, example: Inputs, dynamic: Sequence[DynamicAxis], checking: _Checking,
                         dtype: torch.dtype) -> list[_Draw]:
    """`checking.draws` independent random input sets at the example's shapes, and as many at a
    second shape when axes are dynamic, cast to `dtype`.

    Each draw has its own seed, so floats and token ids differ; attention masks are all ones in
    the first draw and padded in the others, the two paths models branch between; an input is a mask by its name or
    by its example's 0/1 values (`mask_like`).
    """
    specs = specs_of(example)
    shapes = [specs] + ([resized(specs, dynamic)] if dynamic else [])
    first = checking.seed if checking.seed is not None else secrets.randbits(32)  # leaves torch's global RNG alone
    masks = mask_like(example)
    draws = []
    for index, shape in enumerate(shapes):
        for draw in range(checking.draws):
            seed = first + index * checking.draws + draw
            draws.append(_Draw(_cast(make_inputs(shape, loaded.module, seed, pad_masks=draw > 0, masks=masks), dtype), index, draw, seed))
    return draws


def _cast(inputs: Inputs, dtype: torch.dtype) -> Inputs:
    """Floating inputs in `dtype`; integer and bool inputs as they are."""
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in inputs.items()}


def _shape_text(inputs: Inputs) -> str:
    return ", ".join(f"{k}={'x'.join(map(str, v.shape))}" for k, v in inputs.items())


def _at_opset(model: onnx.ModelProto, opset: int, exporter: str) -> onnx.ModelProto:
    """`model` at `opset`: the dynamo exporter writes 18 when asked for less than 17, and the
    TorchScript exporter at most 20, so their graphs go through the ONNX version converter."""
    written = default_opset(model)
    if written == opset:
        return model
    from onnx import version_converter

    try:
        converted = version_converter.convert_version(model, opset)
    except Exception as exc:  # the converter raises RuntimeError / ValueError per missing adapter
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
        raise UsageError(f"--opset {opset}: the {exporter} exporter wrote opset {written}, and the ONNX version converter cannot convert this model to {opset} ({reason})") from exc
    return converted


def _traceable(example: Inputs, dynamic: Sequence[DynamicAxis]) -> Inputs:
    """The example with dynamic axes of size 1 doubled (by repetition, so values stay valid).

    torch.export specialises size-1 dimensions to constants; tracing at 2 keeps them dynamic.
    """
    traced = dict(example)
    for d in dynamic:
        t = traced[d.name]
        if t.shape[d.axis] == 1:
            traced[d.name] = torch.cat([t, t], dim=d.axis)
    return traced


def _verify(model: onnx.ModelProto, draws: list[_Draw], references: list[dict[str, torch.Tensor]],
            same_precision: list[dict[str, torch.Tensor]], rtol: float, report: ExportReport) -> None:
    """Run every draw on ORT (deployfuse nodes on the native kernels when the custom-op library
    is built, as a user's session runs them); judge it against `references`, and show the error
    against `same_precision` (PyTorch in the export's fp16/bf16) beside it when given."""
    library = ort_backend.native_library()
    if report.verification is not None and any(n.domain == DEPLOYFUSE for n in model.graph.node):
        report.verification["deployfuse_ops"] = ort_backend.deployfuse_ops_note(library)
    try:
        session = ort_backend.session(model, custom_ops_library=library)
    except Exception as exc:
        raise AccuracyError(f"ONNX Runtime cannot load the exported model: {first_line(exc)}") from exc
    for index, (draw, reference) in enumerate(zip(draws, references)):
        outputs = ort_backend.run(session, {k: to_numpy(v) for k, v in draw.inputs.items()})
        missing = [k for k in reference if k not in outputs]
        if missing:
            raise AccuracyError(f"the ONNX model lacks outputs {', '.join(missing)}")
        results = compare_outputs(reference, outputs, rtol, same_precision[index] if same_precision else None)
        report.verify.append({"shapes": {k: list(v.shape) for k, v in draw.inputs.items()}, "draw": draw.draw, "seed": draw.seed,
                              "outputs": [r.to_dict() for r in results]})


def save_model(model: onnx.ModelProto, path: Path, external_data_threshold: int = EXTERNAL_DATA_THRESHOLD) -> int:
    """Write `model` atomically; weights go to `<name>.data` beside it above the threshold.

    Returns the bytes written. Both files are written in a temporary folder beside the
    target and renamed into place only when complete; the folder is removed on any exception,
    KeyboardInterrupt and the CLI's SIGTERM included. `path` must not be a FIFO or device.
    """
    path = check_writable_target(path)
    weights = sum(len(t.raw_data) for t in model.graph.initializer)
    external = weights > external_data_threshold
    data_name = path.name + ".data"
    with temporary_folder(path.parent, prefix=f".{path.name}.") as tmp:
        tmp_model = tmp / path.name
        if external:
            onnx.save_model(model, tmp_model, save_as_external_data=True, all_tensors_to_one_file=True, location=data_name, size_threshold=1024)
            os.replace(tmp / data_name, path.parent / data_name)
        else:
            onnx.save_model(model, tmp_model)
        size = tmp_model.stat().st_size + ((path.parent / data_name).stat().st_size if external else 0)
        os.replace(tmp_model, path)
    return size


__all__ = ["ExportResult", "TARGETS", "export", "save_model"]
