"""`compare`: run one set of inputs through PyTorch, ONNX Runtime and TensorRT with Polygraphy's
`Comparator`, judge every backend against the first, time each, and localise a failure."""

from __future__ import annotations

import contextlib
import copy
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from deployfuse import metadata
from deployfuse.compare import feeds as feed_lib
from deployfuse.compare.accuracy import OutputStats, StatsCompareFunc
from deployfuse.compare.latency import measure
from deployfuse.compare.localize import Localization, fused_nodes, localize
from deployfuse.compare.result import BackendAccuracy, CompareResult
from deployfuse.compare.tolerances import Tolerances
from deployfuse.errors import UsageError
from deployfuse.inputs import DynamicAxis, InputSpec, as_specs
from deployfuse.io import check_outputs, default_opset, load_onnx
from deployfuse.loading import LoadedModel, load_model
from deployfuse.quantize.gate import Budget, recorded_budget

BACKENDS = ("torch", "ort-cpu", "ort-cuda", "trt")
DEFAULT_BACKENDS = ("torch", "ort-cpu")
TF32_NOTE = ("fp32 MatMul/Conv ran in TF32, ONNX Runtime CUDA's default, so fp32 outputs get the TF32 tolerances; "
             "export with --no-tf32 for full fp32")
Progress = Callable[[str], None]


@contextlib.contextmanager
def _quiet_polygraphy(verbose: bool) -> Iterator[None]:
    """Polygraphy logs every inference at INFO; our table says it once."""
    from polygraphy.logger import G_LOGGER

    old = G_LOGGER.module_severity
    if not verbose:
        G_LOGGER.module_severity = G_LOGGER.CRITICAL
    try:
        yield
    finally:
        G_LOGGER.module_severity = old


def _check_backends(backends: Sequence[str]) -> list[str]:
    chosen = list(dict.fromkeys(b.strip() for b in backends if b.strip()))
    unknown = [b for b in chosen if b not in BACKENDS]
    if unknown:
        raise UsageError(f"unknown backend {unknown[0]!r}; choose from {', '.join(BACKENDS)}")
    if len(chosen) < 2:
        raise UsageError(f"--backends needs at least two backends to compare (got {', '.join(chosen) or 'none'})")
    return chosen


def _output_dtypes(model: onnx.ModelProto) -> dict[str, str]:
    names = {onnx.TensorProto.BFLOAT16: "bfloat16"}
    return {o.name: names.get(o.type.tensor_type.elem_type) or str(onnx.helper.tensor_dtype_to_np_dtype(o.type.tensor_type.elem_type)) for o in model.graph.output}


def _runners(backends: Sequence[str], loaded: LoadedModel, onnx_path: Path, feed: Mapping[str, np.ndarray], engine: Path | None,
             custom_ops: str | os.PathLike[str] | None, plugins: Sequence[str | os.PathLike[str]], torch_device: str) -> list[Any]:
    from polygraphy.common import TensorMetadata

    from deployfuse.backends.trt import TrtRunner
    from deployfuse.compare.ort_runner import OrtRunner
    from deployfuse.compare.torch_runner import TorchRunner

    made = []
    for backend in backends:
        if backend == "torch":
            meta = TensorMetadata()
            for name, value in feed.items():
                meta.add(name, value.dtype, tuple(None for _ in value.shape))
            made.append(TorchRunner(loaded, meta, torch_device))
        elif backend == "trt":
            made.append(TrtRunner(engine, plugins))  # type: ignore[arg-type]
        else:
            made.append(OrtRunner(onnx_path, backend, custom_ops))
    return made


def _engine_for(onnx_path: Path, engine: str | os.PathLike[str] | None, plugins: Sequence[str | os.PathLike[str]], workdir: Path, say: Progress) -> Path:
    if engine is not None:
        if not Path(engine).is_file():
            raise UsageError(f"--engine {engine}: no such file")
        return Path(engine)
    from deployfuse.engine import build_engine

    say("building a TensorRT engine (no --engine given)")
    return build_engine(onnx_path, workdir / "model.plan", plugins=plugins).engine


