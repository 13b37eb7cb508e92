"""Host time of a plan's first launch at a stored variant index (the lazy walk) against the full walk (candidates), fresh shapes each."""
import sys
import time

import torch

sys.path.insert(0, "bench")
from fp8_gemm_gpu import CApi, Problem  # noqa: E402

api = CApi(sys.argv[1])
for i, (algo, k, n) in enumerate([(-1, 768, 768), (8, 768, 2304), (20, 768, 3072), (60, 3072, 768)]):
    p = Problem((8, 128), k, n, "none", torch.float16, "cuda", fast_accum=1)
    torch.cuda.synchronize()
    start = time.perf_counter()
    rc = api.run(p, algo)
    torch.cuda.synchronize()
    first = time.perf_counter() - start
    q = Problem((8, 128 + 1 + i), k, n, "none", torch.float16, "cuda", fast_accum=1)
    start = time.perf_counter()
    count = api.lib.df_fp8_gemm_act_candidates(1, q.x_scale.data_ptr(), q.w.data_ptr(), q.w_scale.data_ptr(), q.bias.data_ptr(), q.y.data_ptr(),
                                              q.m, q.n, q.k, 0, 1)
    full = time.perf_counter() - start
    print(f"lazy probe {k}x{n}: first launch at algo {algo}: rc {rc}, {first * 1e3:.1f} ms; full walk (candidates={count}): {full * 1e3:.1f} ms")
