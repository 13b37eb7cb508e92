"""Which cuBLASLt candidates of the fp8 artefacts' GEMMs issue a memset, and what each costs inside a CUDA graph (H200).

At batch 64 every fp8 model ran 24 `Memset (Device)` a call (bench/results/h200_quant.md section 6): 0.02 ms of memsets plus
~0.035 ms of idle time before them and ~2.8 us before each GEMM that follows one, from the algorithms cuBLASLt picks at that
size. For each problem (Fp8GemmAct and Fp8Mlp at BERT / GPT-2's 8192 and ViT's 12608 tokens, X in float8 as SkipLayerNormFp8
feeds it, fast accumulation as the exports set it) this prints, per candidate: GPU ms per call from
deployfuse.rewrite.gemm_tuning.time_settings (CUDA-graph replays of 20 launches: memsets and their gaps included), the
memsets and kernels one launch runs (torch's profiler), and which candidate the heuristic (-1) and the tuner would take.
Fp8Mlp's candidates are varied one GEMM at a time, the other at the heuristic's choice.

Since 2026-12-06 Fp8GemmAct gives cuBLASLt no workspace, whose algorithms then issue no memset
(gemm_memsets_workspace_h200.log's second half); DEPLOYFUSE_FP8_GEMM_WORKSPACE=1 gives the 32 MiB again, as before.

    python3 bench/gemm_memsets.py plugins/build/gpu/libdeployfuse_ops_cuda.so [--tokens 8192,12608]
    DEPLOYFUSE_FP8_GEMM_WORKSPACE=1 python3 bench/gemm_memsets.py plugins/build/gpu/libdeployfuse_ops_cuda.so
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import onnx

from deployfuse.rewrite.gemm_tuning import MARGIN, Fp8GemmProblem, Fp8MlpProblem, Problem, Setting, load_library, time_settings

F16 = onnx.TensorProto.FLOAT16


def problems(tokens: int) -> dict[str, Problem]:
    """BERT-base / GPT-2 / ViT-B's fp8 GEMMs at `tokens` rows, as their artefacts run them."""
    return {"qkv": Fp8GemmProblem(tokens, 2304, 768, F16, "none", 1, 1), "out": Fp8GemmProblem(tokens, 768, 768, F16, "none", 1, 1),
            "mlp-gelu_tanh": Fp8MlpProblem(tokens, 768, 3072, 768, F16, "gelu_tanh", 1, 1)}


def launch_ops(launch, setting: Setting) -> tuple[int, list[str]]:
    """(memsets, kernel names) of one launch at `setting`, as torch's profiler records them."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    launch(setting)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        launch(setting)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(n.startswith("Memset") for n in names), [n[:60] for n in names if not n.startswith(("Memset", "Memcpy"))]


def report(name: str, problem: Problem, lib) -> None:
    counts, launch = problem.launcher(lib)
    settings: list[Setting] = [(-1,) * len(counts)]
    for gemm, count in enumerate(counts):
        settings += [tuple(a if j == gemm else -1 for j in range(len(counts))) for a in range(1, count)]
    times = time_settings(launch, settings)
    base = times[0]
    best = min(range(len(settings)), key=times.__getitem__)
    print(f"\n{name} {problem}: candidates {counts}; heuristic {base:.4f} ms; fastest {settings[best]} {times[best]:.4f} ms "
          f"({'the tuner takes it' if times[best] < base * (1 - MARGIN) else 'within the tuner margin: heuristic kept'})")
    print("| setting | ms | x heuristic | memsets | kernels |\n| --- | --- | --- | --- | --- |")
    for setting, ms in zip(settings, times, strict=True):
        memsets, kernels = launch_ops(launch, setting)
        print(f"| {setting} | {ms:.4f} | {ms / base:.3f} | {memsets} | {', '.join(kernels)} |")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("lib", type=Path, help="libdeployfuse_ops_cuda.so")
    parser.add_argument("--tokens", default="8192,12608", help="rows (batch x sequence) to probe")
    args = parser.parse_args(argv)
    lib = load_library(args.lib)
    for tokens in (int(t) for t in args.tokens.split(",")):
        for name, problem in problems(tokens).items():
            try:
                report(f"{name} @ {tokens}", problem, lib)
            except Exception as exc:  # one problem's failure must not cost the others
                print(f"{name} @ {tokens}: failed: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
