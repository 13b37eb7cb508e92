"""GPU check and benchmark of the deployfuse CUDA kernels (run on a CUDA machine by gpu_ops.sh).

Correctness: every registered op (deployfuse/ops/specs.py) in fp32/fp16/bf16 over the cases of
tests/ops/cases.py (CASES, every variant; GPU_CASES, the shapes of each kernel path), inputs
from the op's example_inputs, outputs poisoned with NaN before each launch, compared by
||out - ref|| / ||ref|| against the spec's PyTorch reference computed in float64. The kernels
run through the library's generic C ABI (df_run: the op's TensorRT adapter), so a new op needs
no change here. Speed: GPU time per call from CUDA-graph replays against a device copy of the
same bytes, PyTorch eager (the spec's reference) and torch.compile of it.

    python bench/ops_gpu.py LIB.so [--ort libdeployfuse_ort.so] [--only FusedMHA,BiasAct]
    python bench/ops_gpu.py OTHER_LIB.so --time-only      # the benchmark shapes only, for A/B runs
    DEPLOYFUSE_MHA_TILE=narrow python bench/ops_gpu.py LIB.so --mha-tiles   # FusedMHA's Hopper CTA shapes, one at a time
    python bench/ops_gpu.py --dry-run                     # no GPU: list the checks, build their inputs on the CPU
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import importlib.util
import itertools
import math
import sys
import zlib
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from deployfuse.ops.schema import TF32_TOLERANCE, to_element_type  # noqa: E402
from deployfuse.ops.specs import SPECS  # noqa: E402

# tests/ops/cases.py by path: no `tests` package needs to be importable on the GPU machine.
_cases_spec = importlib.util.spec_from_file_location("deployfuse_op_cases", ROOT / "tests/ops/cases.py")
_cases = importlib.util.module_from_spec(_cases_spec)
_cases_spec.loader.exec_module(_cases)
CHECKS = _cases.CASES + _cases.GPU_CASES

DT = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
INPUT_KEYS = ("mask", "mask_inf", "mask_layout", "misalign", "outputs")  # case keys that describe the inputs, not op attributes


class MhaShape(ctypes.Structure):
    _fields_ = [("batch", ctypes.c_int64), ("q_seq", ctypes.c_int64), ("k_seq", ctypes.c_int64), ("heads", ctypes.c_int64),
                ("head_dim", ctypes.c_int64), ("scale", ctypes.c_float), ("causal", ctypes.c_bool), ("mask_stride", ctypes.c_int64 * 4),
                ("q_ld", ctypes.c_int64), ("k_ld", ctypes.c_int64), ("v_ld", ctypes.c_int64)]  # plugins/common/mha_shape.h


PARSER = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="Exit status: 0 when every check is within tolerance, 1 otherwise, 2 for bad arguments.")
PARSER.add_argument("lib", nargs="?", help="libdeployfuse_ops_cuda.so (plugins/build/gpu, built by bench/gpu_ops.sh)")
PARSER.add_argument("--ort", metavar="LIB", help="libdeployfuse_ort.so: also check and time the ops through ORT's CUDA EP")
PARSER.add_argument("--time-only", action="store_true", help="GPU ms of the benchmark shapes only (the other side of an A/B run)")
PARSER.add_argument("--mha-tiles", action="store_true", help="FusedMHA's GPU ms at the models' attention shapes, DEPLOYFUSE_MHA_TILE's CTA shape (unset: the launcher's; SDPA)")
PARSER.add_argument("--only", metavar="OPS", help="comma-separated op names to check and benchmark (default: all)")
PARSER.add_argument("--check-only", action="store_true", help="no benchmarks (e.g. under compute-sanitizer)")
PARSER.add_argument("--max-size", type=int, metavar="N", help="only the check cases whose shape's product (FusedMHA: b*sq*sk*hidden, its work) is at most N")
PARSER.add_argument("--dry-run", action="store_true", help="no GPU, no library: list the checks and build each one's inputs on the CPU (attributes checked against the spec)")
ARGS = PARSER.parse_args()
ONLY = set(ARGS.only.split(",")) if ARGS.only else None
if ONLY and ONLY - set(SPECS):
    PARSER.error(f"--only names unknown ops {sorted(ONLY - set(SPECS))}; registered: {', '.join(SPECS)}")
if not ARGS.lib and not ARGS.dry_run:
    PARSER.error("give the library (plugins/build/gpu/libdeployfuse_ops_cuda.so) or --dry-run")
DEVICE = "meta" if ARGS.dry_run else "cuda"  # a dry run builds shapes only


def wanted(op):
    """Checked here: asked for, and behind the C ABI's df_run (an op's TensorRT adapter; an op with
    trt_plugin=False has its own GPU check, e.g. Fp8GemmAct's bench/fp8_gemm_gpu.sh)."""
    return (ONLY is None or op in ONLY) and SPECS[op].trt_plugin


