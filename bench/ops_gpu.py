"""GPU check and benchmark of the deployfuse CUDA kernels (run on a CUDA machine by gpu_ops.sh).

Correctness: every op in fp32/fp16/bf16 over awkward shapes, outputs poisoned with NaN before
each launch, compared by ||out - ref|| / ||ref|| against the spec's PyTorch reference computed
in float64. Speed: GPU time per call from CUDA-graph replays against a device copy of the same
bytes, PyTorch eager and torch.compile of the same math.

    python bench/ops_gpu.py LIB.so [--ort libdeployfuse_ort.so] [--only FusedMHA,BiasAct]
    python bench/ops_gpu.py OTHER_LIB.so --time-only      # the benchmark shapes only, for A/B runs
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import importlib.util
import math
import sys
import zlib
from pathlib import Path

import torch
import torch.nn.functional as F

# specs.py alone (torch only): the package __init__ pulls in modules this GPU check never needs.
_spec = importlib.util.spec_from_file_location("deployfuse_specs", Path(__file__).parents[1] / "deployfuse/ops/specs.py")
_specs = sys.modules["deployfuse_specs"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_specs)
SPECS = _specs.SPECS

DT = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
ACT = {"none": 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "silu": 4, "sigmoid": 5}
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


class MhaShape(ctypes.Structure):
    _fields_ = [("batch", ctypes.c_int64), ("q_seq", ctypes.c_int64), ("k_seq", ctypes.c_int64), ("heads", ctypes.c_int64),
                ("head_dim", ctypes.c_int64), ("scale", ctypes.c_float), ("causal", ctypes.c_bool), ("mask_stride", ctypes.c_int64 * 4)]


ARGS = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ARGS.add_argument("lib", help="libdeployfuse_ops_cuda.so")
ARGS.add_argument("--ort", metavar="LIB", help="libdeployfuse_ort.so: also check and time the ops through ORT's CUDA EP")
ARGS.add_argument("--time-only", action="store_true", help="GPU ms of the benchmark shapes only (the other side of an A/B run)")
ARGS.add_argument("--only", metavar="OPS", help="comma-separated op names to check and benchmark (default: all)")
ARGS.add_argument("--check-only", action="store_true", help="no benchmarks (e.g. under compute-sanitizer)")
ARGS.add_argument("--max-size", type=int, metavar="N", help="only the check cases whose shape's product (FusedMHA: b*sq*sk*hidden, its work) is at most N")
ARGS = ARGS.parse_args()
ONLY = set(ARGS.only.split(",")) if ARGS.only else None


def wanted(op):
    return ONLY is None or op in ONLY


lib = ctypes.CDLL(ARGS.lib)
P, I64, Fl = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
for name, argtypes in (("df_layer_norm_gelu", [ctypes.c_int, P, P, P, P, P, I64, I64, Fl, ctypes.c_int]),
                       ("df_group_norm_act", [ctypes.c_int, P, P, P, P, P, I64, I64, I64, I64, Fl, ctypes.c_int]),
                       ("df_bias_act", [ctypes.c_int, P, P, P, P, I64, I64, ctypes.c_int]),
                       ("df_fused_mha", [ctypes.c_int, P, P, P, P, P, P, ctypes.POINTER(MhaShape)])):
    if hasattr(lib, name):  # with --only, a library of just those ops' launchers will do
        getattr(lib, name).argtypes = argtypes


def ptr(t):
    return None if t is None else ctypes.c_void_p(t.data_ptr())


def stream():
    return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)


def ok(rc):
    assert rc == 0, f"CUDA error {rc}"


def native(op, xs, attrs, y):
    x = xs[0]
    d = DT[x.dtype]
    if op == "LayerNormGelu":
        cols = xs[1].numel()
        ok(lib.df_layer_norm_gelu(d, stream(), ptr(x), ptr(xs[1]), ptr(xs[2]), ptr(y), x.numel() // cols, cols, attrs.get("epsilon", 1e-5), attrs.get("approximate") == "tanh"))
    elif op == "GroupNormAct":
        n, c = x.shape[:2]
        ok(lib.df_group_norm_act(d, stream(), ptr(x), ptr(xs[1]), ptr(xs[2]), ptr(y), n, c, x[0, 0].numel(), attrs["num_groups"], attrs.get("epsilon", 1e-5),
                                 ACT[attrs.get("activation", "silu")]))
    elif op == "BiasAct":
        ok(lib.df_bias_act(d, stream(), ptr(x), ptr(xs[1]), ptr(y), x.numel(), x.shape[-1], ACT[attrs.get("activation", "gelu")]))
    else:
        q, k, v, mask = xs
        heads = attrs["num_heads"]
        hd = q.shape[2] // heads
        strides = [0, 0, 0, 0]
        if mask is not None:
            m4 = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
            strides = [0 if m4.shape[i] == 1 else m4.stride(i) for i in range(4)]
        s = MhaShape(q.shape[0], q.shape[1], k.shape[1], heads, hd, attrs.get("scale", 0.0) or 1 / math.sqrt(hd), bool(attrs.get("causal", 0)), (ctypes.c_int64 * 4)(*strides))
        ok(lib.df_fused_mha(d, stream(), ptr(q), ptr(k), ptr(v), ptr(mask), ptr(y), ctypes.byref(s)))


def inputs(op, shape, dtype, attrs):
    def g(*s, scale=1.0, shift=0.0):
        t = (torch.randn(*s, device="cuda") * scale + shift).to(dtype)
        if attrs.get("misalign"):  # storage one element off 16-byte alignment: the scalar paths
            t = torch.cat([t.new_zeros(1), t.flatten()])[1:].view(t.shape)
        return t

    if op == "LayerNormGelu":
        return [g(*shape, scale=2, shift=0.5), g(shape[-1], shift=1), g(shape[-1])]
    if op == "GroupNormAct":
        return [g(*shape, scale=2, shift=0.5), g(shape[1], shift=1), g(shape[1])]
    if op == "BiasAct":
        return [g(*shape), g(shape[-1])]
    b, sq, sk, hid = shape
    return [g(b, sq, hid), g(b, sk, hid), g(b, sk, hid), mha_mask(b, attrs["num_heads"], sq, sk, dtype, attrs)]


def mha_mask(b, h, sq, sk, dtype, attrs):
    """Additive FusedMHA mask, or None. attrs["mask"]: True = [b, 1, 1, sk], or a string naming the
    kept dims of [b, h, q, k] (others broadcast, leading 1s dropped: "qk" = [sq, sk]).
    attrs["mask_inf"]: that fraction of entries -inf, and the first query row -inf everywhere (the
    kernels output 0 for a fully masked row; the reference's NaN there is taken as 0).
    attrs["mask_layout"]: the same values in non-contiguous storage (NaN around them), for the
    tensor-core kernel's mask paths: "pad" = rows padded to a multiple of 8 keys (+8), so rows stay
    16-byte aligned whatever k_seq; "offset" = storage one element off 16-byte alignment;
    "kstride" = keys 2 elements apart."""
    kind = attrs.get("mask")
    if not kind:
        return None
    dims = "bk" if kind is True else kind
    full = {"b": b, "h": h, "q": sq, "k": sk}
    shape = [full[c] if c in dims else 1 for c in "bhqk"]
    while len(shape) > 2 and shape[0] == 1:
        shape.pop(0)
    m = torch.randn(*shape, device="cuda")
    if attrs.get("mask_inf"):
        m[torch.rand_like(m) < attrs["mask_inf"]] = float("-inf")
        if "q" in dims:
            m[..., 0, :] = float("-inf")
    m = m.to(dtype)
    layout = attrs.get("mask_layout")
    if layout:
        nan = float("nan")
        if layout == "pad":
            view = torch.full((*m.shape[:-1], (m.shape[-1] + 15) // 8 * 8), nan, dtype=dtype, device="cuda")[..., :m.shape[-1]]
        elif layout == "offset":
            view = torch.full((m.numel() + 1,), nan, dtype=dtype, device="cuda")[1:].view(m.shape)
        else:
            assert layout == "kstride", layout
            view = torch.full((*m.shape, 2), nan, dtype=dtype, device="cuda")[..., 0]
        view.copy_(m)
        m = view
    return m


CHECKS = [
    ("LayerNormGelu", (1, 1, 7), {}), ("LayerNormGelu", (3, 77, 771), {"approximate": "tanh"}),
    ("LayerNormGelu", (2, 5, 65537), {}), ("LayerNormGelu", (64, 512, 768), {"epsilon": 1e-3}),
    ("GroupNormAct", (2, 12, 7, 9), {"num_groups": 4}), ("GroupNormAct", (4, 320, 33, 31), {"num_groups": 32, "activation": "gelu"}),
    ("GroupNormAct", (1, 6, 1, 3), {"num_groups": 3, "activation": "none"}),
    ("GroupNormAct", (2, 64, 16, 16), {"num_groups": 8}), ("GroupNormAct", (3, 96, 40, 40), {"num_groups": 32, "activation": "gelu"}),
    ("GroupNormAct", (1, 32, 128, 128), {"num_groups": 4, "activation": "none"}),
    ("GroupNormAct", (2, 16, 8, 8), {"num_groups": 4, "misalign": True}),
    ("LayerNormGelu", (4, 3, 16384), {}), ("LayerNormGelu", (8, 32768), {"approximate": "tanh"}),
    ("LayerNormGelu", (5, 4104), {}), ("LayerNormGelu", (6, 512), {"misalign": True}),
    # warp-per-row path (<= 512 vectors: 4096 fp16/bf16, 2048 fp32 columns) and its edges; rows % 4 != 0
    ("LayerNormGelu", (1027, 4096), {}), ("LayerNormGelu", (3, 7, 4088), {"approximate": "tanh"}),
    ("LayerNormGelu", (5, 2056), {}), ("LayerNormGelu", (2, 2048), {"epsilon": 1e-3}),
    ("LayerNormGelu", (9, 264), {}), ("LayerNormGelu", (1, 8), {}), ("LayerNormGelu", (6, 2052), {"approximate": "tanh"}),
    # GroupNormAct persistent grid: more slices than resident blocks, slices of a partial piece, channels of 1 vector
    ("GroupNormAct", (4, 512, 64, 64), {"num_groups": 32}), ("GroupNormAct", (16, 512, 16, 16), {"num_groups": 32, "activation": "gelu"}),
    ("GroupNormAct", (3, 4, 1, 8), {"num_groups": 2}), ("GroupNormAct", (2, 24, 5, 8), {"num_groups": 3, "activation": "none"}),
    # GroupNormAct shared-memory ring (sm_90): clusters of 4/8 blocks with a ragged last chunk and a
    # partial last piece; 16-bit: two blocks an SM (Ring<2>), fp32: the largest slice (8 blocks of
    # 128 KiB); one past it (fallback). (1, 32, 128, 128) above: fp32 on Ring<2>, 16-bit spread to 8 blocks.
    ("GroupNormAct", (1, 10, 8, 1001), {"num_groups": 2, "activation": "gelu"}),
    ("GroupNormAct", (1, 64, 128, 128), {"num_groups": 4}), ("GroupNormAct", (1, 64, 128, 130), {"num_groups": 2, "activation": "none"}),
    ("BiasAct", (1, 3), {"activation": "relu"}), ("BiasAct", (5, 77, 1001), {"activation": "gelu"}),
    ("BiasAct", (33, 512), {"activation": "gelu"}), ("BiasAct", (7, 3, 2048), {"activation": "gelu_tanh"}),
    ("BiasAct", (9, 1024), {"activation": "silu", "misalign": True}),
    ("BiasAct", (129, 4100), {"activation": "gelu_tanh"}), ("BiasAct", (64, 512, 3072), {"activation": "silu"}),
    ("BiasAct", (3, 7, 13), {"activation": "sigmoid"}),
    ("FusedMHA", (2, 7, 7, 24), {"num_heads": 3}), ("FusedMHA", (2, 33, 65, 128), {"num_heads": 2, "causal": 1, "mask": True, "scale": 0.3}),
    ("FusedMHA", (1, 1, 1000, 640), {"num_heads": 5, "mask": True}), ("FusedMHA", (4, 300, 300, 1024), {"num_heads": 16, "causal": 1}),
    ("FusedMHA", (1, 70, 70, 512), {"num_heads": 2}),
    # tensor-core path (fp16/bf16, head_dim 32/64/96/128): tails, cross attention, masks, seq 1
    ("FusedMHA", (2, 128, 128, 1024), {"num_heads": 16}), ("FusedMHA", (2, 200, 200, 512), {"num_heads": 16, "causal": 1}),
    ("FusedMHA", (3, 77, 333, 256), {"num_heads": 2, "mask": "bhqk"}), ("FusedMHA", (2, 300, 45, 512), {"num_heads": 4, "causal": 1, "mask": "qk"}),
    ("FusedMHA", (2, 64, 64, 384), {"num_heads": 4, "mask": "hqk", "mask_inf": 0.3}),
    ("FusedMHA", (2, 150, 190, 256), {"num_heads": 8, "causal": 1, "mask": "bqk", "mask_inf": 0.5}),
    ("FusedMHA", (2, 1, 1, 512), {"num_heads": 8}), ("FusedMHA", (3, 1, 257, 256), {"num_heads": 2, "mask": True}),
    ("FusedMHA", (2, 257, 1, 128), {"num_heads": 4, "causal": 1}), ("FusedMHA", (1, 40, 520, 768), {"num_heads": 12, "scale": 0.05}),
    ("FusedMHA", (2, 1000, 1000, 512), {"num_heads": 4, "causal": 1, "mask": "bk", "mask_inf": 0.1}),
    ("FusedMHA", (1, 2048, 2048, 256), {"num_heads": 2}), ("FusedMHA", (1, 96, 96, 256), {"num_heads": 4, "misalign": True}),
    ("FusedMHA", (2, 100, 130, 512), {"num_heads": 8, "causal": 1, "scale": -0.2}),
    ("FusedMHA", (1, 50, 70, 256), {"num_heads": 2, "mask": "bhqk", "scale": -0.1}),
    # tensor-core mask paths (fused_mha_tc.cu MaskMode). kTile (q-varying, key stride 1, rows 16-byte
    # aligned: cp.async tile): 8 warps, k_seq % 64 != 0, rows past q_seq, a fully masked row; padded
    # rows with k_seq % 8 != 0 (partial 16-byte chunk), causal; head_dim 128.
    ("FusedMHA", (2, 200, 136, 512), {"num_heads": 8, "mask": "bhqk", "mask_inf": 0.2}),
    ("FusedMHA", (2, 130, 70, 256), {"num_heads": 4, "causal": 1, "mask": "qk", "mask_layout": "pad"}),
    ("FusedMHA", (1, 40, 100, 256), {"num_heads": 2, "mask": "hqk", "mask_layout": "pad", "mask_inf": 0.4}),
    # kRow (broadcast over q). cp.async: [k] with k_seq % 8 != 0 (partial chunk), 8 warps;
    # per-element: [b,1,1,k] with a row stride of 77 / a misaligned base / key stride 2, [b,h,1,1].
    ("FusedMHA", (2, 96, 203, 256), {"num_heads": 4, "mask": "k"}),
    ("FusedMHA", (3, 100, 77, 512), {"num_heads": 8, "mask": True, "mask_inf": 0.3}),
    ("FusedMHA", (2, 150, 260, 512), {"num_heads": 8, "causal": 1, "mask": True, "mask_layout": "offset"}),
    ("FusedMHA", (1, 64, 100, 128), {"num_heads": 4, "mask": True, "mask_layout": "kstride"}),
    ("FusedMHA", (2, 90, 64, 256), {"num_heads": 4, "mask": "bh"}),
    # kGlobal (per-element fallback): key stride 2; misaligned q-varying rows at 8 warps, head_dim 64.
    ("FusedMHA", (2, 80, 90, 256), {"num_heads": 2, "mask": "bhqk", "mask_layout": "kstride"}),
    ("FusedMHA", (2, 150, 100, 512), {"num_heads": 8, "mask": "bqk", "mask_layout": "offset", "mask_inf": 0.2}),
    # Hopper path (fused_mha_sm90.cu: head_dim 64/128, positive scale): key tails of 1 and 127 past a
    # 128-key tile, queries past the last 128/192-row block, a CTA with its second warpgroup idle
    # (q_seq 64), causal with q_seq > k_seq and q_seq < k_seq, many tiles through the 2-stage ring.
    ("FusedMHA", (3, 77, 257, 512), {"num_heads": 8}), ("FusedMHA", (2, 300, 383, 1024), {"num_heads": 8, "scale": 0.2}),
    ("FusedMHA", (2, 64, 500, 512), {"num_heads": 4, "causal": 1}), ("FusedMHA", (2, 300, 190, 1024), {"num_heads": 8, "causal": 1}),
    ("FusedMHA", (1, 1000, 3001, 256), {"num_heads": 2}), ("FusedMHA", (2, 640, 640, 2048), {"num_heads": 16, "causal": 1}),
    ("FusedMHA", (1, 129, 129, 128), {"num_heads": 2, "causal": 1}),
    # ... its TMA-staged masks (16-byte aligned, keys contiguous): per query with a fully masked row,
    # head_dim 128, keys past the last tile; one row per batch with -inf entries, causal, 3 warpgroups.
    ("FusedMHA", (2, 150, 264, 1024), {"num_heads": 8, "mask": "bhqk", "mask_inf": 0.3}),
    ("FusedMHA", (3, 300, 136, 512), {"num_heads": 8, "mask": True, "mask_inf": 0.2, "causal": 1}),
]


def check():
    worst = 0.0
    for op, shape, attrs in CHECKS:
        if not wanted(op) or (ARGS.max_size and math.prod(shape) > ARGS.max_size):
            continue
        for dtype in DT:
            torch.manual_seed(zlib.crc32(repr((op, shape, str(dtype))).encode()))  # hash() of str varies per process
            xs = inputs(op, shape, dtype, attrs)
            a = {k: v for k, v in attrs.items() if k not in ("mask", "mask_inf", "mask_layout", "misalign")}
            y = torch.full_like(xs[0] if op != "FusedMHA" else xs[0], float("nan"))
            native(op, xs, a, y)
            torch.cuda.synchronize()
            ref = SPECS[op].reference_fn(*[None if t is None else t.double() for t in xs], **SPECS[op].resolve(**a))
            if op == "FusedMHA":  # fully masked rows (mask_inf): NaN in the reference, 0 by the kernels' contract
                ref = torch.nan_to_num(ref, nan=0.0)
            assert not torch.isnan(y).any(), f"{op} {shape} {dtype}: unwritten/NaN outputs"
            rel = ((y.double() - ref).norm() / max(ref.norm().item(), 1e-30)).item()  # relu of 3 negatives: ref is 0
            status = "ok" if rel < TOL[dtype] else "FAIL"
            worst = max(worst, rel / TOL[dtype])
            shown = {**a, **{k: attrs[k] for k in ("mask", "mask_inf", "mask_layout", "misalign") if k in attrs}}
            print(f"check {status:4} {op:13} {str(shape):22} {str(dtype):15} rel_err={rel:.2e} {shown}")
    return worst


def ort_check(ort_lib):
    """Every op through ONNX Runtime's CUDA EP (fp32, fp16): the native kernels of the custom-op
    library (function bodies removed, so nothing else can run the node) and, without the library,
    the ONNX function bodies; both against the float64 reference, fresh inputs each time."""
    import numpy as np
    import onnxruntime as ort

    from deployfuse.ops.models import example_inputs, single_op_model

    cases = [("LayerNormGelu", (4, 77, 771), {}), ("LayerNormGelu", (8, 64, 1024), {"approximate": "tanh"}),
             ("GroupNormAct", (2, 64, 16, 16), {"num_groups": 8}), ("GroupNormAct", (2, 12, 7, 9), {"num_groups": 4, "activation": "gelu"}),
             ("BiasAct", (4, 33, 3072), {"activation": "gelu"}), ("BiasAct", (3, 7, 13), {"activation": "sigmoid"}),
             ("FusedMHA", (2, 33, 65, 128), {"num_heads": 2, "causal": 1, "mask": True}), ("FusedMHA", (2, 128, 128, 512), {"num_heads": 8})]
    worst = 0.0
    for op, shape, attrs in cases:
        if not wanted(op):
            continue
        for dtype, tol in ((np.float32, 1e-5), (np.float16, 2e-3)):
            for with_lib in (True, False):
                a = dict(attrs)
                xs = example_inputs(op, shape, dtype, **a)
                a.pop("mask", None)
                model = single_op_model(op, xs, **a)
                options = ort.SessionOptions()
                if with_lib:
                    del model.functions[:]
                    options.register_custom_ops_library(ort_lib)
                # ORT's CUDA EP runs fp32 MatMul in TF32 by default (~1e-3 relative): checking fp32 needs it off.
                sess = ort.InferenceSession(model.SerializeToString(), options, providers=[("CUDAExecutionProvider", {"use_tf32": "0"})])
                assert sess.get_providers()[0] == "CUDAExecutionProvider", sess.get_providers()
                feed = {n: x for n, x in zip(SPECS[op].inputs, xs) if x is not None}
                got = torch.from_numpy(sess.run(None, feed)[0].astype(np.float64))
                ref = SPECS[op].reference_fn(*[None if x is None else torch.from_numpy(x).double() for x in xs], **SPECS[op].resolve(**a))
                rel = ((got - ref).norm() / ref.norm()).item()
                worst = max(worst, rel / tol)
                kind = "library" if with_lib else "function body"
                print(f"ort-cuda {'ok' if rel < tol else 'FAIL':4} {op:13} {str(shape):18} {np.dtype(dtype).name:8} {kind:13} rel_err={rel:.2e}")
    return worst


def median_ms(fn, reps=50):
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return sorted(times)[len(times) // 2]


def graph_ms(fn, calls=20):
    """GPU time of one fn() call, free of Python launch overhead: `calls` calls captured in a CUDA
    graph, median replay time / calls."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="relaxed"):
        for _ in range(calls):
            fn()
    return median_ms(graph.replay, 10) / calls


# GroupNormAct: the round-1..4 shape (134 MB moved in fp16, ~32 us at copy speed: launch and ramp
# weigh) and two larger diffusion-UNet ones (2x and 4x the bytes).
BENCH_SHAPES = [("LayerNormGelu", (16384, 4096), {}), ("GroupNormAct", (16, 512, 64, 64), {"num_groups": 32}),
                ("GroupNormAct", (32, 512, 64, 64), {"num_groups": 32}), ("GroupNormAct", (16, 512, 128, 128), {"num_groups": 32}),
                ("BiasAct", (8192, 16384), {"activation": "gelu"})]


def bench():
    """Memory-bound ops against eager and torch.compile; every figure is GPU time per call from
    CUDA-graph replays (graph_ms), so Python and launch overhead stay out of the bandwidth."""
    rows = []
    big = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(big)
    copy_ms = median_ms(functools.partial(dst.copy_, big), 20)  # ~1 ms a copy: launch cost is noise; a captured copy ran slower
    copy_bw = 2 * big.numel() / copy_ms / 1e6
    del big, dst
    print(f"copy bandwidth {copy_bw:.0f} GB/s (read+write, 2 GiB)")
    eager_of = {
        "LayerNormGelu": lambda x, w, b: F.gelu(F.layer_norm(x, (x.shape[-1],), w, b)),
        "GroupNormAct": lambda x, w, b: F.silu(F.group_norm(x, 32, w, b)),
        "BiasAct": lambda x, b: F.gelu(x + b),
    }
    for op, shape, attrs in BENCH_SHAPES:
        if not wanted(op):
            continue
        eager = eager_of[op]
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            xs = inputs(op, shape, dtype, attrs)
            y = torch.empty_like(xs[0])
            nbytes = 2 * xs[0].numel() * xs[0].element_size()
            t_native = graph_ms(lambda: native(op, xs, attrs, y))
            t_eager = graph_ms(lambda: eager(*xs))
            comp = torch.compile(eager)
            t_comp = graph_ms(lambda: comp(*xs))
            bw = nbytes / t_native / 1e6
            rows.append(f"| {op} | {shape} | {str(dtype)[6:]} | {t_native:.3f} | {bw:.0f} ({100 * bw / copy_bw:.0f}%) | {t_eager:.3f} | {t_comp:.3f} |")
    print("| op | shape | dtype | deployfuse ms | GB/s (of copy) | eager ms | torch.compile ms |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))


def bench_mha():
    """FusedMHA against PyTorch SDPA (flash backend; its own choice where a mask is given) on the
    same [B, S, H·D] tensors viewed as [B, H, S, D]; TFLOP/s counts 4·b·h·sq·sk·d, halved for causal."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    print("| FusedMHA | dtype | deployfuse ms | TFLOP/s | SDPA ms | TFLOP/s | deployfuse / SDPA |")
    print("|---|---|---|---|---|---|---|")
    cases = [(8, sq, 16, 64, torch.float16, {}) for sq in (128, 512, 1024, 2048)] + [
        (8, 2048, 16, 64, torch.float16, {"causal": 1}), (8, 2048, 16, 64, torch.bfloat16, {}),
        (8, 2048, 16, 128, torch.float16, {}), (8, 2048, 16, 128, torch.float16, {"causal": 1}),
        (8, 1024, 16, 64, torch.float16, {"mask": True}), (8, 1024, 16, 64, torch.float16, {"mask": "qk"}),
    ]
    for b, sq, h, d, dtype, extra in cases:
        attrs = {"num_heads": h, **extra}
        xs = inputs("FusedMHA", (b, sq, sq, h * d), dtype, attrs)
        a = {k: v for k, v in attrs.items() if k != "mask"}
        y = torch.empty_like(xs[0])
        q4, k4, v4 = (t.view(b, sq, h, d).transpose(1, 2) for t in xs[:3])
        backend = contextlib.nullcontext if xs[3] is not None else lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)

        def sdpa():
            with backend():
                return F.scaled_dot_product_attention(q4, k4, v4, attn_mask=xs[3], is_causal=bool(a.get("causal")))

        t_native = graph_ms(lambda: native("FusedMHA", xs, a, y))
        t_sdpa = graph_ms(sdpa)
        flops = 4 * b * h * sq * sq * d / (2 if a.get("causal") else 1)
        mask_name = {True: " mask [b,1,1,k]", "qk": " mask [q,k]"}.get(attrs.get("mask"), "")
        name = f"({b}, {sq}, {h}x{d}){' causal' if a.get('causal') else ''}{mask_name}"
        print(f"| {name} | {str(dtype)[6:]} | {t_native:.3f} | {flops / t_native / 1e9:.0f} | {t_sdpa:.3f} | {flops / t_sdpa / 1e9:.0f} | {t_native / t_sdpa:.2f}x |")


def bench_mha_ort(ort_lib):
    """The issue's yardstick: FusedMHA through ONNX Runtime (the custom-op library's kernel)
    against ORT's own com.microsoft.MultiHeadAttention, fp16, same device tensors. Both sessions
    replay a CUDA graph on PyTorch's stream (user_compute_stream), timed by CUDA events around
    20 back-to-back runs, so host launch cost is mostly hidden."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from deployfuse.ops.models import example_inputs, single_op_model

    torch_stream = torch.cuda.current_stream()
    cuda = {"enable_cuda_graph": "1", "user_compute_stream": str(torch_stream.cuda_stream), "has_user_compute_stream": "1"}

    def timed_session(model, with_lib, tensors, out):
        options = ort.SessionOptions()
        if with_lib:
            options.register_custom_ops_library(ort_lib)
        sess = None
        for graph in ("1", "0"):  # a CUDA graph where ORT can capture the node, else plain launches
            try:
                sess = ort.InferenceSession(model.SerializeToString(), options, providers=[("CUDAExecutionProvider", {**cuda, "enable_cuda_graph": graph})])
                binding = sess.io_binding()
                for meta, t in zip(sess.get_inputs(), tensors):
                    binding.bind_input(meta.name, "cuda", 0, np.float16, tuple(t.shape), t.data_ptr())
                binding.bind_output(sess.get_outputs()[0].name, "cuda", 0, np.float16, tuple(out.shape), out.data_ptr())
                for _ in range(3):
                    sess.run_with_iobinding(binding)
                torch.cuda.synchronize()
                break
            except Exception as exc:
                print(f"  ({'CUDA graph' if graph == '1' else 'session'} refused: {str(exc).splitlines()[0][:160]})")
                sess = None
        if sess is None:
            raise RuntimeError("ORT could not run the attention model")

        def twenty():
            for _ in range(20):
                sess.run_with_iobinding(binding)

        return median_ms(twenty, 10) / 20

    print("| attention via ORT CUDA EP | ORT MultiHeadAttention ms | deployfuse FusedMHA ms | FusedMHA / MHA |")
    print("|---|---|---|---|")
    for b, sq, h, d in [(8, 128, 16, 64), (8, 512, 16, 64), (8, 1024, 16, 64), (8, 2048, 16, 64), (8, 2048, 16, 128)]:
        xs = inputs("FusedMHA", (b, sq, sq, h * d), torch.float16, {"num_heads": h})
        q, k, v = xs[:3]
        hidden = h * d
        io = [helper.make_tensor_value_info(n, TensorProto.FLOAT16, ["b", "s", hidden]) for n in ("query", "key", "value", "y")]
        mha = helper.make_model(helper.make_graph([helper.make_node("MultiHeadAttention", ["query", "key", "value"], ["y"], domain="com.microsoft", num_heads=h)],
                                                  "mha", io[:3], io[3:]), opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)],
                                ir_version=10)
        fused = single_op_model("FusedMHA", example_inputs("FusedMHA", (1, 4, 4, hidden), np.float16), num_heads=h)
        del fused.functions[:]  # only the library's kernel can run the node
        y_mha, y_ours = torch.empty_like(q), torch.empty_like(q)
        t_mha = timed_session(mha, False, (q, k, v), y_mha)
        t_ours = timed_session(fused, True, (q, k, v), y_ours)
        diff = (y_ours.float() - y_mha.float()).abs().max().item()
        print(f"| ({b}, {sq}, {h}x{d}) fp16 | {t_mha:.3f} | {t_ours:.3f} | {t_ours / t_mha:.2f}x (max diff {diff:.1e}) |")


