"""The cuBLASLt algorithm of GemmAct and Fp8GemmAct nodes chosen by measurement on the target GPU (`--autotune`, ort-cuda).

cuBLASLt's heuristic ranks its candidate kernels (tile shapes, split-K, ...) per problem, and its
first choice is not the fastest for every shape: on the H200 the fastest candidate ran GPT-2's
64x128-token projections up to 1.3x faster (bench/results/gemm_act_h200.md), and BERT-sized fp8
GEMMs with fast accumulation up to ~15 % faster (bench/results/h200_quant.md). So each node's
problem at the export shapes (one problem type per op: `GemmProblem`, `Fp8GemmProblem`) is timed on
this machine's GPU, every candidate in interleaved rounds of CUDA-graph replays, through the
deployfuse CUDA library's C ABI on torch tensors; the fastest index is stored in the node's `algo`
attribute when it beats the heuristic's own choice by more than `MARGIN` (else the node is left as
it is: -1, the heuristic's choice, which also follows a different GPU). `algo` picks a kernel, never
the math (the ops' docstrings). Fp8Mlp has no `algo`: its two GEMMs keep the heuristic's choice.
"""

from __future__ import annotations

import ctypes
import math
import statistics
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import onnx
from onnx import helper

from deployfuse.ops.schema import DOMAIN

MARGIN = 0.03
"""A candidate must be this much faster than the heuristic's choice (single timings move by up to ~10 %; medians of interleaved rounds far less)."""
ACT_CODES = {"none": 0, "relu": 1, "gelu_tanh": 3}
"""GemmAct's activations as the C ABI's `act` codes (plugins/common/activation.h `Act`)."""
_DTYPES: dict[int, int] = {onnx.TensorProto.FLOAT: 0, onnx.TensorProto.FLOAT16: 1, onnx.TensorProto.BFLOAT16: 2}
WORKSPACE_BYTES = 32 << 20
"""The most workspace a GemmAct algorithm may ask for (plugins/gemm_act/gemm_act.cuh `kGemmActWorkspaceBytes`)."""

Launch = Callable[[int], None]
"""One launch of a problem on the current CUDA stream with candidate `algo` (-1: the heuristic's choice)."""


def _attr(node: onnx.NodeProto, name: str, default: Any) -> Any:
    for a in node.attribute:
        if a.name == name:
            value = helper.get_attribute_value(a)
            return value.decode() if isinstance(value, bytes) else value
    return default


def _torch_dtype(elem: int) -> Any:
    import torch

    return {0: torch.float32, 1: torch.float16, 2: torch.bfloat16}[_DTYPES[elem]]


@dataclass(frozen=True)
class _Gemm:
    """What every tuned problem has: Y[m, n] from X[m, k] in `dtype` (ONNX element type), then `activation`."""

    m: int
    n: int
    k: int
    dtype: int
    activation: str


@dataclass(frozen=True)
class GemmProblem(_Gemm):
    """One GemmAct launch: Y[m, n] = act(X[m, k] W[k, n] + b [+ R]) in `dtype`."""

    residual: bool

    op_type: ClassVar[str] = "GemmAct"
    weight_input: ClassVar[int] = 1

    @classmethod
    def of(cls, node: onnx.NodeProto, x_dims: list[int], x_elem: int, weight: tuple[list[int], int]) -> GemmProblem | None:
        """`node`'s problem with X of `x_dims` and its initializer weight (dims [K, N], element type); None where it has none."""
        (k, n), elem = weight
        if not x_dims or x_dims[-1] != k or elem not in _DTYPES:
            return None
        return cls(math.prod(x_dims[:-1]), n, k, elem, _attr(node, "activation", "none"), len(node.input) > 3 and bool(node.input[3]))

    def launcher(self, lib: ctypes.CDLL) -> tuple[int, Launch]:
        """The candidate count and the launch (df_gemm_act) on inputs made on the current CUDA device."""
        import torch

        dtype, code, act = _torch_dtype(self.dtype), _DTYPES[self.dtype], ACT_CODES[self.activation]
        x = torch.randn(self.m, self.k, device="cuda").to(dtype)
        w = (torch.randn(self.k, self.n, device="cuda") / self.k**0.5).to(dtype)
        bias = torch.randn(self.n, device="cuda").to(dtype)
        y = torch.empty(self.m, self.n, device="cuda", dtype=dtype)
        residual = torch.randn_like(y) if self.residual else None
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")

        def ptrs() -> list[int | None]:  # the closure keeps the tensors alive as long as the launch
            return [t.data_ptr() if t is not None else None for t in (x, w, bias, residual, y)]

        def launch(algo: int) -> None:
            err = lib.df_gemm_act(code, torch.cuda.current_stream().cuda_stream, *ptrs(), self.m, self.n, self.k, act, algo, workspace.data_ptr(),
                                  WORKSPACE_BYTES)
            if err:
                raise RuntimeError(f"df_gemm_act: CUDA error {err} for {self}, algo {algo}")

        return lib.df_gemm_act_candidates(code, *ptrs(), self.m, self.n, self.k, act), launch