lib = None
if ARGS.lib:
    lib = ctypes.CDLL(ARGS.lib)
    P, I64 = ctypes.c_void_p, ctypes.c_int64
    lib.df_run.argtypes = [ctypes.c_char_p, ctypes.c_int, P, ctypes.c_int, ctypes.POINTER(P), ctypes.POINTER(ctypes.POINTER(I64)),
                           ctypes.POINTER(ctypes.c_int), P, ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_char_p)]
    lib.df_last_error.restype = ctypes.c_char_p
    lib.df_fused_mha.argtypes = [ctypes.c_int, P, P, P, P, P, P, ctypes.POINTER(MhaShape), P, P]


def ptr(t):
    return None if t is None else ctypes.c_void_p(t.data_ptr())


def stream():
    return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)


def op_attrs(attrs):
    """The case's op attributes (its other keys describe the inputs)."""
    return {k: v for k, v in attrs.items() if k not in INPUT_KEYS}


def native(op, xs, attrs, y):
    """y = op(xs) by the library: df_run with the attributes resolved in the spec's order; a
    non-contiguous input (FusedMHA's strided masks, which no runtime passes) and FusedMHA's
    packed_qkv (which its TensorRT adapter refuses; ORT's adapter reads it so) through df_fused_mha."""
    spec = SPECS[op]
    resolved = spec.resolve(**op_attrs(attrs))
    tensors = [t for t in xs if t is not None]
    if not all(t.is_contiguous() for t in tensors) or resolved.get("packed_qkv"):
        assert op == "FusedMHA", f"{op}: only FusedMHA has an entry for strided inputs"
        return native_mha_direct(xs, resolved, y)
    n = len(tensors)
    dims = [(ctypes.c_int64 * t.dim())(*t.shape) for t in tensors]
    numbers = [0.0 if spec.attrs[k].kind == "string" else float(v) for k, v in resolved.items()]
    texts = [str(v).encode() if spec.attrs[k].kind == "string" else None for k, v in resolved.items()]
    rc = lib.df_run(op.encode(), DT[tensors[0].dtype], stream(), n, (ctypes.c_void_p * n)(*[t.data_ptr() for t in tensors]),
                    (ctypes.POINTER(ctypes.c_int64) * n)(*[ctypes.cast(d, ctypes.POINTER(ctypes.c_int64)) for d in dims]),
                    (ctypes.c_int * n)(*[t.dim() for t in tensors]), ptr(y), (ctypes.c_double * len(numbers))(*numbers),
                    (ctypes.c_char_p * len(texts))(*texts))
    assert rc == 0, f"{op}: df_run returned {rc}: {lib.df_last_error().decode() or 'CUDA error'}"