def time_only():
    """GPU ms of the library's kernels on the benchmark shapes (no checks, no baselines): the
    other side of an A/B run against another build."""
    for op, shape, attrs in BENCH_SHAPES:
        if not wanted(op):
            continue
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            xs = inputs(op, shape, dtype, attrs)
            y = torch.empty_like(xs[0])
            print(f"time {op} {shape} {str(dtype)[6:]} {graph_ms(lambda: native(op, xs, attrs, y)):.4f} ms")
    for sq, extra in ((1024, {}), (1024, {"mask": True}), (2048, {})) if wanted("FusedMHA") else ():
        attrs = {"num_heads": 16, **extra}
        xs = inputs("FusedMHA", (8, sq, sq, 1024), torch.float16, attrs)
        y = torch.empty_like(xs[0])
        a = {k: v for k, v in attrs.items() if k != "mask"}
        print(f"time FusedMHA (8, {sq}, 16x64){' mask' if extra else ''} float16 {graph_ms(lambda: native('FusedMHA', xs, a, y)):.4f} ms")


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), torch.__version__)
    if ARGS.time_only:
        time_only()
        sys.exit(0)
    worst = check()
    print(f"worst error / tolerance: {worst:.2f}")
    if ARGS.ort:  # onnxruntime-gpu is importable with its CUDA provider
        worst = max(worst, ort_check(ARGS.ort))
        print(f"worst error / tolerance incl. ORT CUDA EP: {worst:.2f}")
    if not ARGS.check_only:
        bench()
        if wanted("FusedMHA"):
            bench_mha()
            if ARGS.ort:
                bench_mha_ort(ARGS.ort)
    sys.exit(0 if worst < 1 else 1)
