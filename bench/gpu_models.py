"""deployfuse against every alternative at its best settings, on a GPU (issue 13).

A row is (model, dtype, batch). Every lever deployfuse's artefact gets is also given to every
alternative that can take it:

- PyTorch: eager and torch.compile in modes `default`, `reduce-overhead` (CUDA graphs) and
  `max-autotune`; channels_last (NHWC) for convolutional nets; in fp32 also eager with TF32
  allowed, and torch.compile only with TF32 allowed (ORT's CUDA EP runs fp32 in TF32 by
  default, so a strict-fp32 compile could not be the fastest alternative).
- ONNX Runtime CUDA EP with IO binding on device buffers, for the plain dynamo export, the ORT
  transformers optimizer's output, onnxscript's `optimize_for_ort` output and deployfuse's
  `--target ort-cuda` artefact, each also with `enable_cuda_graph=1`; every ORT variant gets
  the options deployfuse's artefact carries for that model (`prefer_nhwc=1` for convolutional
  nets, `sdpa_kernel=2` for fp32 transformers).

Each variant records the median host wall-clock per call after a device synchronise (what a
caller waits for; `median_ms`), the CUPTI kernel-time sum per call (`gpu_ms`, bench/kernel_profile.py;
kernel work without launch gaps) and `max_abs_err` against eager. A failing variant records
`error`, one not run records `skipped` with the reason.

The ONNX files and torch.compile caches are made first by parallel worker processes (CPU-bound
exports), then every row is timed alone in this process (--overlap-prepare times rows while
later ones are prepared: faster, noisier). Results are merged into
WORKDIR/h200.json after every variant (a re-run skips finished rows) and copied to --out.

    python bench/gpu_models.py --batches all --prepare-jobs 6 --out $OUT
    python bench/gpu_models.py --dry-run --batches all      # what would run, no GPU needed
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

MODELS = ("bert", "vit", "gpt2", "resnet50")
DTYPES = ("fp16", "fp32")
# The first batch of each model is its headline row (the README's table before issue 13).
BATCHES = {"bert": (8, 1, 64), "vit": (8, 1, 64), "gpt2": (8, 1, 64), "resnet50": (32, 1, 128)}
CONVOLUTIONAL = {"resnet50"}
ATTENTION = {"bert", "vit", "gpt2"}
COMPILE_MODES = {"compile": "default", "compile-reduce-overhead": "reduce-overhead", "compile-max-autotune": "max-autotune"}
ONNX_FILES = ("ort-plain", "ort-opt", "onnxscript", "deployfuse")
MAX_AUTOTUNE_SKIPPED = "not run: max-autotune compiles take minutes a row, more than the session's device time allowed"


def key(model: str, dtype: str, batch: int) -> str:
    return f"{model}-{dtype}-b{batch}"


def plan(models: list[str], dtypes: list[str], batches: str) -> list[tuple[str, str, int]]:
    """Rows in the order they run: headline batches of every model and dtype first."""
    wanted = {"headline": lambda m: BATCHES[m][:1], "rest": lambda m: BATCHES[m][1:], "all": lambda m: BATCHES[m]}
    if batches in wanted:
        per_model = wanted[batches]
    else:
        sizes = {int(b) for b in batches.split(",")}
        per_model = lambda m: tuple(b for b in BATCHES[m] if b in sizes)  # noqa: E731
    rows = [(m, d, b) for m in models for d in dtypes for b in per_model(m)]
    return sorted(rows, key=lambda r: (r[2] != BATCHES[r[0]][0], BATCHES[r[0]].index(r[2]), r[1], models.index(r[0])))


def variant_names(model: str, dtype: str, max_autotune: bool) -> list[str]:
    tf32 = "+tf32" if dtype == "fp32" else ""
    torch_side = ["eager"] + (["eager+tf32"] if dtype == "fp32" else [])
    torch_side += [name + tf32 for name in COMPILE_MODES if max_autotune or name != "compile-max-autotune"]
    return torch_side + [f"{f}{graph}" for f in ONNX_FILES for graph in ("", "+cudagraph")]


def ort_options(model: str, dtype: str) -> dict[str, str]:
    """The CUDA EP options deployfuse's artefact carries for this model (pipeline.cuda_provider_options),
    given to every ONNX variant."""
    options = {"prefer_nhwc": "1"} if model in CONVOLUTIONAL else {}
    if dtype == "fp32" and model in ATTENTION:
        options["sdpa_kernel"] = "2"
    return options


# ---------------------------------------------------------------------------------------------
# Preparation: ONNX files and warm torch.compile caches, one worker process per row.


def set_tf32(enabled: bool) -> None:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


def prepare_one(row: str, workdir: Path, compile_modes: list[str]) -> None:
    """Write the row's ONNX variants and index.json (variant -> path or error); warm compile caches."""
    import torch
    from anchors import build, variants

    model_name, dtype, batch = row.rsplit("-", 2)
    model, inputs = on_device(*build(model_name, int(batch[1:])), dtype, model_name)
    folder = workdir / row
    folder.mkdir(parents=True, exist_ok=True)
    start = time.time()
    with torch.inference_mode():
        files = variants(model_name, model, inputs, folder, "ort-cuda", dtype)
    index = {k: str(v) for k, v in files.items()}
    print(f"{row}: onnx files in {time.time() - start:.0f} s", flush=True)
    # torch.compile fills the on-disk inductor caches; the timing process then compiles warm.
    set_tf32(dtype == "fp32")
    torch.backends.cudnn.benchmark = True
    if model_name in CONVOLUTIONAL:
        model = model.to(memory_format=torch.channels_last)
        inputs = {k: v.contiguous(memory_format=torch.channels_last) for k, v in inputs.items()}
    for mode in compile_modes:
        start = time.time()
        try:
            torch._dynamo.reset()
            compiled = torch.compile(model, mode=mode)
            with torch.inference_mode():
                for _ in range(3):
                    compiled(**inputs)
            torch.cuda.synchronize()
            print(f"{row}: compile {mode} warm in {time.time() - start:.0f} s", flush=True)
        except Exception as exc:  # the timing process records the error
            print(f"{row}: compile {mode} failed: {short_error(exc)}", flush=True)
    (folder / "index.json").write_text(json.dumps(index, indent=1))