def native_mha_direct(xs, attrs, y, yq=None):
    """FusedMHA through df_fused_mha with an explicit MhaShape: the mask's element strides (any
    layout) and, packed_qkv, Q, K, V rows 3·hidden apart at element offsets 0, hidden, 2·hidden of
    their inputs (as plugins/fused_mha/fused_mha.h's FusedMHAAttrs::qkv hands them over). yq (uint8):
    YQ too, from YScale (xs[4]); y may then be None."""
    q, k, v, mask = xs[:4]
    y_scale = xs[4] if len(xs) > 4 else None
    heads, packed = attrs["num_heads"], bool(attrs.get("packed_qkv"))
    hidden = q.shape[2] // 3 if packed else q.shape[2]
    hd = hidden // heads
    strides = [0, 0, 0, 0]
    if mask is not None:
        m4 = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape)) if mask.dim() < 4 else mask
        strides = [0 if m4.shape[i] == 1 else m4.stride(i) for i in range(4)]
    ld = q.shape[2]  # elements between tokens: hidden, or 3·hidden packed
    s = MhaShape(q.shape[0], q.shape[1], k.shape[1], heads, hd, attrs["scale"] or 1 / math.sqrt(hd), bool(attrs["causal"]), (ctypes.c_int64 * 4)(*strides),
                 ld, ld, ld)
    third = [ctypes.c_void_p(t.data_ptr() + (i * hidden * t.element_size() if packed else 0)) for i, t in enumerate((q, k, v))]
    rc = lib.df_fused_mha(DT[q.dtype], stream(), *third, ptr(mask), ptr(y), ctypes.byref(s), ptr(y_scale if yq is not None else None), ptr(yq))
    assert rc == 0, f"FusedMHA: CUDA error {rc}"


def output(op, xs, attrs):
    """An uninitialised output of the shape the spec's reference gives (computed on the meta device)."""
    meta = SPECS[op].reference_fn(*[None if t is None else t.to("meta") for t in xs], **SPECS[op].resolve(**op_attrs(attrs)))
    return torch.empty(meta.shape, dtype=xs[0].dtype, device=xs[0].device)