@dataclass(frozen=True)
class Fp8GemmProblem(_Gemm):
    """One Fp8GemmAct launch as the ORT adapter runs it: X[m, k] in `dtype` quantized to float8 by
    the op's own pass, then Y[m, n] = act(dq(X) dq(W)^T + b) by cuBLASLt's fp8 GEMM with
    `fast_accum`. Float32 nodes have none: ONNX Runtime's CUDA EP leaves them to the CPU kernel."""

    fast_accum: int

    op_type: ClassVar[str] = "Fp8GemmAct"
    weight_input: ClassVar[int] = 2

    @classmethod
    def of(cls, node: onnx.NodeProto, x_dims: list[int], x_elem: int, weight: tuple[list[int], int]) -> Fp8GemmProblem | None:
        """`node`'s problem with X of `x_dims` in `x_elem` and its float8 initializer weight (dims [N, K]); None where it has none."""
        (n, k), elem = weight
        if not x_dims or x_dims[-1] != k or elem != onnx.TensorProto.FLOAT8E4M3FN or x_elem not in (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16):
            return None
        return cls(math.prod(x_dims[:-1]), n, k, x_elem, _attr(node, "activation", "none"), int(_attr(node, "fast_accum", 1)))

    def launcher(self, lib: ctypes.CDLL) -> tuple[int, Launch]:
        """The candidate count and the launch (df_fp8_gemm_act: quantize pass + fp8 GEMM) on inputs made on the current CUDA
        device as the op's example_inputs makes them: float8 W and float32 scales, the largest |X| saturating."""
        import torch

        from deployfuse.ops.defs.fp8_gemm_act import SPEC

        dtype, code, act = _torch_dtype(self.dtype), _DTYPES[self.dtype], ACT_CODES[self.activation]

        def rand(*shape: int, scale: float = 1.0, shift: float = 0.0) -> Any:  # the spec's RandFn, in torch on the GPU
            return torch.randn(*shape, device="cuda") * scale + shift

        example: list[Any] = SPEC.example_fn((self.m, self.k, self.n), rand, {})  # torch tensors from `rand`
        x, x_scale, w, w_scale, bias = example
        x, bias = x.to(dtype), bias.to(dtype)
        y = torch.empty(self.m, self.n, device="cuda", dtype=dtype)
        scratch_bytes = lib.df_fp8_gemm_act_scratch_bytes(code, self.m, self.n, self.k)
        scratch = torch.empty(scratch_bytes, dtype=torch.uint8, device="cuda")
        fast = self.fast_accum

        def launch(algo: int) -> None:
            err = lib.df_fp8_gemm_act(code, torch.cuda.current_stream().cuda_stream, x.data_ptr(), x_scale.data_ptr(), w.data_ptr(), w_scale.data_ptr(),
                                      bias.data_ptr(), y.data_ptr(), self.m, self.n, self.k, act, algo, fast, scratch.data_ptr(), scratch_bytes)
            if err:
                raise RuntimeError(f"df_fp8_gemm_act: CUDA error {err} for {self}, algo {algo}")

        count = lib.df_fp8_gemm_act_candidates(code, x_scale.data_ptr(), w.data_ptr(), w_scale.data_ptr(), bias.data_ptr(), y.data_ptr(),
                                               self.m, self.n, self.k, act, fast)
        return count, launch


