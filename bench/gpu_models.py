"""Issue 7: deployfuse against every anchor on the GPU, in one run.

For each model and dtype: PyTorch eager, torch.compile, and ONNX Runtime's CUDA EP on the
plain export, the ORT transformers optimizer's output, onnxscript's `optimize_for_ort` output
and deployfuse `--target ort-cuda` (bench/anchors.py makes them). ORT runs with IO binding on
device buffers. Every figure is the median host wall-clock per iteration after a device
synchronise (what a caller waits for), >= 10 warm-up and >= 50 timed runs; outputs are checked
against eager. A failing variant records its error instead of a time.

    python bench/gpu_models.py --out bench/results/h200.json [--models bert,vit] [--dtypes fp16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kernel_profile  # noqa: E402
from anchors import build, variants  # noqa: E402

DTYPES = {"fp32": torch.float32, "fp16": torch.float16}
BATCH = {"bert": 8, "vit": 8, "gpt2": 8, "resnet50": 32}
NUMPY = {torch.float32: np.float32, torch.float16: np.float16, torch.int64: np.int64, torch.int32: np.int32, torch.bool: np.bool_}


def first_output(out: object) -> torch.Tensor:
    from deployfuse.export import flatten_outputs

    return next(iter(flatten_outputs(out).values()))


def median_ms(fn: Callable[[], object], warmup: int, runs: int) -> float:
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


# CUDA EP options tried on deployfuse's artefact, to find which ones it should carry.
LEVERS = {
    "deployfuse+nhwc": {"prefer_nhwc": "1"},
    "deployfuse+cudagraph": {"enable_cuda_graph": "1"},
    "deployfuse+nhwc+cudagraph": {"prefer_nhwc": "1", "enable_cuda_graph": "1"},
    # sdpa_kernel: ORT's attention backends as bit flags (1 flash, 2 memory-efficient); any value
    # also drops ORT's minimum sequence length (256) for memory-efficient attention in fp32.
    "deployfuse+effattn": {"sdpa_kernel": "2"},
    "deployfuse+cudagraph+effattn": {"enable_cuda_graph": "1", "sdpa_kernel": "2"},
}


def ort_cuda(path: Path, inputs: dict[str, torch.Tensor], cuda_options: dict[str, str] | None = None) -> Callable[[], torch.Tensor]:
    """An ORT CUDA session bound once to the device inputs and preallocated device outputs.

    The session applies the CUDA options stored in the artefact (deployfuse writes them).
    """
    from deployfuse.backends.ort import run, session

    providers = ("CUDAExecutionProvider", "CPUExecutionProvider")
    sess = session(path, providers=providers, cuda_options=cuda_options)
    wanted = {i.name for i in sess.get_inputs()}
    bound = {k: v.contiguous() for k, v in inputs.items() if k in wanted}
    # Output shapes from a separate session: a CUDA-graph session must only ever see the bound buffers.
    first = run(session(path, providers=providers), {k: v.cpu().numpy() for k, v in bound.items()})
    outputs = [torch.from_numpy(first[o.name]).cuda() for o in sess.get_outputs()]
    binding = sess.io_binding()
    for name, t in bound.items():
        binding.bind_input(name, "cuda", 0, NUMPY[t.dtype], tuple(t.shape), t.data_ptr())
    for meta, t in zip(sess.get_outputs(), outputs):
        binding.bind_output(meta.name, "cuda", 0, NUMPY[t.dtype], tuple(t.shape), t.data_ptr())

    def call() -> torch.Tensor:
        sess.run_with_iobinding(binding)
        return outputs[0]

    return call


def bench(name: str, dtype_name: str, warmup: int, runs: int, workdir: Path, profiled: frozenset[str] = frozenset()) -> tuple[list[dict], list[dict]]:
    """Timed rows for every variant, and kernel profiles (bench/kernel_profile.py) of those in `profiled`."""
    module, inputs = build(name, BATCH[name])
    dtype = DTYPES[dtype_name]
    module = module.to("cuda", dtype)
    inputs = {k: (v.to(dtype) if v.is_floating_point() else v).cuda() for k, v in inputs.items()}
    with torch.inference_mode():
        reference = first_output(module(**inputs)).float()
    rows: list[dict] = []
    profiles: list[dict] = []

    def record(variant: str, make: Callable[[], Callable[[], torch.Tensor]] | str) -> None:
        row: dict[str, object] = {"model": name, "dtype": dtype_name, "variant": variant}
        try:
            if isinstance(make, str):
                raise RuntimeError(make)
            fn = make()
            with torch.inference_mode():
                row["max_abs_err"] = float((fn().float() - reference).abs().max())
                row["median_ms"] = round(median_ms(fn, warmup, runs), 4)
                if variant in profiled:
                    profiles.append({"model": name, "dtype": dtype_name, "variant": variant, "median_ms": row["median_ms"], **kernel_profile.profile(fn)})
        except Exception as exc:  # a failing variant gets its error, not a time
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        print(json.dumps(row), flush=True)
        rows.append(row)

    record("eager", lambda: lambda: first_output(module(**inputs)))
    compiled = torch.compile(module)
    record("compile", lambda: lambda: first_output(compiled(**inputs)))
    files = variants(name, module, inputs, workdir, "ort-cuda", dtype_name)
    for variant in ("ort-plain", "ort-opt", "onnxscript", "deployfuse"):
        made = files[variant]
        record(variant, made if isinstance(made, str) else (lambda p=made: ort_cuda(p, inputs)))
    for lever, options in LEVERS.items():
        made = files["deployfuse"]
        record(lever, made if isinstance(made, str) else (lambda p=made, o=options: ort_cuda(p, inputs, o)))
    return rows, profiles


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="bert,vit,gpt2,resnet50")
    parser.add_argument("--dtypes", default="fp16,fp32")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--out", default="bench/results/h200.json")
    parser.add_argument("--profile", default="", help="variants to profile by kernel class, e.g. compile,onnxscript,deployfuse+cudagraph; written to OUT with .profile.json")
    args = parser.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    profiles: list[dict] = []
    profiled = frozenset(filter(None, args.profile.split(",")))
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            for dtype_name in args.dtypes.split(","):
                timed, profiled_rows = bench(name, dtype_name, args.warmup, args.runs, Path(tmp), profiled)
                rows += timed
                profiles += profiled_rows
                out.write_text(json.dumps(rows, indent=1))
                if profiled:
                    out.with_suffix(".profile.json").write_text(json.dumps(profiles, indent=1))


if __name__ == "__main__":
    main()