def inputs(op, shape, dtype, attrs):
    """The op's example inputs (deployfuse/ops/defs/<op>.py) as tensors of `dtype` on the device;
    FusedMHA's mask from mha_mask (mask kinds, -inf entries and layouts beyond the example's)."""

    def rand(*s, scale=1.0, shift=0.0):
        t = (torch.randn(*s, device=DEVICE) * scale + shift).to(dtype)
        if attrs.get("misalign"):  # storage one element off 16-byte alignment: the scalar paths
            t = torch.cat([t.new_zeros(1), t.flatten()])[1:].view(t.shape)
        return t

    extra = {k: v for k, v in attrs.items() if k != "mask"} if op == "FusedMHA" else attrs
    xs = SPECS[op].example_fn(shape, rand, extra)
    if op == "FusedMHA":
        b, sq, sk, _ = shape
        xs[3] = mha_mask(b, attrs["num_heads"], sq, sk, dtype, attrs)
    return xs


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
    m = torch.randn(*shape, device=DEVICE)
    if attrs.get("mask_inf"):
        m[torch.rand_like(m) < attrs["mask_inf"]] = float("-inf")
        if "q" in dims:
            m[..., 0, :] = float("-inf")
    m = m.to(dtype)
    layout = attrs.get("mask_layout")
    if layout:
        nan = float("nan")
        if layout == "pad":
            view = torch.full((*m.shape[:-1], (m.shape[-1] + 15) // 8 * 8), nan, dtype=dtype, device=DEVICE)[..., :m.shape[-1]]
        elif layout == "offset":
            view = torch.full((m.numel() + 1,), nan, dtype=dtype, device=DEVICE)[1:].view(m.shape)
        else:
            assert layout == "kstride", layout
            view = torch.full((*m.shape, 2), nan, dtype=dtype, device=DEVICE)[..., 0]
        view.copy_(m)
        m = view
    return m



def check():
    for op in SPECS:
        if not SPECS[op].trt_plugin and (ONLY is None or op in ONLY):
            print(f"skip {op}: no TensorRT adapter behind df_run (trt_plugin=False); its own GPU check runs it (Fp8GemmAct: bench/fp8_gemm_gpu.sh)")
    worst = 0.0
    for op, shape, attrs in CHECKS:
        if not wanted(op) or (ARGS.max_size and math.prod(shape) > ARGS.max_size):
            continue
        for dtype in DT:
            torch.manual_seed(zlib.crc32(repr((op, shape, str(dtype))).encode()))  # hash() of str varies per process
            xs = inputs(op, shape, dtype, attrs)
            a = op_attrs(attrs)
            y = output(op, xs, a).fill_(float("nan"))
            if ARGS.dry_run:
                print(f"dry-run {op:13} {str(shape):22} {str(dtype):15} {[None if t is None else tuple(t.shape) for t in xs]} -> {tuple(y.shape)} {attrs}")
                continue
            native(op, xs, a, y)
            torch.cuda.synchronize()
            ref = SPECS[op].reference_fn(*[None if t is None else t.double() for t in xs], **SPECS[op].resolve(**a))
            if attrs.get("mask_inf"):  # fully masked rows: NaN in the reference, 0 by the kernels' contract
                ref = torch.nan_to_num(ref, nan=0.0)
            assert not torch.isnan(y).any(), f"{op} {shape} {dtype}: unwritten/NaN outputs"
            rel = ((y.double() - ref).norm() / max(ref.norm().item(), 1e-30)).item()  # relu of 3 negatives: ref is 0
            tol = TF32_TOLERANCE if dtype == torch.float32 and SPECS[op].tf32 else TOL[dtype]
            status = "ok" if rel < tol else "FAIL"
            worst = max(worst, rel / tol)
            shown = {**a, **{k: attrs[k] for k in INPUT_KEYS if k in attrs}}
            print(f"check {status:4} {op:13} {str(shape):22} {str(dtype):15} rel_err={rel:.2e} {shown}")
    return worst


def check_yq():
    """FusedMHA's YQ form (tests/ops/cases.py YQ_CASES and GPU_YQ_CASES) through df_fused_mha in fp32/fp16/bf16, each case
    with Y written and without: Y within the tolerance of the float64 reference, and YQ bit for bit q(Y, YScale) =
    e4m3(Y / YScale) of the Y the kernel wrote (torch's correctly rounded division, round-to-nearest-even saturating
    float8); the call without Y writes the same bytes. YQ is poisoned with 0x7F (e4m3's NaN, which saturation never writes).
    Each case twice: with its YScale (the kernels divide) and with YScale rounded up to a power of two, as deployfuse calibrates
    activation scales (they multiply by 1 / YScale: common/e4m3_divisor.cuh)."""
    worst = 0.0
    if not wanted("FusedMHA"):
        return worst
    spec = SPECS["FusedMHA"]
    for _, shape, attrs in _cases.YQ_CASES + _cases.GPU_YQ_CASES:
        if ARGS.max_size and math.prod(shape) > ARGS.max_size:
            continue
        for dtype, pow2 in itertools.product(DT, (False, True)):
            torch.manual_seed(zlib.crc32(repr(("FusedMHA-yq", shape, str(dtype))).encode()))
            xs = inputs("FusedMHA", shape, dtype, attrs)
            if pow2:
                xs[4] = torch.exp2(torch.ceil(torch.log2(xs[4])))
            a = spec.resolve(**op_attrs(attrs))
            y = output("FusedMHA", xs, a).fill_(float("nan"))
            assert xs[4] is not None and xs[4].dtype == torch.float32, "a YQ case gives YScale (float32)"
            if ARGS.dry_run:
                print(f"dry-run-yq FusedMHA {str(shape):22} {str(dtype):15} {[None if t is None else tuple(t.shape) for t in xs]} -> {tuple(y.shape)} {attrs}")
                continue
            yq = torch.full(y.shape, 0x7F, dtype=torch.uint8, device=DEVICE)
            yq_alone = torch.full_like(yq, 0x7F)
            native_mha_direct(xs, a, y, yq)
            native_mha_direct(xs, a, None, yq_alone)
            torch.cuda.synchronize()
            ref = spec.reference_fn(*[None if t is None else t.double() for t in xs], **a)
            rel = ((y.double() - ref).norm() / ref.norm()).item()
            requantized = to_element_type(y.float().cpu() / xs[4].cpu(), "float8e4m3fn").view(torch.uint8)
            flips, alone = (yq.cpu() != requantized).sum().item(), (yq_alone != yq).sum().item()
            good = rel < TOL[dtype] and flips == 0 and alone == 0 and not torch.isnan(y).any()
            # a NaN rel (Y left unwritten) compares False with anything, so max() would skip it: it counts as a failure
            worst = max(worst, rel / TOL[dtype], 0.0 if flips == alone == 0 and not math.isnan(rel) else math.inf)
            print(f"check-yq {'ok' if good else 'FAIL':4} FusedMHA {str(shape):22} {str(dtype):15} rel_err={rel:.2e} yq_mismatches={flips} "
                  f"yq_without_y_mismatches={alone} {attrs}{' YScale a power of two' if pow2 else ''}")
    return worst


def ort_check(ort_lib):
    """Every op through ONNX Runtime's CUDA EP (fp32, fp16) over tests/ops/cases.py's CASES: the
    native kernels of the custom-op library (function bodies removed, so nothing else can run the
    node) and, without the library, the ONNX function bodies; both against the float64
    reference, fresh inputs each time."""
    import numpy as np
    import onnxruntime as ort

    from deployfuse.ops.models import example_inputs, single_op_model

    worst = 0.0
    for op, shape, attrs in _cases.CASES:
        if not wanted(op):
            continue
        for dtype, tol in ((np.float32, TF32_TOLERANCE if SPECS[op].tf32 else 1e-5), (np.float16, 2e-3)):
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


def ort_check_yq(ort_lib):
    """FusedMHA's YQ form through ONNX Runtime's CUDA EP and the library's adapter (fused_mha_ort.h: the absent Mask named
    "", Y optional) in fp32 and fp16, each YQ case with Y and without: YQ bit for bit q(Y, YScale) of the Y the session
    wrote, the same bytes without Y, Y within the tolerance of the float64 reference."""
    import numpy as np
    import onnxruntime as ort

    from deployfuse.ops.models import example_inputs, ort_feed, single_op_model

    worst = 0.0
    if not wanted("FusedMHA"):
        return worst
    spec = SPECS["FusedMHA"]
    options = ort.SessionOptions()
    options.register_custom_ops_library(ort_lib)
    for _, shape, attrs in _cases.YQ_CASES + _cases.GPU_YQ_CASES:
        if not isinstance(attrs.get("mask", False), bool):
            continue  # a strided / broadcast mask kind only df_fused_mha takes
        for dtype, tol in ((np.float32, 1e-5), (np.float16, 2e-3)):
            a = {k: v for k, v in attrs.items() if k not in INPUT_KEYS}
            xs = example_inputs("FusedMHA", shape, dtype, **attrs)
            got = {}
            for outputs in ({"Y": 1 if dtype == np.float32 else 10, "YQ": 17}, {"YQ": 17}):  # ONNX element types
                model = single_op_model("FusedMHA", xs, outputs=outputs, **a)
                del model.functions[:]
                sess = ort.InferenceSession(model.SerializeToString(), options, providers=[("CUDAExecutionProvider", {"use_tf32": "0"})])
                got[len(outputs)] = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, ort_feed("FusedMHA", xs))))
            y, yq, yq_alone = got[2]["Y"], got[2]["YQ"].view(np.uint8), got[1]["YQ"].view(np.uint8)
            ref = spec.reference_fn(*[None if x is None else torch.from_numpy(x).double() for x in xs], **spec.resolve(**a))
            rel = ((torch.from_numpy(y.astype(np.float64)) - ref).norm() / ref.norm()).item()
            requantized = to_element_type(torch.from_numpy(y).float() / torch.from_numpy(xs[4]), "float8e4m3fn").view(torch.uint8).numpy()
            flips, alone = int((yq != requantized).sum()), int((yq_alone != yq).sum())
            worst = max(worst, rel / tol, 0.0 if flips == alone == 0 and not math.isnan(rel) else math.inf)  # NaN: as in check_yq
            print(f"ort-cuda-yq {'ok' if rel < tol and flips == alone == 0 else 'FAIL':4} FusedMHA {str(shape):18} {np.dtype(dtype).name:8} "
                  f"rel_err={rel:.2e} yq_mismatches={flips} yq_without_y_mismatches={alone} {attrs}")
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
    big = torch.empty(2 * 2**30, dtype=torch.uint8, device=DEVICE)
    dst = torch.empty_like(big)
    copy_ms = median_ms(functools.partial(dst.copy_, big), 20)  # ~1 ms a copy: launch cost is noise; a captured copy ran slower
    copy_bw = 2 * big.numel() / copy_ms / 1e6
    del big, dst
    print(f"copy bandwidth {copy_bw:.0f} GB/s (read+write, 2 GiB)")
    for op, shape, attrs in BENCH_SHAPES:
        if not wanted(op):
            continue
        eager = functools.partial(SPECS[op].reference_fn, **SPECS[op].resolve(**op_attrs(attrs)))  # the math in PyTorch eager, in the input dtype
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            xs = inputs(op, shape, dtype, attrs)
            y = output(op, xs, attrs)
            nbytes = 2 * xs[0].numel() * xs[0].element_size()
            t_native = graph_ms(lambda: native(op, xs, attrs, y))
            t_eager = graph_ms(lambda: eager(*xs))
            torch._dynamo.reset()  # a fresh compile each time: the partials share one frame, whose recompile limit (8) would leave later ones eager
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