Problem = GemmProblem | Fp8GemmProblem
PROBLEM_TYPES: dict[str, type[GemmProblem] | type[Fp8GemmProblem]] = {t.op_type: t for t in (GemmProblem, Fp8GemmProblem)}
"""The tuned ops (deployfuse domain) by op type."""


@dataclass(frozen=True)
class AlgoChoice:
    """What tuning found for one problem: the stored `algo` and the GPU ms per call behind it."""

    algo: int
    heuristic_ms: float
    best_ms: float
    candidates: int


def gemm_problems(model: onnx.ModelProto, feed: Mapping[str, np.ndarray]) -> dict[str, Problem]:
    """GemmAct and Fp8GemmAct node (by its output's name) -> its problem on these inputs (the export's example).

    The X shapes come from one run of the model on ONNX Runtime's CPU EP (function bodies): shape
    inference cannot see through com.microsoft ops. Nodes whose weight is not an initializer, or
    that no CUDA kernel runs, are left out (they keep the heuristic's choice)."""
    from deployfuse.backends.ort import run, session

    weights = {t.name: (list(t.dims), t.data_type) for t in model.graph.initializer}
    nodes = [n for n in model.graph.node if n.domain == DOMAIN and n.op_type in PROBLEM_TYPES
             and len(n.input) > PROBLEM_TYPES[n.op_type].weight_input + 1 and n.input[PROBLEM_TYPES[n.op_type].weight_input] in weights]
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.output[:]
    wanted = list(dict.fromkeys(n.input[0] for n in nodes))
    probe.graph.output.extend(helper.make_empty_tensor_value_info(name) for name in wanted)
    values = run(session(probe, optimize=False), feed) if wanted else {}
    out: dict[str, Problem] = {}
    for node in nodes:
        kind = PROBLEM_TYPES[node.op_type]
        x = values[node.input[0]]
        problem = kind.of(node, list(x.shape), helper.np_dtype_to_tensor_dtype(x.dtype), weights[node.input[kind.weight_input]])
        if problem is not None:
            out[node.output[0]] = problem
    return out


def load_library(library: Path | str) -> ctypes.CDLL:
    """The CUDA library (libdeployfuse_ops_cuda.so) with its GemmAct and Fp8GemmAct C ABI entries declared."""
    lib = ctypes.CDLL(str(library))
    p, i64, c_int, size = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_size_t
    lib.df_gemm_act.argtypes = [c_int, p, p, p, p, p, p, i64, i64, i64, c_int, c_int, p, size]
    lib.df_gemm_act_candidates.argtypes = [c_int, p, p, p, p, p, i64, i64, i64, c_int]
    lib.df_fp8_gemm_act.argtypes = [c_int, p, p, p, p, p, p, p, i64, i64, i64, c_int, c_int, c_int, p, size]
    lib.df_fp8_gemm_act_candidates.argtypes = [c_int, p, p, p, p, p, i64, i64, i64, c_int, c_int]
    lib.df_fp8_gemm_act_scratch_bytes.argtypes = [c_int, i64, i64, i64]
    lib.df_fp8_gemm_act_scratch_bytes.restype = size
    return lib


