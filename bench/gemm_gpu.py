"""GPU check and benchmark of GemmAct (cuBLASLt GEMM + fused epilogue) through the C ABI.

Correctness: fp32 (TF32) / fp16 / bf16 over awkward shapes (K, N odd, N = 1, batch dims, a
residual, every activation), outputs poisoned with NaN before each launch, ||out - ref|| /
||ref|| against the spec's reference in float64 on the same rounded inputs; every heuristic
candidate of one shape too (autotune may store any), and a CUDA-graph replay against the eager
result (the launch must be capturable once its shape has run).

Speed (GPU ms per call, CUDA-graph replays of 20 calls): torch.matmul + bias + activation
(eager, TF32 allowed), F.linear (addmm: cuBLASLt's bias epilogue) + activation, "ORT style"
(torch.matmul = cuBLAS, then a separate bias pass: torch's add, or deployfuse's BiasAct with an activation), GemmAct
at the heuristic's first choice (algo -1) and at the fastest candidate (its index printed).

    python bench/gemm_gpu.py LIB.so                  # checks + timings
    python bench/gemm_gpu.py LIB.so --check-only [--small]   # checks only (--small: under compute-sanitizer)
"""

from __future__ import annotations

import argparse
import ctypes
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from deployfuse.ops.schema import TF32_TOLERANCE  # noqa: E402
from deployfuse.ops.specs import SPECS  # noqa: E402
from deployfuse.rewrite.gemm_tuning import ACT_CODES, WORKSPACE_BYTES, load_library  # noqa: E402

DT = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
TOL = {torch.float32: TF32_TOLERANCE, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}  # fp32 runs in TF32

# (leading dims of X, K, N, activation, residual)
CHECKS = [
    ((3, 5), 37, 19, "none", False),
    ((3, 5), 37, 19, "relu", True),
    ((7,), 33, 1, "relu", False),
    ((2, 9), 64, 1, "gelu_tanh", True),
    ((1,), 768, 768, "gelu_tanh", False),
    ((4, 33), 130, 257, "gelu_tanh", True),
    ((2, 3, 5), 16, 24, "relu", False),
    ((8, 128), 768, 3072, "gelu_tanh", False),
    ((8, 128), 3072, 768, "none", True),
    ((64, 128), 768, 2304, "none", False),
]

# (model, tokens, K, N, activation): the linear layers GemmAct takes in BERT-base / GPT-2 (seq 128) and
# ViT-B/16 (197 tokens); their exact-GELU up-projections stay MatMul + BiasGelu (see the op's spec)
BENCH = [
    (f"{model} {batch}x{seq}", batch * seq, k, n, act)
    for model, seq in (("BERT-base", 128), ("GPT-2", 128), ("ViT-B/16", 197))
    for batch in (8, 64)
    for k, n, act in ((768, 2304 if model == "GPT-2" else 768, "none"), (768, 3072, "gelu_tanh"), (3072, 768, "none"))
    if act == "none" or model == "GPT-2"
]


def load(path: str) -> ctypes.CDLL:
    """The library with GemmAct's entries (as the tuner declares them) and the generic df_run."""
    lib = load_library(path)
    P, I64, INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.df_run.argtypes = [ctypes.c_char_p, INT, P, INT, ctypes.POINTER(P), ctypes.POINTER(ctypes.POINTER(I64)), ctypes.POINTER(INT), P,
                           ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_char_p)]
    return lib


def bias_act(lib: ctypes.CDLL, x: torch.Tensor, bias: torch.Tensor, y: torch.Tensor, act: str) -> None:
    """y = act(x + bias) by deployfuse's BiasAct through the generic C ABI (df_run), or torch's add
    for no activation: the separate bias pass ORT runs after its MatMul."""
    if act == "none":
        torch.add(x, bias, out=y)
        return
    dims = [(ctypes.c_int64 * t.dim())(*t.shape) for t in (x, bias)]
    rc = lib.df_run(b"BiasAct", DT[x.dtype], torch.cuda.current_stream().cuda_stream, 2, (ctypes.c_void_p * 2)(x.data_ptr(), bias.data_ptr()),
                    (ctypes.POINTER(ctypes.c_int64) * 2)(*[ctypes.cast(d, ctypes.POINTER(ctypes.c_int64)) for d in dims]),
                    (ctypes.c_int * 2)(x.dim(), bias.dim()), y.data_ptr(), (ctypes.c_double * 1)(0.0), (ctypes.c_char_p * 1)(act.encode()))
    if rc != 0:
        raise RuntimeError(f"df_run(BiasAct): {rc}")


def ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


class Gemm:
    """One GemmAct problem on the GPU: inputs, output, workspace, and the C ABI calls."""

    def __init__(self, lib: ctypes.CDLL, lead: tuple[int, ...], k: int, n: int, act: str, residual: bool, dtype: torch.dtype) -> None:
        self.lib, self.act, self.dtype = lib, act, dtype
        self.m, self.n, self.k = math.prod(lead), n, k
        self.x = torch.randn(*lead, k, device="cuda").to(dtype)
        self.w = (torch.randn(k, n, device="cuda") / k**0.5).to(dtype)
        self.bias = torch.randn(n, device="cuda").to(dtype)
        self.residual = torch.randn(*lead, n, device="cuda").to(dtype) if residual else None
        self.y = torch.empty(*lead, n, device="cuda", dtype=dtype)
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")

    def candidates(self) -> int:
        return self.lib.df_gemm_act_candidates(DT[self.dtype], ptr(self.x), ptr(self.w), ptr(self.bias), ptr(self.residual), ptr(self.y),
                                               self.m, self.n, self.k, ACT_CODES[self.act])

    def run(self, algo: int = -1) -> None:
        err = self.lib.df_gemm_act(DT[self.dtype], torch.cuda.current_stream().cuda_stream, ptr(self.x), ptr(self.w), ptr(self.bias),
                                   ptr(self.residual), ptr(self.y), self.m, self.n, self.k, ACT_CODES[self.act], algo, ptr(self.workspace), WORKSPACE_BYTES)
        if err != 0:
            raise RuntimeError(f"df_gemm_act: CUDA error {err}")

    def reference(self) -> torch.Tensor:
        spec = SPECS["GemmAct"]
        args = [t.double() for t in (self.x, self.w, self.bias)] + [None if self.residual is None else self.residual.double()]
        return spec.reference(*args, activation=self.act, algo=-1)

    def error(self, algo: int = -1) -> tuple[float, int]:
        """(relative L2 error, NaN count) of one launch into a NaN-poisoned output."""
        self.y.fill_(float("nan"))
        self.run(algo)
        torch.cuda.synchronize()
        ref, got = self.reference(), self.y.double()
        return float(torch.linalg.vector_norm(got - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-30)), int(torch.isnan(got).sum())


SMALL = 1 << 22  # --small: the checks of at most this many multiply-adds (compute-sanitizer runs)


def check(lib: ctypes.CDLL, small: bool = False) -> bool:
    ok = True
    for dtype in DT:
        for lead, k, n, act, residual in CHECKS:
            if small and math.prod(lead) * k * n > SMALL:
                continue
            g = Gemm(lib, lead, k, n, act, residual, dtype)
            err, nan = g.error()
            good = nan == 0 and err <= TOL[dtype]
            ok &= good
            print(f"{'ok  ' if good else 'FAIL'} {str(dtype)[6:]:8} X{list(lead) + [k]} W[{k},{n}] {act:9} residual={int(residual)} "
                  f"candidates={g.candidates():2d} rel_l2={err:.2e} nan={nan}")
    for dtype in DT:  # every candidate autotune may pick computes the same
        g = Gemm(lib, (8, 128), 768, 768, "gelu_tanh", True, dtype)
        errs = [g.error(a) for a in range(g.candidates())]
        good = all(nan == 0 and e <= TOL[dtype] for e, nan in errs)
        ok &= good
        print(f"{'ok  ' if good else 'FAIL'} {str(dtype)[6:]:8} every candidate of 1024x768x768 gelu_tanh+residual: "
              f"max rel_l2={max(e for e, _ in errs):.2e} over {len(errs)}")
        g.run()
        eager = g.y.clone()
        graph = torch.cuda.CUDAGraph()
        g.y.fill_(float("nan"))
        with torch.cuda.graph(graph):
            g.run()
        graph.replay()
        torch.cuda.synchronize()
        same = bool(torch.equal(g.y, eager))
        ok &= same
        print(f"{'ok  ' if same else 'FAIL'} {str(dtype)[6:]:8} CUDA-graph capture and replay = eager launch")
    return ok