def _derive_reference(model: Any, onnx_model: onnx.ModelProto, feed: Mapping[str, np.ndarray], dynamic: Sequence[DynamicAxis],
                      trust_pickle: bool, task: str | None, workdir: Path) -> Path:
    """Export MODEL again without fusions, as `deployfuse export --no-fuse --no-verify` would,
    with the ONNX file's symbolic axes when no --dynamic is given: the same export then names
    its tensors the same, which localisation pairs them by."""
    from deployfuse.pipeline import export

    dynamic = dynamic or [DynamicAxis(name, axis, label) for name, (_, dims) in feed_lib.graph_inputs(onnx_model).items() if name in feed
                          for axis, label in enumerate(dims) if isinstance(label, str) and label != "?"]
    opset = default_opset(onnx_model)
    floats = [v.dtype for v in feed.values() if np.issubdtype(v.dtype, np.floating)]
    precision = "fp16" if floats and floats[0] == np.float16 else "fp32"
    source = copy.deepcopy(model) if isinstance(model, torch.nn.Module) else model  # folding changes a module in place
    example = {k: torch.from_numpy(v.astype(np.float32) if v.dtype == np.float16 else v) for k, v in feed.items()}
    path = workdir / "unfused.onnx"
    export(source, path, example_inputs=example, dynamic=dynamic, precision=precision, opset=opset, fuse=False, verify=False, trust_pickle=trust_pickle,
           task=task)
    return path


