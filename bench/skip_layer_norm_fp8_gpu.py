"""GPU check and timing of SkipLayerNormFp8 (a skip LayerNorm writing Y, its float8 copy YQ = e4m3(Y / YScale) and the sum) and
of Fp8GemmAct / Fp8Mlp fed that float8 X (no quantize pass), run by bench/fp8_gemm_gpu.py as its stages, or alone (below).

Checks (outputs poisoned before each launch: NaN in Y and Sum, 0x7F = e4m3 NaN in YQ), fp16 and bf16 on rows 1024 and 8192: hidden
768, 776 (97 vectors: a partly idle warp), 1024 and 4096 (512 vectors), all on the one-vector kernel (a block per row, a 16-byte
vector a thread), and 771 (the element-wise fallback); on 33 rows: fp32 768, bf16 64 (8 vectors), 8192 fp16 and 8200 bf16 (1024
vectors, the one-vector kernel's largest; 1025, the 8-vector kernel), 32768 fp16 and 32776 bf16 (4096 vectors, the 8-vector
kernel's largest; 4097, the element-wise fallback), fp16 768 with a misaligned X (the fallback); fp32 37 on 3 rows. With and
without Skip; every output, YQ + Sum (GPT-2's pre-LN), YQ alone. The embedding lookups (`rules.fp8_embed`), fp16 and bf16: Ids into
a [V, H] table (a negative id, one below -V and one at V, clamped) with a Skip of 128 rows broadcast over 1024 rows (GPT-2 at batch
8: V 50257, H 768; the fallback at 771; the 8-vector kernel at 8200), Ids with a Skip of every row (BERT given token_type_ids: V
30522, at 768 and 771), Ids without Skip, and the broadcast Skip alone. Y and Sum against a float64 reference (relative L2 within T's
rounding); YQ bit for bit against e4m3(Y / YScale) of the Y the kernel wrote (q as the op and Fp8GemmAct define it, division
correctly rounded; Fp8GemmAct's CUDA pass multiplies by 1 / YScale instead) or, where Y is not written, against the launch that
writes it; dq(YQ) against the float64 Y within a float8 step.
Fp8GemmAct / Fp8Mlp with X given in float8 (df_fp8_gemm_act / df_fp8_mlp, options bit 1) against the float64 reference of the same
quantization, and K off a multiple of 16 refused (cudaErrorNotSupported). Through ONNX Runtime's CUDA EP with the library:
SkipLayerNormFp8 -> Fp8GemmAct and -> Fp8Mlp (their float8-X kernels), fp16, against the reference.

Timing (fp16, with Skip): the `sln-vs-ort` table: our kernel, GPU us per call from the profiler's kernel records (200 launches)
and ms per call from CUDA-graph replays (200 calls), against ONNX Runtime's com.microsoft.SkipLayerNormalization kernel
(profiler, 200 runs of a one-node session), at (1024, 768), (1576, 768), (8192, 768), (12608, 768), (8192, 1024): BERT / GPT-2
at batch 8 and 64, ViT-B/16 at batch 8 and 64, BERT-large. With bench/fp8_gemm_gpu.py's timings, also SkipLayerNormFp8
(Y, YQ, Sum) against the same kernel without YQ plus Fp8GemmAct's quantize pass alone (df_fp8_quantize_e4m3), and ONNX Runtime's
SkipLayerNormalization (its own CUDA graph, per run) plus that pass, at (1024, 768), (8192, 768), (8192, 1024).

    python3 bench/skip_layer_norm_fp8_gpu.py LIB [--ort ORT_LIB] [--check-only | --time-only] [--small]
"""
from __future__ import annotations

import argparse
import ctypes
import itertools
import math
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from deployfuse.ops.defs.fp8_gemm_act import quantize_e4m3  # noqa: E402
from deployfuse.ops.defs.skip_layer_norm_fp8 import table_rows  # noqa: E402
from deployfuse.ops.schema import DOMAIN, E4M3_MAX  # noqa: E402

