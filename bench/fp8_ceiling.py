"""What FP8 can give the GEMMs of the benchmark models on this GPU: cuBLASLt fp8 (torch._scaled_mm,
per-tensor scales, fp16 output, bias) against fp16 torch.matmul + bias, at each model's GEMM shapes.

The ratio bounds what an fp8 artefact can win: the GEMMs' share of the fp16 model's time times
(1 - fp8/fp16). Kernel time by CUDA events over 200 back-to-back calls.

    python bench/fp8_ceiling.py
"""

from __future__ import annotations

import torch

SHAPES = {  # (K, N) of each GEMM per layer; M = batch x tokens
    "bert/vit qkv|o": (768, 768),
    "bert/vit fc1": (768, 3072),
    "bert/vit fc2": (3072, 768),
    "gpt2 c_attn": (768, 2304),
}
TOKENS = {"b8 bert/gpt2": 8 * 128, "b8 vit": 8 * 197, "b64 bert/gpt2": 64 * 128, "b64 vit": 64 * 197}


def kernel_ms(fn, runs: int = 200) -> float:
    for _ in range(20):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(runs):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / runs


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__)
    one = torch.ones((), device="cuda")
    print(f"{'tokens':>16} {'gemm':>16} {'M':>6} {'K':>5} {'N':>5} {'fp16 ms':>9} {'fp8 ms':>9} {'fp8/fp16':>8}")
    for tokens_name, m in TOKENS.items():
        for name, (k, n) in SHAPES.items():
            x = torch.randn(m, k, device="cuda", dtype=torch.float16)
            w = torch.randn(k, n, device="cuda", dtype=torch.float16) / k**0.5
            bias = torch.randn(n, device="cuda", dtype=torch.float16)
            xq = x.to(torch.float8_e4m3fn)
            wq = w.t().contiguous().to(torch.float8_e4m3fn).t()  # column-major B, as cuBLASLt's fp8 wants
            fp16 = kernel_ms(lambda x=x, w=w, bias=bias: torch.addmm(bias, x, w))
            fp8 = kernel_ms(lambda xq=xq, wq=wq, bias=bias: torch._scaled_mm(xq, wq, scale_a=one, scale_b=one, bias=bias, out_dtype=torch.float16))
            quant = kernel_ms(lambda x=x: x.to(torch.float8_e4m3fn))
            print(f"{tokens_name:>16} {name:>16} {m:>6} {k:>5} {n:>5} {fp16:9.4f} {fp8:9.4f} {fp8 / fp16:8.2f}  (+quantize X {quant:.4f})")


if __name__ == "__main__":
    main()