def time_candidates(library: Path, problem: Problem, rounds: int = 5, calls: int = 20) -> AlgoChoice:
    """Every heuristic candidate of `problem` on the current CUDA device: median GPU ms per call
    over `rounds` interleaved rounds, each a CUDA-graph replay of `calls` launches."""
    import torch

    count, launch = problem.launcher(load_library(library))
    if count <= 0:
        raise RuntimeError(f"cuBLASLt has no algorithm for {problem} (code {count})")
    graphs = []
    for algo in range(count):
        launch(algo)  # the plan exists before capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                launch(algo)
        graphs.append(graph)
    times: list[list[float]] = [[] for _ in range(count)]
    for _ in range(rounds):
        for algo, graph in enumerate(graphs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            graph.replay()  # warm
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times[algo].append(start.elapsed_time(end) / calls)
    medians = [statistics.median(t) for t in times]
    best = int(np.argmin(medians))
    keep = best != 0 and medians[best] < medians[0] * (1 - MARGIN)
    return AlgoChoice(best if keep else -1, medians[0], medians[best], count)


def tune_gemm_algos(model: onnx.ModelProto, feed: Mapping[str, np.ndarray], library: Path) -> dict[str, AlgoChoice]:
    """Set the `algo` of each GemmAct and Fp8GemmAct node (in place) to its problem's fastest candidate on this GPU
    where that beats the heuristic's choice (the others are left as they are); returns node output -> the choice.
    Each distinct problem is timed once."""
    problems = gemm_problems(model, feed)
    choices = {problem: time_candidates(library, problem) for problem in set(problems.values())}
    by_node = {name: choices[problem] for name, problem in problems.items()}
    store_algos(model, by_node)
    return by_node


def store_algos(model: onnx.ModelProto, choices: Mapping[str, AlgoChoice]) -> int:
    """Write each choice that left the heuristic (`algo` >= 0) into its node (by output name), in place; the
    other nodes stay as they are. Returns how many nodes were written."""
    written = 0
    for node in model.graph.node:
        if node.output and node.output[0] in choices and (algo := choices[node.output[0]].algo) >= 0:
            kept = [a for a in node.attribute if a.name != "algo"]
            del node.attribute[:]
            node.attribute.extend([*kept, helper.make_attribute("algo", algo)])
            written += 1
    return written


def not_tunable(library: Path) -> str | None:
    """Why this machine cannot time cuBLASLt candidates with `library` (libdeployfuse_ops_cuda.so), or None when it can."""
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device (each node keeps the heuristic's choice)"
    if not library.is_file():
        return f"{library} is not built (`deployfuse plugins build` with nvcc and TensorRT headers)"
    return None


def tune(model: onnx.ModelProto, feed: Mapping[str, np.ndarray], library: Path | None = None) -> str:
    """`tune_gemm_algos` on this machine's GPU with the built CUDA library (default: the one
    `deployfuse plugins build` makes) when both exist; one line saying what it did."""
    ops = Counter(n.op_type for n in model.graph.node if n.domain == DOMAIN)
    names = " and ".join(op for op in PROBLEM_TYPES if ops[op])
    untuned = f"; {ops['Fp8Mlp']} Fp8Mlp keep the heuristic's choice (no algo attribute)" if ops["Fp8Mlp"] else ""
    if not names:
        return f"no {' or '.join(PROBLEM_TYPES)} node{untuned}"
    import torch

    from deployfuse.ops.native import BUILD

    library = library or BUILD / "cuda" / "libdeployfuse_ops_cuda.so"
    why = not_tunable(library)
    if why is not None:
        return f"{names} algorithms not tuned: {why}{untuned}"
    choices = tune_gemm_algos(model, feed, library)
    op_of = {n.output[0]: n.op_type for n in model.graph.node if n.output}
    by_op = {op: [c for name, c in choices.items() if op_of[name] == op] for op in PROBLEM_TYPES}
    counts = ", ".join(f"{op} {sum(c.algo >= 0 for c in cs)} of {len(cs)}" for op, cs in by_op.items() if cs)
    gain = sum(c.heuristic_ms - c.best_ms for c in choices.values() if c.algo >= 0)
    return f"{names} algorithms tuned on {torch.cuda.get_device_name()}: {counts or 'no'} nodes off the heuristic's choice ({gain * 1e3:.1f} us per run saved){untuned}"