class Preparer(threading.Thread):
    """Runs prepare_one for every row without an index.json, in plan order, `jobs` processes at a
    time (with --overlap-prepare, while this process times the rows already prepared). The workers
    run at the lowest priority on the cores the timing process leaves them (it keeps `TIMING_CORES`)."""

    def __init__(self, rows: list[tuple[str, str, int]], workdir: Path, jobs: int, compile_modes: Callable[[str, int], list[str]]):
        super().__init__(daemon=True)
        self.todo = [r for r in rows if not (workdir / key(*r) / "index.json").exists()]
        self.finished: set[str] = set()
        self.workdir, self.jobs, self.compile_modes = workdir, jobs, compile_modes

    def run(self) -> None:
        running: list[tuple[str, subprocess.Popen, Path]] = []
        start = time.time()
        cores = set(range(os.cpu_count() or 1)) - TIMING_CORES or None
        while self.todo or running:
            while self.todo and len(running) < self.jobs:
                model, dtype, batch = self.todo.pop(0)
                row = key(model, dtype, batch)
                log = self.workdir / f"prepare_{row}.log"
                log.parent.mkdir(parents=True, exist_ok=True)
                cmd = [sys.executable, __file__, "--prepare-one", row, "--workdir", str(self.workdir), "--compile-modes", ",".join(self.compile_modes(model, batch))]
                running.append((row, subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, preexec_fn=lambda: _background(cores)), log))
            for item in list(running):
                row, proc, log = item
                if proc.poll() is not None:
                    running.remove(item)
                    self.finished.add(row)
                    tail = log.read_text().strip().splitlines()[-1:] or [""]
                    print(f"prepared {row} (rc {proc.returncode}, {time.time() - start:.0f} s): {tail[0][:200]}", flush=True)
            time.sleep(1)

    def wait(self, row: str) -> None:
        while row not in self.finished and not (self.workdir / row / "index.json").exists():
            time.sleep(1)


TIMING_CORES = {0, 1, 2, 3}


def _background(cores: set[int] | None) -> None:
    os.nice(19)
    if cores:
        os.sched_setaffinity(0, cores)


# ---------------------------------------------------------------------------------------------
# Timing.


def short_error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def on_device(model, inputs, dtype: str, model_name: str):
    import torch

    torch_dtype = {"fp32": torch.float32, "fp16": torch.float16}[dtype]
    return model.to("cuda", torch_dtype), {k: (v.to(torch_dtype) if v.is_floating_point() else v).cuda() for k, v in inputs.items()}


def first_output(out: object):
    from deployfuse.export import flatten_outputs

    return next(iter(flatten_outputs(out).values()))