DT = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
ONNX_TYPE = {torch.float32: onnx.TensorProto.FLOAT, torch.float16: onnx.TensorProto.FLOAT16, torch.bfloat16: onnx.TensorProto.BFLOAT16}
TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}  # relative L2 of Y, Sum: T's own rounding
TOL_YQ = 0.05  # dq(YQ) against the float64 Y: e4m3 keeps 3 mantissa bits (a step is 6-12 % of the value, rel L2 ~3 %)
EPS = 1e-5
OPTION_FP8_X = 2  # df_fp8_gemm_act / df_fp8_mlp options bit: X given in float8 (bit 0: fast accumulation)
NOT_SUPPORTED = 801  # cudaErrorNotSupported
SHAPES = ((1024, 768), (1576, 768), (8192, 768), (12608, 768), (8192, 1024))  # rows x hidden of the sln-vs-ort table
RUNS = 200  # launches (and graph-replayed calls) a timing


def declare(lib: ctypes.CDLL) -> None:
    """df_skip_layer_norm_fp8's and the quantize pass's signatures."""
    P, I64, INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.df_skip_layer_norm_fp8.argtypes = [INT, P, P, P, P, P, P, P, P, P, P, I64, I64, ctypes.c_float, P, I64, I64]
    lib.df_fp8_quantize_e4m3.argtypes = [INT, P, P, P, P, I64, I64]