PACKED_SHAPES = [(8, 128, 12, 64, True), (64, 128, 12, 64, True), (64, 128, 12, 64, False), (8, 512, 16, 128, False)]  # (b, s, heads, head_dim, [b,1,1,s] mask)


def bench_mha_packed():
    """FusedMHA on a packed QKV [B, S, 3·hidden] (packed_qkv=1: Q, K, V read in place, rows 3·hidden
    apart) against what an fp8 export ran before packed_mha: a Split into three contiguous
    [B, S, hidden] copies (here three copy kernels; ONNX Runtime's Split is one kernel writing
    three outputs), then FusedMHA on them. fp16, GPU ms per call from CUDA-graph replays."""
    print("| packed QKV (b, s, heads x head_dim) | Split ms | FusedMHA ms | Split + FusedMHA ms | packed FusedMHA ms | packed / (Split + FusedMHA) |")
    print("|---|---|---|---|---|---|")
    for b, sq, h, d, masked in PACKED_SHAPES:
        attrs = {"num_heads": h, "packed_qkv": 1, "mask": masked}
        xs = inputs("FusedMHA", (b, sq, sq, h * d), torch.float16, attrs)
        qkv, mask, hidden = xs[0], xs[3], h * d
        packed_attrs, plain_attrs = {"num_heads": h, "packed_qkv": 1}, {"num_heads": h}
        parts = [torch.empty(b, sq, hidden, dtype=qkv.dtype, device=qkv.device) for _ in range(3)]
        y_packed, y_split = (torch.empty(b, sq, hidden, dtype=qkv.dtype, device=qkv.device) for _ in range(2))

        def split():
            for i, part in enumerate(parts):
                part.copy_(qkv[..., i * hidden : (i + 1) * hidden])

        def split_then_mha():
            split()
            native("FusedMHA", [*parts, mask], plain_attrs, y_split)

        t_split = graph_ms(split)
        t_mha = graph_ms(lambda: native("FusedMHA", [*parts, mask], plain_attrs, y_split))
        t_both = graph_ms(split_then_mha)
        t_packed = graph_ms(lambda: native("FusedMHA", [qkv, qkv, qkv, mask], packed_attrs, y_packed))
        diff = (y_packed.float() - y_split.float()).abs().max().item()
        name = f"({b}, {sq}, {h}x{d}){' mask [b,1,1,k]' if masked else ''}"
        print(f"| {name} | {t_split:.4f} | {t_mha:.4f} | {t_both:.4f} | {t_packed:.4f} | {t_packed / t_both:.2f}x (max diff {diff:.1e}) |")


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

    # What packed_mha changes in an fp8 export: ORT's Split into Q, K, V then FusedMHA, against
    # FusedMHA reading the packed tensor in place (the library's kernels both).
    print("| packed QKV via ORT CUDA EP | Split + FusedMHA ms | FusedMHA packed_qkv ms | packed / split |")
    print("|---|---|---|---|")
    for b, sq, h, d, masked in PACKED_SHAPES:
        hidden = h * d
        xs = inputs("FusedMHA", (b, sq, sq, hidden), torch.float16, {"num_heads": h, "packed_qkv": 1, "mask": masked})
        qkv, mask = xs[0], xs[3]
        shapes = [np.zeros((1, 4, 3 * hidden), np.float16)] * 3 + [None if mask is None else np.zeros((1, 1, 1, 4), np.float16)]
        packed = single_op_model("FusedMHA", shapes, num_heads=h, packed_qkv=1)
        split = single_op_model("FusedMHA", [np.zeros((1, 4, hidden), np.float16)] * 3 + shapes[3:], num_heads=h)
        for model in (packed, split):
            del model.functions[:]  # only the library's kernel can run the node
            graph = model.graph
            kept = [vi for vi in graph.input if vi.name == "Mask"]
            del graph.input[:]
            graph.input.extend([helper.make_tensor_value_info("QKV", TensorProto.FLOAT16, ["b", "s", 3 * hidden]), *kept])
        packed.graph.node[0].input[:3] = ["QKV"] * 3
        split.graph.initializer.append(helper.make_tensor("qkv_sizes", TensorProto.INT64, [3], [hidden] * 3))
        split.graph.node.insert(0, helper.make_node("Split", ["QKV", "qkv_sizes"], ["Q", "K", "V"], axis=-1))
        feeds = [qkv] + ([] if mask is None else [mask])
        y_packed, y_split = (torch.empty(b, sq, hidden, dtype=qkv.dtype, device=qkv.device) for _ in range(2))
        t_split = timed_session(split, True, feeds, y_split)
        t_packed = timed_session(packed, True, feeds, y_packed)
        diff = (y_packed.float() - y_split.float()).abs().max().item()
        print(f"| ({b}, {sq}, {h}x{d}){' mask [b,1,1,k]' if masked else ''} fp16 | {t_split:.3f} | {t_packed:.3f} | {t_packed / t_split:.2f}x (max diff {diff:.1e}) |")