def compare(
    model: str | os.PathLike[str] | torch.nn.Module,
    onnx_path: str | os.PathLike[str],
    *,
    backends: Sequence[str] = DEFAULT_BACKENDS,
    inputs: Sequence[InputSpec | str] = (),
    example_inputs: Any = None,
    dynamic: Sequence[DynamicAxis | str] = (),
    trust_pickle: bool = False,
    task: str | None = None,
    atol: float | Mapping[str, float] | Tolerances | None = None,
    rtol: float | Mapping[str, float] | None = None,
    iterations: int = 20,
    warmup: int = 3,
    engine: str | os.PathLike[str] | None = None,
    custom_ops: str | os.PathLike[str] | None = None,
    plugins: Sequence[str | os.PathLike[str]] = (),
    reference_onnx: str | os.PathLike[str] | None = None,
    localize_failures: bool = True,
    torch_device: str = "cpu",
    seed: int | None = None,
    json_path: str | os.PathLike[str] | None = None,
    report_path: str | os.PathLike[str] | None = None,
    save_results: str | os.PathLike[str] | None = None,
    verbose: bool = False,
    progress: Progress | None = None,
) -> CompareResult:
    """Compare `onnx_path` (and an engine) with `model` on the same random inputs.

    Args:
        model: a model file, `package.module:callable` or an `nn.Module` (the PyTorch side).
        onnx_path: the ONNX artefact.
        backends: among "torch", "ort-cpu", "ort-cuda", "trt"; the first is the reference.
        inputs, example_inputs, dynamic, trust_pickle: as for `deployfuse.export`.
        task: for a Hugging Face folder, the task to load it for; default: the task the export
            recorded in the ONNX file (metadata `deployfuse.task`), else the saved architecture's.
        atol, rtol: one value for every output, a mapping output -> value ("" = the rest), or a
            `Tolerances` as `atol` (then `rtol` is ignored); unset ones default by output dtype.
        iterations, warmup: timed and untimed runs per backend; 0 iterations skips latency.
        engine: a TensorRT engine for "trt"; built from `onnx_path` when None.
        custom_ops: the deployfuse ONNX Runtime custom-op library to register.
        plugins: TensorRT plugin libraries.
        reference_onnx: the unfused export, for localising a failure; derived when None.
        localize_failures: on failure, find the first fused node that diverges.
        torch_device: "cpu" or "cuda" for the PyTorch runner.
        seed: random seed for the inputs.
        json_path, report_path, save_results: write the JSON, the HTML report, Polygraphy RunResults.
        verbose: let Polygraphy log.
        progress: called with a line per stage.

    Returns:
        The result; `result.passed` is False on an accuracy failure (nothing is raised for it).

    Raises:
        UsageError: bad arguments, files or inputs.
    """
    say = progress or (lambda line: None)
    inputs, dynamic = as_specs(inputs, InputSpec, "inputs"), as_specs(dynamic, DynamicAxis, "dynamic")
    chosen = _check_backends(backends)
    tolerances = atol if isinstance(atol, Tolerances) else Tolerances.of(atol, rtol)
    results_inputs = _inputs_beside(Path(save_results)) if save_results is not None else None
    checked = check_outputs(
        {"--json": json_path, "--report": report_path, "--save-results": save_results, "--save-results (its inputs file)": results_inputs},
        {"MODEL": None if isinstance(model, torch.nn.Module) else model, "ONNX": onnx_path, "--reference-onnx": reference_onnx, "--engine": engine,
         "--example-inputs": example_inputs if isinstance(example_inputs, (str, os.PathLike)) else None, "--custom-ops": custom_ops,
         **{f"--plugins {p}": p for p in plugins}},
    )
    targets = {key: checked[flag] for key, flag in (("json", "--json"), ("report", "--report"), ("results", "--save-results")) if flag in checked}
    if report_path is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError("--report draws its plots with matplotlib: pip install matplotlib") from None
    onnx_file = Path(onnx_path)
    onnx_model = load_onnx(onnx_file)
    loaded = load_model(model, trust_pickle=trust_pickle, task=task or _recorded_task(onnx_model, model))
    if not inputs and example_inputs is None and loaded.example_inputs is None:
        inputs = _recorded_inputs(onnx_model)
    dynamic = _with_shared_axes(dynamic, onnx_model)
    feeds = feed_lib.make_feeds(loaded, onnx_model, inputs, example_inputs, dynamic, seed)
    dtypes = _output_dtypes(onnx_model)
    # A quantized artefact is judged by the accuracy budget it was exported with, unless tolerances are given.
    budget = recorded_budget(onnx_model) if not (tolerances.atol or tolerances.rtol) else None
    result = CompareResult(str(model) if not isinstance(model, torch.nn.Module) else type(model).__name__, str(onnx_file), chosen, task=loaded.task)
    result.provenance["seed"] = seed

    from polygraphy.comparator import Comparator

    with tempfile.TemporaryDirectory(prefix="deployfuse-compare-") as tmp, _quiet_polygraphy(verbose):
        workdir = Path(tmp)
        plan = _engine_for(onnx_file, engine, plugins, workdir, say) if "trt" in chosen else None
        say(f"running {', '.join(chosen)} on {len(feeds)} input set(s)")
        runners = _runners(chosen, loaded, onnx_file, feeds[0], plan, custom_ops, plugins, torch_device)
        run_results = Comparator.run(runners, data_loader=feeds)
        result.run_results = run_results
        reference_outputs = run_results[0][1][0]
        tolerances.check_names(reference_outputs.keys())
        tf32 = frozenset(r.name for r in runners if getattr(r, "tf32", False))
        compare_func = StatsCompareFunc(tolerances, dtypes, tf32)
        accuracy = Comparator.compare_accuracy(run_results, comparisons=[(0, i) for i in range(1, len(runners))], compare_func=compare_func)
        by_runner = dict(run_results)
        for (ref_name, name), per_feed in accuracy[0].items():
            note = TF32_NOTE if name in tf32 and "float32" in dtypes.values() else ""
            for index, stats in enumerate(per_feed):
                if budget is not None:
                    _judge_by_budget(stats.values(), by_runner[ref_name][index], by_runner[name][index], budget)
                    note = f"judged by the accuracy budget the quantized artefact records ({budget.text()}), not element-wise"
                shapes = {k: list(v.shape) for k, v in feeds[index].items()}
                result.accuracy.append(BackendAccuracy(name, ref_name, index, shapes, list(stats.values()), note))
        if iterations:
            for runner in runners:
                say(f"timing {runner.name}: {warmup} warm-up + {iterations} runs")
                result.latency.append(measure(runner, feeds[0], warmup, iterations))
        foreign = _other_weights(onnx_model, loaded) if not result.passed and localize_failures else None
        if foreign is not None:
            result.localization = Localization(str(reference_onnx or ""), len(fused_nodes(onnx_model)), 0).rule_out(foreign)
        elif not result.passed and localize_failures and (fused_nodes(onnx_model) or budget is not None):
            failing = next(a.feed for a in result.accuracy if not a.passed)
            if reference_onnx is not None:
                reference_file = Path(reference_onnx)
            else:
                say("exporting the unfused reference graph for localisation")
                reference_file = _derive_reference(model, onnx_model, feeds[failing], dynamic, trust_pickle, loaded.task, workdir)
            expected = run_results[chosen.index("torch")][1][failing] if "torch" in chosen else None
            say("localising: " + ("the first tensor of the quantized graph past the accuracy budget" if budget is not None
                                  else "fused-node outputs against the unfused graph"))
            result.localization = localize(onnx_model, load_onnx(reference_file), feeds[failing], budget or tolerances,
                                           str(reference_file) if reference_onnx is not None else "(derived: unfused export of MODEL)", custom_ops,
                                           expected=expected, weight_names=loaded.module.state_dict().keys())
        elif not result.passed and localize_failures:
            result.localization = Localization(str(reference_onnx or ""), 0, 0, note="the ONNX model has no fused nodes (none carries deployfuse.rule metadata)")
        _write_outputs(result, feeds, targets)
    return result