def gpu_ms(fn, calls: int = 20, replays: int = 20) -> float:
    """Median GPU ms per call of fn, from CUDA-graph replays of `calls` calls (no launch gaps)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return sorted(times)[len(times) // 2]


ACTS = {"none": lambda t: t, "relu": torch.relu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}


def bench_row(lib: ctypes.CDLL, name: str, m: int, k: int, n: int, act: str, dtype: torch.dtype) -> str:
    """One table row: the alternatives and GemmAct (heuristic, every candidate) on one problem."""
    g = Gemm(lib, (m,), k, n, act, False, dtype)
    f, wt, tmp = ACTS[act], g.w.t().contiguous(), torch.empty_like(g.y)

    def ort_style() -> None:  # ORT's MatMul (cuBLAS) and its separate bias(+activation) kernel
        torch.matmul(g.x, g.w, out=tmp)
        bias_act(lib, tmp, g.bias, g.y, act)

    alt = {"torch": gpu_ms(lambda: f(g.x @ g.w + g.bias)), "linear": gpu_ms(lambda: f(F.linear(g.x, wt, g.bias))), "ort": gpu_ms(ort_style)}
    count = g.candidates()
    per_algo = [gpu_ms(lambda a=a: g.run(a)) for a in range(count)]
    best = min(range(count), key=per_algo.__getitem__)
    heuristic = gpu_ms(lambda: g.run(-1))
    speedup = min(alt.values()) / per_algo[best]
    return (f"| {name} | {str(dtype)[6:]} | {m}x{k}x{n} | {act} | {alt['torch']:.4f} | {alt['linear']:.4f} | {alt['ort']:.4f} | "
            f"{heuristic:.4f} | {per_algo[best]:.4f} ({best}) | {count} | {speedup:.2f} |")


def bench(lib: ctypes.CDLL) -> None:
    torch.backends.cuda.matmul.allow_tf32 = True  # ORT's CUDA EP runs fp32 in TF32 by default
    print("\nGPU ms per call (CUDA-graph replays); speed-up = best alternative / GemmAct best")
    print(f"| shape | dtype | M x K x N | act | torch matmul+bias+act | F.linear+act | ORT style (matmul + BiasAct) | GemmAct heuristic | "
          f"GemmAct best (algo) | candidates | speed-up |\n|{'---|' * 11}")
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for name, m, k, n, act in BENCH:
            print(bench_row(lib, name, m, k, n, act, dtype))


def tuner(path: str) -> bool:
    """deployfuse.rewrite.gemm_tuning on this GPU: a one-node fp16 model of GPT-2's 64x128-token
    up-projection (tanh GELU), its problem found, every candidate timed, the node's algo set."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    from deployfuse.ops import attach_functions
    from deployfuse.rewrite.gemm_tuning import gemm_problems, tune

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((768, 3072)) / 28).astype(np.float16), "w"),
             numpy_helper.from_array(rng.standard_normal(3072).astype(np.float16), "b")]
    node = helper.make_node("GemmAct", ["x", "w", "b"], ["y"], domain="deployfuse", activation="gelu_tanh")
    graph = helper.make_graph([node], "gemm", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT16, ["batch", 128, 768])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT16, ["batch", 128, 3072])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    attach_functions(model)
    feed = {"x": rng.standard_normal((64, 128, 768)).astype(np.float16)}
    print("tuner:", gemm_problems(model, feed))
    print("tuner:", tune(model, feed, Path(path)))
    algo = [helper.get_attribute_value(a) for a in model.graph.node[0].attribute if a.name == "algo"]
    print("tuner: stored algo", algo)
    return len(algo) == 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lib", help="libdeployfuse_ops_cuda.so")
    ap.add_argument("--check-only", action="store_true", help="no timings")
    ap.add_argument("--small", action="store_true", help="only the small checks (for compute-sanitizer)")
    args = ap.parse_args()
    torch.manual_seed(0)
    lib = load(args.lib)
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    ok = check(lib, args.small)
    if not args.check_only:
        ok &= tuner(args.lib)
        bench(lib)
    print("all checks passed" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