def time_only():
    """GPU ms of the library's kernels on the benchmark shapes (no checks, no baselines): the
    other side of an A/B run against another build."""
    for op, shape, attrs in BENCH_SHAPES:
        if not wanted(op):
            continue
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            xs = inputs(op, shape, dtype, attrs)
            y = output(op, xs, attrs)
            print(f"time {op} {shape} {str(dtype)[6:]} {graph_ms(lambda: native(op, xs, attrs, y)):.4f} ms")
    for sq, extra in ((1024, {}), (1024, {"mask": True}), (2048, {})) if wanted("FusedMHA") else ():
        attrs = {"num_heads": 16, **extra}
        xs = inputs("FusedMHA", (8, sq, sq, 1024), torch.float16, attrs)
        y = torch.empty_like(xs[0])
        a = {k: v for k, v in attrs.items() if k != "mask"}
        print(f"time FusedMHA (8, {sq}, 16x64){' mask' if extra else ''} float16 {graph_ms(lambda: native('FusedMHA', xs, a, y)):.4f} ms")


MHA_TILE_SHAPES = [  # (b, s, heads, head_dim, attrs): BERT's and GPT-2's 128 tokens, ViT's 197, longer sequences
    (8, 128, 12, 64, {"mask": True}), (64, 128, 12, 64, {"mask": True}), (8, 128, 12, 64, {"causal": 1}), (64, 128, 12, 64, {"causal": 1}),
    (8, 197, 12, 64, {}), (64, 197, 12, 64, {}), (8, 512, 16, 64, {}), (8, 2048, 16, 64, {}), (8, 2048, 16, 64, {"causal": 1}),
]