def _judge_by_budget(stats: Iterable[OutputStats], reference: Mapping[str, np.ndarray], actual: Mapping[str, np.ndarray], budget: Budget) -> None:
    """Give each float output the verdict of `budget` (cosine, max|error| / max|reference|, ...) instead of the element-wise one."""
    for s in stats:
        if s.name in actual and np.issubdtype(np.asarray(reference[s.name]).dtype, np.floating) and not s.reason:
            broken = budget.broken_by(s.name, np.asarray(reference[s.name]), np.asarray(actual[s.name]))
            s.passed, s.reason = not broken, "; ".join(broken)


def _other_weights(onnx_model: onnx.ModelProto, loaded: LoadedModel) -> str | None:
    """Why the ONNX file cannot be an export of MODEL, when the weights hash it carries says so."""
    recorded = metadata.read(onnx_model, metadata.WEIGHTS_SHA256)
    if not isinstance(recorded, str):
        return None  # exported before deployfuse recorded it, or by another tool
    ours = metadata.weights_digest(loaded.module)
    if recorded == ours:
        return None
    return (f"the ONNX file was exported from other weights than MODEL (weights SHA-256 {recorded[:12]} in the file, "
            f"{ours[:12]} for MODEL): it is not an export of this model, so no fusion is to blame")


def _recorded_task(onnx_model: onnx.ModelProto, model: str | os.PathLike[str] | torch.nn.Module) -> str | None:
    """The task a Hugging Face folder was exported for (None for other models, or an ONNX file
    that records none): the same head, inputs and outputs as the export."""
    from deployfuse.hf import is_pretrained_folder

    recorded = metadata.read(onnx_model, metadata.TASK)
    if not isinstance(recorded, str) or isinstance(model, torch.nn.Module) or not is_pretrained_folder(Path(model)):
        return None
    return recorded


def _with_shared_axes(dynamic: Sequence[DynamicAxis], model: onnx.ModelProto) -> list[DynamicAxis]:
    """`dynamic` plus the graph-input axes that carry the same symbolic dimension as one of them
    (attention_mask's `seq` beside input_ids'), so the second feed resizes them together."""
    dims = {name: shape for name, (_, shape) in feed_lib.graph_inputs(model).items()}
    symbols: dict[str, str] = {}
    for d in dynamic:
        shape = dims.get(d.name, ())
        symbol = shape[d.axis] if -len(shape) <= d.axis < len(shape) else None
        if isinstance(symbol, str) and symbol != "?":
            symbols.setdefault(symbol, d.label)
    given = {(d.name, d.axis % len(dims[d.name]) if dims.get(d.name) else d.axis) for d in dynamic}
    shared = [DynamicAxis(name, axis, symbols[symbol]) for name, shape in dims.items() for axis, symbol in enumerate(shape)
              if symbol in symbols and (name, axis) not in given]
    return [*dynamic, *shared]


def _inputs_beside(results: Path) -> Path:
    """Where --save-results puts the inputs: NAME.inputs.json beside NAME.json."""
    return results.with_name(results.stem + ".inputs.json")


def _recorded_inputs(model: onnx.ModelProto) -> list[InputSpec]:
    """Specs for the shapes the export recorded (metadata INPUT_SHAPES), in the graph's dtypes
    (float32 for an input the graph dropped); empty when nothing was recorded."""
    recorded = metadata.read(model, metadata.INPUT_SHAPES)
    if not isinstance(recorded, dict):
        return []
    dtypes = {name: dtype for name, (dtype, _) in feed_lib.graph_inputs(model).items()}
    return [InputSpec(name, tuple(int(d) for d in shape), torch.from_numpy(np.zeros((), dtypes.get(name, np.float32))).dtype) for name, shape in recorded.items()]


def _write_outputs(result: CompareResult, feeds: list[feed_lib.Feed], targets: Mapping[str, Path]) -> None:
    import json

    from deployfuse.io import atomic_path, write_text_atomic

    if "results" in targets:
        from polygraphy.json import save_json

        # The inputs go beside the outputs: `polygraphy run M.onnx --onnxrt --load-inputs I --load-outputs R`.
        inputs = _inputs_beside(targets["results"])
        with atomic_path(inputs) as tmp:
            save_json(feeds, str(tmp))
        with atomic_path(targets["results"]) as tmp:
            result.run_results.save(str(tmp))
        result.files.update(results=str(targets["results"]), inputs=str(inputs))
    if "report" in targets:
        from deployfuse.compare.report import html_report

        write_text_atomic(targets["report"], html_report(result))
        result.files["report"] = str(targets["report"])
    if "json" in targets:
        result.files["json"] = str(targets["json"])
        write_text_atomic(targets["json"], json.dumps(result.to_dict(), indent=2))
