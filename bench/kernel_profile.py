"""Where the GPU time of one inference goes, by kernel class, for any callable that launches work.

CUPTI (through torch.profiler) records every kernel the process launches, ONNX Runtime's and
CUDA-graph replays included, so ORT artefacts and PyTorch can be profiled the same way. The
classes answer the question issue 7 asks of a slow row: is it the GEMMs / convolutions (the
floor every variant shares) or everything between them (what fusion removes)?

The idle time between kernels answers the next one, where a CUDA graph's wall time goes beyond its kernels': each kernel's
`gap_before_ms` is the time from the previous kernel's end to its start, summed per call, counted only when under
GAP_LIMIT_US (a longer wait is the host between calls, not the graph).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable

import torch

# First match wins; names are matched case-insensitively against the demangled kernel name.
CLASSES = (
    ("fp8 quantize", r"quantize_e4m3"),  # Fp8GemmAct's pass that writes X in float8 (plugins/fp8_gemm_act)
    ("attention", r"flash|fmha|attention|attn|mha|softmax"),
    ("copy/layout", r"nchwtonhwc|nhwctonchw"),
    ("conv", r"conv|cudnn|implicit_?gemm|winograd|fprop|dgrad|wgrad"),
    ("gemm", r"gemm|cublas|cutlass|xmma|nvjet|sm\d+_|ampere_|hopper_|matmul|mma"),
    ("norm", r"norm"),
    ("copy/layout", r"transpose|copy|memcpy|memset|concat|split|slice|gather|cast|permute|reshape|nchw|nhwc"),
)


def kernel_class(name: str) -> str:
    for label, pattern in CLASSES:
        if re.search(pattern, name, re.IGNORECASE):
            return label
    return "elementwise/other"


GAP_LIMIT_US = 20.0


def profile(fn: Callable[[], object], iters: int = 20) -> dict:
    """GPU time per inference: total, by class, and every kernel, largest first (ms and launches per call of fn)."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    fn()
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    events = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return summarise(events, iters)


def summarise(events: list[tuple[str, float, float]], iters: int) -> dict:
    """profile's figures from its kernels as (name, start us, end us), over `iters` calls."""
    per_kernel: dict[str, list[float]] = defaultdict(lambda: [0.0, 0, 0.0])  # ms, launches, gap before (ms), per call
    previous_end = None
    for name, start, end in sorted(events, key=lambda e: e[1]):
        entry = per_kernel[name]
        entry[0] += (end - start) / 1e3 / iters
        entry[1] += 1 / iters
        if previous_end is not None and 0 < start - previous_end < GAP_LIMIT_US:
            entry[2] += (start - previous_end) / 1e3 / iters
        previous_end = end if previous_end is None else max(previous_end, end)
    by_class: dict[str, float] = defaultdict(float)
    for name, (ms, _, _) in per_kernel.items():
        by_class[kernel_class(name)] += ms
    top = sorted(per_kernel.items(), key=lambda kv: -kv[1][0])
    return {
        "gpu_ms": round(sum(ms for ms, _, _ in per_kernel.values()), 4),
        "gap_ms": round(sum(gap for _, _, gap in per_kernel.values()), 4),
        "kernels_per_call": round(sum(n for _, n, _ in per_kernel.values()), 1),
        "by_class_ms": {k: round(v, 4) for k, v in sorted(by_class.items(), key=lambda kv: -kv[1])},
        "top": [{"kernel": name[:160], "ms": round(ms, 4), "calls": round(n, 1), "class": kernel_class(name), "gap_before_ms": round(gap, 4)}
                for name, (ms, n, gap) in top],
    }