def time_mha_tiles():
    """FusedMHA (fp16, packed QKV as the fp8 exports run it) at MHA_TILE_SHAPES under DEPLOYFUSE_MHA_TILE; without it, the launcher's own
    choice and PyTorch SDPA (flash backend where no mask is given) on the same tensors. DEPLOYFUSE_MHA_PERSISTENT=0 (label -1item): a
    CTA a work item instead of the persistent CTAs. Each shape is timed writing Y (fp16) and writing YQ alone (float8, as the fp8
    artefacts run it): ViT-B/16's attention took 0.878 ms a call of 12 in the fp8 artefact against 0.666 in the fp16 one on an H100,
    the same kernel instance (bench/results/h200_quant.md section 9)."""
    import os

    from torch.nn.attention import SDPBackend, sdpa_kernel

    tile = os.environ.get("DEPLOYFUSE_MHA_TILE", "auto") + ("-1item" if os.environ.get("DEPLOYFUSE_MHA_PERSISTENT") == "0" else "")
    for b, sq, h, d, extra in MHA_TILE_SHAPES:
        attrs = {"num_heads": h, "packed_qkv": 1, **extra}
        xs = inputs("FusedMHA", (b, sq, sq, h * d), torch.float16, attrs)
        a = {k: v for k, v in attrs.items() if k != "mask"}
        y = torch.empty(b, sq, h * d, dtype=torch.float16, device=DEVICE)
        name = f"({b}, {sq}, {h}x{d}){' causal' if extra.get('causal') else ''}{' mask [b,1,1,k]' if extra.get('mask') else ''}"
        packed = [xs[0], xs[0], xs[0], xs[3]]
        yq, y_scale = torch.empty(y.shape, dtype=torch.uint8, device=DEVICE), torch.tensor([0.05], device=DEVICE)
        resolved = SPECS["FusedMHA"].resolve(**a)
        yq_ms = graph_ms(lambda: native_mha_direct([*packed, y_scale], resolved, None, yq))
        line = f"mha-tile {tile} {name} {graph_ms(lambda: native('FusedMHA', packed, a, y)):.4f} ms (YQ alone {yq_ms:.4f} ms)"
        if tile == "auto":  # SDPA once, beside the launcher's persistent CTAs
            q4, k4, v4 = (xs[0].view(b, sq, 3, h, d)[:, :, i].transpose(1, 2) for i in range(3))
            backend = contextlib.nullcontext if xs[3] is not None else lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)

            def sdpa():
                with backend():
                    return F.scaled_dot_product_attention(q4, k4, v4, attn_mask=xs[3], is_causal=bool(a.get("causal")))

            line += f" (SDPA {graph_ms(sdpa):.4f} ms)"
        print(line)


if __name__ == "__main__":
    if ARGS.dry_run:
        check()
        check_yq()
        print(f"dry run: {sum(wanted(op) for op, _, _ in CHECKS)} check cases of {sum(map(wanted, SPECS))} ops, inputs built")
        sys.exit(0)
    print(torch.cuda.get_device_name(), torch.__version__)
    if ARGS.time_only:
        time_only()
        sys.exit(0)
    if ARGS.mha_tiles:
        time_mha_tiles()
        sys.exit(0)
    worst = max(check(), check_yq())
    print(f"worst error / tolerance: {worst:.2f}")
    if ARGS.ort:  # onnxruntime-gpu is importable with its CUDA provider
        worst = max(worst, ort_check(ARGS.ort), ort_check_yq(ARGS.ort))
        print(f"worst error / tolerance incl. ORT CUDA EP: {worst:.2f}")
    if not ARGS.check_only:
        bench()
        if wanted("FusedMHA"):
            bench_mha()
            bench_mha_packed()
            if ARGS.ort:
                bench_mha_ort(ARGS.ort)
    sys.exit(0 if worst < 1 else 1)