def median_ms(fn: Callable[[], object], warmup: int, runs: int) -> float:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def interleaved_medians(fns: dict[str, Callable[[], object]], rounds: int, calls: int, warmup: int,
                        sync: Callable[[], None] | None = None) -> dict[str, float]:
    """Median ms a call of each of `fns`, timed together: `warmup` calls each, then `rounds` rounds in which every fn makes
    one untimed call (what switching from the last fn costs: caches, another runtime's threads still spinning) and `calls`
    timed ones, round r beginning at the r-th fn (no fn always follows the same one); each call closed by `sync` (None:
    torch.cuda.synchronize). Rows timed one after another drift apart: the same fp8 artefact took 0.589 ms a call, then 0.567
    later in the lease (bench/results/h200_quant.md section 12); interleaved, every row sees the same machine."""
    if sync is None:
        import torch

        sync = torch.cuda.synchronize
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    sync()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            fn = fns[name]
            fn()
            sync()
            for _ in range(calls):
                start = time.perf_counter()
                fn()
                sync()
                times[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def deployfuse_library(path: str | os.PathLike[str], library: str | os.PathLike[str] | None, cuda: bool = True) -> str | None:
    """The custom-op library to time deployfuse's artefact at `path` with, so its nodes (GemmAct)
    run on their native kernels as a user's session runs them.

    As ONNX function bodies ORT ran each GemmAct of GPT-2 as a Gemm plus the tanh-GELU written out
    (9 elementwise kernels a layer): fp16 batch 8 at 1.51 ms on the H200, where the artefact of the
    zero-bias GPT-2 (no GemmAct) ran 0.80 ms; not yet re-timed with the library.
    Raises on CUDA when the artefact has deployfuse nodes and `library` is None (not built)."""
    import onnx

    from deployfuse.runtime import uses_deployfuse_ops

    if library is None and cuda and uses_deployfuse_ops(onnx.load(str(path), load_external_data=False)):
        raise RuntimeError(f"no libdeployfuse_ort.so for the deployfuse nodes of {Path(path).name}: deployfuse plugins build --cuda on")
    return None if library is None else str(library)


def ort_cuda(path: str, inputs: dict, cuda_options: dict[str, str], custom_ops_library: str | None = None) -> Callable[[], object]:
    """An ORT CUDA session bound once to the device inputs and preallocated device outputs.

    deployfuse.backends.ort.session adds the CUDA options an artefact carries; `cuda_options`
    go on top. A CUDA-graph session only ever sees the bound buffers. `custom_ops_library`
    runs deployfuse nodes on its native kernels (None: their ONNX function bodies).
    """
    import numpy as np
    import torch

    from deployfuse.backends.ort import run, session

    numpy = {torch.float32: np.float32, torch.float16: np.float16, torch.int64: np.int64, torch.int32: np.int32, torch.bool: np.bool_}
    providers = ("CUDAExecutionProvider", "CPUExecutionProvider")
    sess = session(path, providers=providers, cuda_options=cuda_options, custom_ops_library=custom_ops_library)
    wanted = {i.name for i in sess.get_inputs()}
    bound = {k: v.contiguous() for k, v in inputs.items() if k in wanted}
    metas = sess.get_outputs()
    if all(isinstance(d, int) for m in metas for d in m.shape):
        elem = {"tensor(float)": torch.float32, "tensor(float16)": torch.float16, "tensor(int64)": torch.int64}
        outputs = [torch.empty(tuple(m.shape), dtype=elem[m.type], device="cuda") for m in metas]
    else:  # shapes from a plain session's first run
        first = run(session(path, providers=providers, custom_ops_library=custom_ops_library), {k: v.cpu().numpy() for k, v in bound.items()})
        outputs = [torch.from_numpy(first[m.name]).cuda() for m in metas]
    binding = sess.io_binding()
    for name, t in bound.items():
        binding.bind_input(name, "cuda", 0, numpy[t.dtype], tuple(t.shape), t.data_ptr())
    for meta, t in zip(metas, outputs):
        binding.bind_output(meta.name, "cuda", 0, numpy[t.dtype], tuple(t.shape), t.data_ptr())

    def call():
        sess.run_with_iobinding(binding)
        return outputs[0]

    call.session = sess  # keeps the session alive as long as the callable
    return call


class Results:
    """Rows merged by (model, dtype, batch, variant) into WORKDIR/h200.json, copied to `out` on every write."""

    def __init__(self, workdir: Path, out: Path | None):
        self.path, self.out = workdir / "h200.json", out
        self.rows = {self._key(r): r for r in (json.loads(self.path.read_text()) if self.path.exists() else [])}
        self.profiles: dict[tuple, dict] = {}
        profile_path = self.path.with_suffix(".profile.json")
        if profile_path.exists():
            self.profiles = {self._key(p): p for p in json.loads(profile_path.read_text())}

    @staticmethod
    def _key(r: dict) -> tuple:
        return (r["model"], r["dtype"], r["batch"], r["variant"])

    def done(self, model: str, dtype: str, batch: int, names: list[str]) -> bool:
        return all((model, dtype, batch, v) in self.rows for v in names)

    def add(self, row: dict, profile: dict | None) -> None:
        self.rows[self._key(row)] = row
        if profile:
            self.profiles[self._key(row)] = profile
        self.path.write_text(json.dumps(list(self.rows.values()), indent=1))
        self.path.with_suffix(".profile.json").write_text(json.dumps(list(self.profiles.values()), indent=1))
        if self.out:
            self.out.mkdir(parents=True, exist_ok=True)
            for p in (self.path, self.path.with_suffix(".profile.json")):
                shutil.copy(p, self.out / p.name)


def bench_row(model_name: str, dtype: str, batch: int, workdir: Path, results: Results, args: argparse.Namespace) -> None:
    import kernel_profile
    import torch
    from anchors import build

    max_autotune = wants_max_autotune(args, model_name, batch)
    names = variant_names(model_name, dtype, max_autotune)
    if results.done(model_name, dtype, batch, names):
        print(f"{key(model_name, dtype, batch)}: already measured", flush=True)
        return
    set_tf32(False)
    torch.backends.cudnn.allow_tf32 = True  # PyTorch's default: convolutions in TF32, matmuls in fp32
    torch.backends.cudnn.benchmark = True  # static shapes: cuDNN picks by measurement, as ORT's CUDA EP does
    module, inputs = on_device(*build(model_name, batch), dtype, model_name)
    with torch.inference_mode():
        reference = first_output(module(**inputs)).float()
    index_path = workdir / key(model_name, dtype, batch) / "index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {}
    cl_module, cl_inputs = module, inputs
    if model_name in CONVOLUTIONAL:
        cl_module = module.to(memory_format=torch.channels_last)
        cl_inputs = {k: v.contiguous(memory_format=torch.channels_last) for k, v in inputs.items()}

    def record(variant: str, settings: str, make: Callable[[], Callable[[], object]], tf32: bool | None = None) -> None:
        row: dict[str, object] = {"model": model_name, "dtype": dtype, "batch": batch, "variant": variant, "settings": settings}
        profile = None
        start = time.time()
        try:
            if tf32 is not None:
                set_tf32(tf32)
            fn = make()
            with torch.inference_mode():
                row["max_abs_err"] = float((fn().float() - reference).abs().max())
                row["median_ms"] = round(median_ms(fn, args.warmup, args.runs), 4)
                if args.gpu_time:
                    profile = kernel_profile.profile(fn, iters=args.profile_iters)
                    row["gpu_ms"] = profile["gpu_ms"]
                    profile = {k: row[k] for k in ("model", "dtype", "batch", "variant", "median_ms")} | profile
        except Exception as exc:  # a failing variant gets its error, not a time
            row["error"] = short_error(exc)
        row["setup_s"] = round(time.time() - start, 1)
        print(json.dumps(row), flush=True)
        results.add(row, profile)

    layout = "channels_last" if model_name in CONVOLUTIONAL else "contiguous"
    record("eager", f"{layout}, PyTorch default precision", lambda m=cl_module: lambda: first_output(m(**cl_inputs)), tf32=False if dtype == "fp32" else None)
    if dtype == "fp32":
        record("eager+tf32", f"{layout}, TF32 matmuls and convolutions", lambda m=cl_module: lambda: first_output(m(**cl_inputs)), tf32=True)
    tf32 = "+tf32" if dtype == "fp32" else ""
    for variant, mode in COMPILE_MODES.items():
        if variant + tf32 not in names:
            continue
        torch._dynamo.reset()
        compiled = torch.compile(cl_module, mode=mode)
        record(variant + tf32, f"{layout}, mode={mode}" + (", TF32" if tf32 else ""), lambda c=compiled: (lambda: first_output(c(**cl_inputs))), tf32=dtype == "fp32")
        del compiled
    torch._dynamo.reset()
    set_tf32(False)
    gc.collect()
    base = ort_options(model_name, dtype)
    for onnx_file in ONNX_FILES:
        made = index.get(onnx_file, f"not prepared: see {workdir}/prepare_{key(model_name, dtype, batch)}.log")
        for graph in ("", "+cudagraph"):
            options = base | ({"enable_cuda_graph": "1"} if graph else {})
            if onnx_file == "deployfuse":
                options = {"enable_cuda_graph": "1"} if graph else {}  # the artefact carries the rest
            settings = "IO binding, " + (", ".join(f"{k}={v}" for k, v in options.items()) or "no extra options") + (" + the artefact's own" if onnx_file == "deployfuse" else "")

            def make(made=made, options=options, onnx_file=onnx_file):
                if not Path(made).is_file():
                    raise RuntimeError(made)
                if onnx_file != "deployfuse":
                    return ort_cuda(made, inputs, options)
                from deployfuse.backends.ort import native_library

                return ort_cuda(made, inputs, options, deployfuse_library(made, native_library()))

            record(onnx_file + graph, settings, make)
            gc.collect()
    if not max_autotune:
        results.add({"model": model_name, "dtype": dtype, "batch": batch, "variant": "compile-max-autotune" + tf32, "skipped": MAX_AUTOTUNE_SKIPPED}, None)
    del module, cl_module
    gc.collect()
    torch.cuda.empty_cache()


def wants_max_autotune(args: argparse.Namespace, model: str, batch: int) -> bool:
    return args.max_autotune == "all" or f"{model}:{batch}" in args.max_autotune.split(",")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--batches", default="headline", help="headline (8; 32 for ResNet-50), rest, all, or sizes like 1,64,128")
    parser.add_argument("--max-autotune", default="none", help="rows that also run torch.compile max-autotune: none, all, or MODEL:BATCH,... (minutes each)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--no-gpu-time", dest="gpu_time", action="store_false", help="skip the CUPTI kernel-time sum")
    parser.add_argument("--profile-iters", type=int, default=10)
    parser.add_argument("--prepare-jobs", type=int, default=4, help="worker processes that export and warm compile caches")
    parser.add_argument("--overlap-prepare", action="store_true", help="time prepared rows while later rows are still prepared "
                        "(faster; the workers' CPU and GPU work then slows the timed variants: up to 15 %% seen on CUDA-graph rows)")
    parser.add_argument("--workdir", default="/tmp/deployfuse_bench", help="ONNX files, compile caches' logs and the merged results")
    parser.add_argument("--out", default=None, help="folder to copy h200.json and h200.profile.json to after every variant")
    parser.add_argument("--dry-run", action="store_true", help="print the rows and variants that would run, and exit")
    parser.add_argument("--prepare-one", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--compile-modes", default="default,reduce-overhead", help=argparse.SUPPRESS)
    args = parser.parse_args()
    models, dtypes = args.models.split(","), args.dtypes.split(",")
    bad = [m for m in models if m not in MODELS] + [d for d in dtypes if d not in DTYPES]
    if bad:
        parser.exit(2, f"gpu_models.py: unknown model or dtype {', '.join(bad)} (models: {', '.join(MODELS)}; dtypes: {', '.join(DTYPES)})\n")
    workdir = Path(args.workdir)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(workdir / "inductor"))
    if args.prepare_one:
        prepare_one(args.prepare_one, workdir, [m for m in args.compile_modes.split(",") if m])
        return
    rows = plan(models, dtypes, args.batches)
    if args.dry_run:
        for row in rows:
            print(f"{key(*row)}: {' '.join(variant_names(row[0], row[1], wants_max_autotune(args, row[0], row[2])))}")
        return
    results = Results(workdir, Path(args.out) if args.out else None)
    modes = lambda model, batch: args.compile_modes.split(",") + (["max-autotune"] if wants_max_autotune(args, model, batch) else [])  # noqa: E731
    preparer = Preparer(rows, workdir, args.prepare_jobs, modes)
    preparer.start()
    if not args.overlap_prepare:
        preparer.join()
    if len(TIMING_CORES) < (os.cpu_count() or 1):
        os.sched_setaffinity(0, TIMING_CORES)
    for row in rows:
        preparer.wait(key(*row))
        t = time.time()
        try:
            bench_row(*row, workdir, results, args)
        except Exception as exc:  # one broken row must not cost the others
            print(f"{key(*row)}: failed: {short_error(exc)}", flush=True)
        print(f"{key(*row)}: timed in {time.time() - t:.0f} s", flush=True)


if __name__ == "__main__":
    main()