class Norm:
    """One SkipLayerNormFp8 call on [rows, cols] in dtype: inputs as the spec's example makes them, the outputs, the reference.
    vocab: X a [vocab, cols] table looked up by int64 Ids [rows] (ids in [-vocab, vocab), the first two -vocab - 3 and vocab, which
    the kernel clamps); skip_rows: a Skip of that many rows, row r reading Skip[r % skip_rows] (0: rows)."""

    def __init__(self, rows: int, cols: int, dtype: torch.dtype, skip: bool, misalign: bool = False, device: str = "cuda",
                 vocab: int = 0, skip_rows: int = 0, pow2: bool = False) -> None:
        self.rows, self.cols, self.dtype = rows, cols, dtype
        self.vocab, self.skip_rows = vocab, skip_rows or rows

        def rand(*shape: int, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
            return (torch.randn(*shape, device=device) * scale + shift).to(dtype)

        self.x = rand(vocab or rows, cols, scale=2.0, shift=0.5)
        if misalign:  # storage one element off 16-byte alignment: the element-wise path
            self.x = torch.cat([self.x.new_zeros(1), self.x.flatten()])[1:].view(-1, cols)
        self.ids = None
        if vocab:
            self.ids = torch.randint(-vocab, vocab, (rows,), device=device, dtype=torch.int64)
            self.ids[:2] = torch.tensor([-vocab - 3, vocab])
        self.skip = rand(self.skip_rows, cols) if skip else None
        self.gamma, self.beta, self.bias = rand(cols, shift=1.0), rand(cols), rand(cols)
        self.y_scale = (self.gamma.float().abs().max() * (4.0 * 0.8 / E4M3_MAX)).reshape(())
        if pow2:  # as deployfuse calibrates activation scales: the kernels multiply by 1 / YScale (common/e4m3_divisor.cuh)
            self.y_scale = torch.exp2(torch.ceil(torch.log2(self.y_scale)))
        self.y = torch.empty(rows, cols, device=device, dtype=dtype)
        self.sum = torch.empty_like(self.y)
        self.yq = torch.empty(rows, cols, device=device, dtype=torch.uint8)

    def reference(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(Y, Sum) in float64."""
        x = self.x.double()
        if self.ids is not None:
            x = x[table_rows(self.ids, self.vocab)]
        skip = 0 if self.skip is None else self.skip.double().repeat(self.rows // self.skip_rows, 1)
        total = x + self.bias.double() + skip
        return F.layer_norm(total, (self.cols,), self.gamma.double(), self.beta.double(), EPS), total

    def launch(self, lib: ctypes.CDLL, outputs: tuple[str, ...] = ("Y", "YQ", "Sum")) -> int:
        ptr = {name: t.data_ptr() if name in outputs else None for name, t in (("Y", self.y), ("YQ", self.yq), ("Sum", self.sum))}
        return lib.df_skip_layer_norm_fp8(DT[self.dtype], torch.cuda.current_stream().cuda_stream, self.x.data_ptr(),
                                          None if self.skip is None else self.skip.data_ptr(), self.gamma.data_ptr(), self.beta.data_ptr(),
                                          self.bias.data_ptr(), self.y_scale.data_ptr(), ptr["Y"], ptr["YQ"], ptr["Sum"], self.rows, self.cols, EPS,
                                          None if self.ids is None else self.ids.data_ptr(), self.vocab, self.skip_rows)


def _rel_l2(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(got.double() - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-30))


def _check_norm_case(lib: ctypes.CDLL, rows: int, cols: int, dtype: torch.dtype, skip: bool, misalign: bool, vocab: int = 0,
                     skip_rows: int = 0, pow2: bool = False) -> bool:
    """One case (see the module docstring), a line."""
    n = Norm(rows, cols, dtype, skip, misalign, vocab=vocab, skip_rows=skip_rows, pow2=pow2)
    ref_y, ref_sum = n.reference()
    full: torch.Tensor | None = None
    ok, notes = True, []
    for outputs in (("Y", "YQ", "Sum"), ("YQ", "Sum"), ("YQ",)):
        n.y.fill_(float("nan"))
        n.sum.fill_(float("nan"))
        n.yq.fill_(0x7F)
        rc = n.launch(lib, outputs)
        torch.cuda.synchronize()
        if rc != 0:
            ok = False
            notes.append(f"{'+'.join(outputs)}: CUDA error {rc}")
            continue
        yq = n.yq.clone()
        if "Y" in outputs:
            err_y, err_sum = _rel_l2(n.y, ref_y), _rel_l2(n.sum, ref_sum)
            requant = quantize_e4m3(n.y, n.y_scale).to(torch.float8_e4m3fn).view(torch.uint8)  # q(Y) as Fp8GemmAct defines it
            mismatched = int((requant != yq).sum())
            err_q = _rel_l2(yq.view(torch.float8_e4m3fn).double() * n.y_scale.double(), ref_y)
            good = err_y <= TOL[dtype] and err_sum <= TOL[dtype] and mismatched == 0 and err_q <= TOL_YQ
            notes.append(f"Y {err_y:.1e} Sum {err_sum:.1e} YQ≠q(Y) {mismatched} dq(YQ) {err_q:.1e}")
            full = yq
        else:
            same = full is not None and torch.equal(yq, full)
            sum_ok = "Sum" not in outputs or _rel_l2(n.sum, ref_sum) <= TOL[dtype]
            untouched = bool(torch.isnan(n.y).all()) and ("Sum" in outputs or bool(torch.isnan(n.sum).all()))  # absent outputs unwritten
            good = same and sum_ok and untouched
            notes.append(f"{'+'.join(outputs)}: YQ {'=' if same else '≠'} full launch{'' if untouched else ', an absent output written'}")
        ok &= good
    lookups = (f" ids into {vocab}" if vocab else "") + (f" skip of {skip_rows} rows" if skip and skip_rows else "")
    lookups += f" YScale 2^{int(torch.log2(n.y_scale))}" if pow2 else ""
    print(f"{'ok  ' if ok else 'FAIL'} SkipLayerNormFp8 {rows}x{cols} {str(dtype)[6:]}{' skip' if skip else ''}{' misaligned' if misalign else ''}{lookups}: "
          + "; ".join(notes))
    return ok


def check_norm(lib: ctypes.CDLL, small: bool) -> bool:
    """Every case (see the module docstring) against the float64 reference; small: rows of at most 1024 and no hidden 4096."""
    declare(lib)  # bench/fp8_gemm_gpu.py runs this stage on its own CDLL: undeclared, ctypes masks pointers to C int, refuses epsilon
    ok = True
    for dtype, cols, rows, skip in itertools.product((torch.float16, torch.bfloat16), (768, 776, 1024, 771, 4096), (1024, 8192), (True, False)):
        if small and (rows > 1024 or cols == 4096):
            continue
        ok &= _check_norm_case(lib, rows, cols, dtype, skip, False)
    for dtype, cols, skip in ((torch.float32, 768, True), (torch.float32, 37, False), (torch.float16, 768, True), (torch.bfloat16, 64, False),
                              (torch.float16, 8192, True), (torch.bfloat16, 8200, False), (torch.float16, 32768, True), (torch.bfloat16, 32776, False)):
        ok &= _check_norm_case(lib, 3 if cols == 37 else 33, cols, dtype, skip, dtype == torch.float16 and cols == 768)
    for dtype, (cols, vocab, skip, skip_rows) in itertools.product((torch.float16, torch.bfloat16), ((768, 50257, True, 128), (771, 50257, True, 128),
                                                                                                    (8200, 1000, True, 128), (768, 50257, False, 0),
                                                                                                    (768, 0, True, 128), (768, 30522, True, 0),
                                                                                                    (771, 30522, True, 0))):
        ok &= _check_norm_case(lib, 1024, cols, dtype, skip, False, vocab, skip_rows)
    # A power-of-two YScale (every deployfuse fp8 artefact's): YQ by a multiply, still q(Y) bit for bit; each kernel path
    for dtype, cols, rows, misalign in ((torch.float16, 768, 1024, False), (torch.bfloat16, 768, 1024, False), (torch.float32, 768, 33, False),
                                        (torch.float16, 8192, 33, False), (torch.float16, 771, 1024, False), (torch.float16, 768, 33, True)):
        ok &= _check_norm_case(lib, rows, cols, dtype, True, misalign, pow2=True)
    return ok


def check_fp8_x(api: Any, problem: type, mlp_problem: type, tol: tuple[dict, dict], tol_mlp: dict) -> bool:
    """Fp8GemmAct and Fp8Mlp (bench/fp8_gemm_gpu.py's Problem / MlpProblem) with X handed over already in float8; tol: the
    relative L2 allowed with full and with fast accumulation, by dtype; tol_mlp: Fp8Mlp's, which must allow a hidden value that the
    float64 reference and the GPU round to neighbouring e4m3 values (fp8_gemm_gpu.TOL_MLP_FAST, fast accumulation's bound, though
    these Fp8Mlp runs take MlpProblem's full accumulation): on the H200 (2026-12-02) the 9 x 64 hidden layer measured rel L2 4.0e-3,
    past full accumulation's 3e-3 (bench/results/fp8_norm_checks_h200.log; read as such a flip, which the check does not count)."""
    ok = True
    for dtype, (lead, k, n, act), fast in itertools.product((torch.float16, torch.bfloat16), (((8, 128), 768, 2304, "none"), ((37,), 64, 24, "relu"),
                                                                                                ((5,), 1024, 4096, "gelu_tanh")), (0, 1)):
        p = problem(lead, k, n, act, dtype, "cuda", fast_accum=fast)
        xq = quantize_e4m3(p.x, p.x_scale).to(torch.float8_e4m3fn)  # what the op's own pass would write; the reference quantizes p.x
        rc, err, nans = p.error(lambda q, algo, xq=xq: api.run(q, algo, xq, OPTION_FP8_X))
        good = rc == 0 and nans == 0 and err <= tol[fast][dtype]
        ok &= good
        print(f"{'ok  ' if good else 'FAIL'} Fp8GemmAct float8 X {str(dtype)[6:]} X{list(lead) + [k]} N={n} {act} fast_accum={fast}: rc={rc} rel_l2={err:.2e}")
    p = problem((3,), 40, 16, "none", torch.float16, "cuda")
    rc = api.run(p, -1, quantize_e4m3(p.x, p.x_scale).to(torch.float8_e4m3fn), OPTION_FP8_X)
    ok &= rc == NOT_SUPPORTED
    print(f"{'ok  ' if rc == NOT_SUPPORTED else 'FAIL'} Fp8GemmAct float8 X with K=40 refused: rc={rc} (want {NOT_SUPPORTED})")
    for dtype, (lead, k, n1, n2, act) in itertools.product((torch.float16, torch.bfloat16), (((8, 128), 768, 3072, 768, "gelu_tanh"), ((9,), 32, 64, 24, "relu"))):
        m = mlp_problem(lead, k, n1, n2, act, dtype, "cuda")
        xq = quantize_e4m3(m.inputs[0], m.inputs[1]).to(torch.float8_e4m3fn)
        rc, err, nans = m.error(lambda q, algos, xq=xq: api.run_mlp(q, algos, xq, OPTION_FP8_X))
        good = rc == 0 and nans == 0 and err <= tol_mlp[dtype]
        ok &= good
        print(f"{'ok  ' if good else 'FAIL'} Fp8Mlp float8 X {str(dtype)[6:]} X{list(lead) + [k]} N1={n1} N2={n2} {act}: rc={rc} rel_l2={err:.2e}")
    return ok


def _tensor(name: str, t: torch.Tensor) -> onnx.TensorProto:
    if t.dtype == torch.float8_e4m3fn:
        return helper.make_tensor(name, onnx.TensorProto.FLOAT8E4M3FN, list(t.shape), t.view(torch.uint8).cpu().numpy().tobytes(), raw=True)
    if t.dtype == torch.float32:
        return numpy_helper.from_array(np.asarray(t.cpu().numpy(), np.float32), name)
    return numpy_helper.from_array(t.cpu().numpy(), name)


def norm_gemm_model(n: Norm, reader: str, weights: dict[str, torch.Tensor], act: str, n_out: int) -> onnx.ModelProto:
    """X, Skip -> SkipLayerNormFp8 (Y, YQ, Sum) -> `reader` (Fp8GemmAct or Fp8Mlp) on YQ; fp16; outputs G, Y and Sum; no function bodies."""
    inits = [_tensor(k, v) for k, v in {"gamma": n.gamma, "beta": n.beta, "bias": n.bias, "y_scale": n.y_scale, **weights}.items()]
    gemm_inputs = ["yq", "y_scale", *weights]
    nodes = [helper.make_node("SkipLayerNormFp8", ["x", "gamma", "beta", "bias", "y_scale", "skip"], ["y", "yq", "sum"], domain=DOMAIN, epsilon=EPS),
             helper.make_node(reader, gemm_inputs, ["g"], domain=DOMAIN, activation=act)]
    half = onnx.TensorProto.FLOAT16
    graph = helper.make_graph(nodes, "norm_fp8", [helper.make_tensor_value_info(name, half, [n.rows, n.cols]) for name in ("x", "skip")],
                              [helper.make_tensor_value_info("g", half, [n.rows, n_out]), helper.make_tensor_value_info("y", half, [n.rows, n.cols]),
                               helper.make_tensor_value_info("sum", half, [n.rows, n.cols])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid(DOMAIN, 1)], ir_version=10)


def _fp8_weight(n: int, k: int, device: str = "cuda") -> tuple[torch.Tensor, torch.Tensor]:
    """A random [n, k] weight (scaled by 1/sqrt(k)) in float8 and its scale amax/448, as the spec's example makes them."""
    weight = torch.randn(n, k, device=device) / math.sqrt(k)
    scale = (weight.abs().max() / E4M3_MAX).reshape(())
    return (weight / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale


def check_ort(library: str, tol: dict[str, float]) -> bool:
    """SkipLayerNormFp8 feeding Fp8GemmAct and Fp8Mlp through ONNX Runtime's CUDA EP (fp16), against the float64 reference of
    the same quantization (the GEMM on q(Y) of the Y the session returned, which is checked too)."""
    import onnxruntime as ort

    ok = True
    for reader in ("Fp8GemmAct", "Fp8Mlp"):
        n = Norm(8 * 128, 768, torch.float16, skip=True)
        k, n1, n2 = 768, 3072, 768
        w1, w1s = _fp8_weight(n1 if reader == "Fp8Mlp" else 2304, k)
        b1 = torch.randn(w1.shape[0], device="cuda").half()
        weights = {"w1": w1, "w1s": w1s, "b1": b1}
        if reader == "Fp8Mlp":
            w2, w2s = _fp8_weight(n2, n1)
            weights = {**weights, "hs": torch.tensor(8.0 / E4M3_MAX, device="cuda"), "w2": w2, "w2s": w2s, "b2": torch.randn(n2, device="cuda").half()}
        model = norm_gemm_model(n, reader, weights, "gelu_tanh", n2 if reader == "Fp8Mlp" else w1.shape[0])
        options = ort.SessionOptions()
        options.register_custom_ops_library(library)
        sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CUDAExecutionProvider"])
        assert n.skip is not None
        g, y, total = (torch.from_numpy(v).cuda() for v in sess.run(None, {"x": n.x.cpu().numpy(), "skip": n.skip.cpu().numpy()}))
        ref_y, ref_sum = n.reference()
        x_dq = quantize_e4m3(y, n.y_scale).double() * n.y_scale.double()
        ref = F.gelu(x_dq @ (w1.double() * w1s.double()).T + b1.double(), approximate="tanh")
        if reader == "Fp8Mlp":
            hs = weights["hs"].double()
            ref = (quantize_e4m3(ref, weights["hs"]).double() * hs) @ (weights["w2"].double() * weights["w2s"].double()).T + weights["b2"].double()
        errs = (_rel_l2(g, ref), _rel_l2(y, ref_y), _rel_l2(total, ref_sum))
        good = errs[0] <= tol[reader] and errs[1] <= TOL[torch.float16] and errs[2] <= TOL[torch.float16]
        ok &= good
        print(f"{'ok  ' if good else 'FAIL'} ORT CUDA EP SkipLayerNormFp8 -> {reader} (float8 X) fp16 1024x768: rel_l2 G {errs[0]:.2e} Y {errs[1]:.2e} "
              f"Sum {errs[2]:.2e}")
    return ok


def _ort_session(library: str, model: onnx.ModelProto, feeds: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor], graph: bool) -> tuple[Any, Any]:
    """A session on ONNX Runtime's CUDA EP (with its CUDA graph where `graph`) and its binding of the device tensors."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.register_custom_ops_library(library)
    provider = ("CUDAExecutionProvider", {"enable_cuda_graph": "1"} if graph else {})
    sess = ort.InferenceSession(model.SerializeToString(), options, providers=[provider])
    binding = sess.io_binding()
    for name, t in feeds.items():
        binding.bind_input(name, "cuda", 0, np.float16, tuple(t.shape), t.data_ptr())
    for name, t in outputs.items():
        binding.bind_output(name, "cuda", 0, np.float16, tuple(t.shape), t.data_ptr())
    return sess, binding


def _ort_ms(library: str, model: onnx.ModelProto, feeds: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor], runs: int = 200) -> float:
    """ms per run of a session on ONNX Runtime's CUDA EP with its CUDA graph (inputs and outputs bound on the device)."""
    sess, binding = _ort_session(library, model, feeds, outputs, graph=True)
    for _ in range(5):
        sess.run_with_iobinding(binding)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(runs):
        sess.run_with_iobinding(binding)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3 / runs


def _kernel_us(fn: Any, name: str, runs: int = RUNS) -> tuple[float, list[str]]:
    """Mean GPU us a launch of the kernels whose name holds `name` over `runs` calls of fn, and their short names, from
    bench/kernel_profile.py (CUPTI: every kernel of the process, ONNX Runtime's too)."""
    from kernel_profile import profile  # bench/, on sys.path as this file's folder or through bench/fp8_gemm_gpu.py

    batch = 100  # calls of fn a profiled call: its per-call ms (rounded to 1e-4) then keeps 0.1 % of a 1 us kernel
    kernels = [k for k in profile(lambda: [fn() for _ in range(batch)], max(runs // batch, 1))["top"] if name in k["kernel"]]
    if not kernels:
        raise RuntimeError(f"no kernel named *{name}* in the profile")
    names = {(m.group(1) if (m := re.search(r"(\w+<[^()]*>)\(", k["kernel"])) else k["kernel"][:60]) for k in kernels}
    return 1e3 * sum(k["ms"] for k in kernels) / sum(k["calls"] for k in kernels), sorted(names)


def _ort_kernel_us(library: str, rows: int, cols: int) -> tuple[float, list[str]]:
    """ONNX Runtime's SkipLayerNormalization kernel on [rows, cols] fp16 with Skip (a one-node session, no CUDA graph)."""
    n = Norm(rows, cols, torch.float16, skip=True)
    assert n.skip is not None
    sess, binding = _ort_session(library, _norm_model(n, "SkipLayerNormalization"), {"x": n.x, "skip": n.skip}, {"y": n.y, "sum": n.sum}, graph=False)
    return _kernel_us(lambda: sess.run_with_iobinding(binding), "SkipLayerNorm")


def bench_vs_ort(lib: ctypes.CDLL, library: str | None) -> None:
    """The sln-vs-ort table (see the module docstring); ONNX Runtime's column where `library` (libdeployfuse_ort.so) is given."""
    from gemm_gpu import gpu_ms  # bench/, on sys.path as this file's folder or through bench/fp8_gemm_gpu.py

    print("\nsln-vs-ort: SkipLayerNormFp8 (Y, YQ, Sum) vs ONNX Runtime's SkipLayerNormalization (Y, Sum); fp16 with Skip; us: mean kernel "
          f"time from the profiler ({RUNS} launches); ms: GPU ms per call from CUDA-graph replays ({RUNS} calls)")
    print("| sln-vs-ort rows x hidden | SkipLayerNormFp8 us | SkipLayerNormFp8 ms | ORT us | ours / ORT (us) | kernels |\n|---|---|---|---|---|---|")
    for rows, cols in SHAPES:
        try:
            n = Norm(rows, cols, torch.float16, skip=True)
            us, kernels = _kernel_us(lambda n=n: n.launch(lib), "deployfuse")
            ms = gpu_ms(lambda n=n: n.launch(lib), calls=20, replays=RUNS // 20)
        except Exception as exc:  # noqa: BLE001 (one failed row does not cost the others)
            print(f"| {rows}x{cols} | FAILED: {str(exc).splitlines()[0][:200]} |")
            continue
        ort = "- | -"  # its us, ours / its
        if library:
            try:
                ort_us, ort_kernels = _ort_kernel_us(library, rows, cols)
                ort = f"{ort_us:.2f} | {us / ort_us:.2f}"
                kernels += ort_kernels
            except Exception as exc:  # noqa: BLE001 (our columns still print)
                kernels.append(f"ORT failed: {str(exc).splitlines()[0][:120]}")
        print(f"| {rows}x{cols} | {us:.2f} | {ms:.4f} | {ort} | {', '.join(kernels)} |")


def _norm_model(n: Norm, op: str) -> onnx.ModelProto:
    """One fp16 node: com.microsoft.SkipLayerNormalization (Y, Sum) or SkipLayerNormFp8 (Y, YQ, Sum) on X, Skip."""
    inits = [_tensor(k, v) for k, v in {"gamma": n.gamma, "beta": n.beta, "bias": n.bias, "y_scale": n.y_scale}.items()]
    half, shape = onnx.TensorProto.FLOAT16, [n.rows, n.cols]
    if op == "SkipLayerNormalization":
        node = helper.make_node(op, ["x", "skip", "gamma", "beta", "bias"], ["y", "", "", "sum"], domain="com.microsoft", epsilon=EPS)
        outs = [helper.make_tensor_value_info("y", half, shape), helper.make_tensor_value_info("sum", half, shape)]
    else:  # YQ written but no graph output (a float8 output has no numpy type to bind)
        node = helper.make_node(op, ["x", "gamma", "beta", "bias", "y_scale", "skip"], ["y", "yq", "sum"], domain=DOMAIN, epsilon=EPS)
        outs = [helper.make_tensor_value_info("y", half, shape), helper.make_tensor_value_info("sum", half, shape)]
    graph = helper.make_graph([node], "norm", [helper.make_tensor_value_info(name, half, shape) for name in ("x", "skip")], outs, initializer=inits)
    imports = [helper.make_opsetid("", 20), helper.make_opsetid(DOMAIN, 1), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=imports, ir_version=10)


def bench(lib: ctypes.CDLL, library: str | None, gpu_ms: Any) -> None:
    """The timing table (see the module docstring)."""
    declare(lib)
    print("\nSkipLayerNormFp8 vs a norm + Fp8GemmAct's separate quantize pass (fp16, with Skip; kernels: GPU ms per call from CUDA-graph "
          "replays; ORT: ms per run of a one-node session with ORT's CUDA graph, launch included)")
    print("| rows x hidden | SkipLayerNormFp8 (Y, YQ, Sum) | same kernel, Y + Sum only | quantize pass alone | kernel + pass | "
          "ORT SkipLayerNormalization (session) | ORT SkipLayerNormFp8 (session) | fused / (norm + pass) |\n|---|---|---|---|---|---|---|---|")
    for rows, cols in ((1024, 768), (8192, 768), (8192, 1024)):
        try:
            n = Norm(rows, cols, torch.float16, skip=True)
            q = torch.empty(rows, cols, device="cuda", dtype=torch.uint8)
            fused = gpu_ms(lambda n=n: n.launch(lib))
            plain = gpu_ms(lambda n=n: n.launch(lib, ("Y", "Sum")))
            # the stream read at each call, as Norm.launch does: one read before capture left the graph empty (H200, 2026-12-02)
            alone = gpu_ms(lambda n=n, q=q: lib.df_fp8_quantize_e4m3(1, torch.cuda.current_stream().cuda_stream, n.y.data_ptr(), n.y_scale.data_ptr(),
                                                                   q.data_ptr(), n.rows, n.cols))
            ort_ms = ["-", "-"]
            if library:
                assert n.skip is not None
                feeds = {"x": n.x, "skip": n.skip}
                ort_ms = [f"{_ort_ms(library, _norm_model(n, 'SkipLayerNormalization'), feeds, {'y': n.y, 'sum': n.sum}):.4f}",
                          f"{_ort_ms(library, _norm_model(n, 'SkipLayerNormFp8'), feeds, {'y': n.y, 'sum': n.sum}):.4f}"]
            print(f"| {rows}x{cols} | {fused:.4f} | {plain:.4f} | {alone:.4f} | {plain + alone:.4f} | {ort_ms[0]} | {ort_ms[1]} | "
                  f"{fused / (plain + alone):.2f} |")
        except Exception as exc:  # noqa: BLE001 (one failed row does not cost the others)
            print(f"| {rows}x{cols} | FAILED: {str(exc).splitlines()[0][:200]} |")
    bench_vs_ort(lib, library)


def main() -> int:
    ap = argparse.ArgumentParser(description="SkipLayerNormFp8's CUDA kernel on the GPU: checks against the float64 reference (YQ bit for bit "
                                 "against e4m3(Y / YScale)) and its kernel time against ONNX Runtime's SkipLayerNormalization (see the "
                                 "module docstring).",
                                 epilog="Exit status: 0 when every check passes, 1 otherwise, 2 for bad arguments.")
    ap.add_argument("lib", help="libdeployfuse_ops_cuda.so (plugins/build/gpu, built by bench/gpu_build.sh)")
    ap.add_argument("--ort", metavar="LIB", help="libdeployfuse_ort.so: time ONNX Runtime's SkipLayerNormalization too (onnxruntime-gpu importable)")
    only = ap.add_mutually_exclusive_group()
    only.add_argument("--check-only", action="store_true", help="no timings")
    only.add_argument("--time-only", action="store_true", help="no checks: the sln-vs-ort table alone")
    ap.add_argument("--small", action="store_true", help="only the small checks (for compute-sanitizer)")
    args = ap.parse_args()
    if not Path(args.lib).is_file():
        ap.error(f"{args.lib}: no such file (build it with bench/gpu_build.sh)")
    lib = ctypes.CDLL(args.lib)
    declare(lib)
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    ok = args.time_only or check_norm(lib, args.small)
    if not args.check_only:
        bench_vs_ort(lib, args.ort)
    if not args.time_only:
        print("all checks passed" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
