"""GemmAct's cuBLASLt algorithm chosen by measurement on the target GPU (`--autotune`, ort-cuda).

cuBLASLt's heuristic ranks its candidate kernels (tile shapes, split-K, ...) per problem, and its
first choice is not the fastest for every shape: on the H200 the fastest candidate ran GPT-2's
64x128-token projections up to 1.3x faster (bench/results/gemm_act_h200.md). So for each GemmAct
node the problem at the export shapes (M tokens, K, N, dtype, activation, residual) is timed on
this machine's GPU, every candidate in interleaved rounds of CUDA-graph replays, through the
deployfuse CUDA library's C ABI on torch tensors; the fastest index is stored in the node's
`algo` attribute when it beats the heuristic's own choice by more than `MARGIN` (else the node
keeps -1, the heuristic's choice, which also follows a different GPU).
"""

from __future__ import annotations

import ctypes
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

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


@dataclass(frozen=True)
class GemmProblem:
    """One GemmAct launch: Y[m, n] = act(X[m, k] W[k, n] + b [+ R]) in `dtype` (ONNX element type)."""

    m: int
    n: int
    k: int
    dtype: int
    activation: str
    residual: bool


@dataclass(frozen=True)
class AlgoChoice:
    """What tuning found for one problem: the stored `algo` and the GPU ms per call behind it."""

    algo: int
    heuristic_ms: float
    best_ms: float
    candidates: int


def gemm_problems(model: onnx.ModelProto, feed: Mapping[str, np.ndarray]) -> dict[str, GemmProblem]:
    """GemmAct node (by its output's name) -> its problem on these inputs (the export's example).

    The X shapes come from one run of the model on ONNX Runtime's CPU EP (function bodies): shape
    inference cannot see through com.microsoft ops. Nodes whose weight is not an initializer are
    left out (they keep the heuristic's choice)."""
    from deployfuse.backends.ort import run, session

    weights = {t.name: (list(t.dims), t.data_type) for t in model.graph.initializer}
    nodes = [n for n in model.graph.node if n.domain == DOMAIN and n.op_type == "GemmAct" and len(n.input) >= 3 and n.input[1] in weights]
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.output[:]
    wanted = list(dict.fromkeys(n.input[0] for n in nodes))
    probe.graph.output.extend(helper.make_empty_tensor_value_info(name) for name in wanted)
    values = run(session(probe, optimize=False), feed) if wanted else {}
    out = {}
    for node in nodes:
        dims = list(values[node.input[0]].shape)
        (k, n), elem = weights[node.input[1]]
        if not dims or dims[-1] != k or elem not in _DTYPES:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        activation = attrs.get("activation", b"none")
        out[node.output[0]] = GemmProblem(math.prod(dims[:-1]), n, k, elem, activation.decode() if isinstance(activation, bytes) else activation,
                                          len(node.input) > 3 and bool(node.input[3]))
    return out


def load_library(library: Path | str) -> ctypes.CDLL:
    """The CUDA library (libdeployfuse_ops_cuda.so) with its GemmAct C ABI entries declared."""
    lib = ctypes.CDLL(str(library))
    p, i64, c_int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.df_gemm_act.argtypes = [c_int, p, p, p, p, p, p, i64, i64, i64, c_int, c_int, p, ctypes.c_size_t]
    lib.df_gemm_act_candidates.argtypes = [c_int, p, p, p, p, p, i64, i64, i64, c_int]
    return lib


def time_candidates(library: Path, problem: GemmProblem, rounds: int = 5, calls: int = 20) -> AlgoChoice:
    """Every heuristic candidate of `problem` on the current CUDA device: median GPU ms per call
    over `rounds` interleaved rounds, each a CUDA-graph replay of `calls` launches."""
    import torch

    lib = load_library(library)
    dtype = {0: torch.float32, 1: torch.float16, 2: torch.bfloat16}[_DTYPES[problem.dtype]]
    code, act = _DTYPES[problem.dtype], ACT_CODES[problem.activation]
    x = torch.randn(problem.m, problem.k, device="cuda").to(dtype)
    w = (torch.randn(problem.k, problem.n, device="cuda") / problem.k**0.5).to(dtype)
    bias = torch.randn(problem.n, device="cuda").to(dtype)
    y = torch.empty(problem.m, problem.n, device="cuda", dtype=dtype)
    residual = torch.randn_like(y) if problem.residual else None
    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    ptrs = [t.data_ptr() if t is not None else None for t in (x, w, bias, residual, y)]
    count = lib.df_gemm_act_candidates(code, *ptrs, problem.m, problem.n, problem.k, act)
    if count <= 0:
        raise RuntimeError(f"cuBLASLt has no algorithm for {problem} (code {count})")

    def launch(algo: int) -> None:
        err = lib.df_gemm_act(code, torch.cuda.current_stream().cuda_stream, *ptrs, problem.m, problem.n, problem.k, act, algo, workspace.data_ptr(), WORKSPACE_BYTES)
        if err:
            raise RuntimeError(f"df_gemm_act: CUDA error {err} for {problem}, algo {algo}")

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
    """Set each GemmAct node's `algo` (in place) to its problem's fastest candidate on this GPU;
    returns node name -> the choice. Each distinct problem is timed once."""
    problems = gemm_problems(model, feed)
    choices = {problem: time_candidates(library, problem) for problem in set(problems.values())}
    for node in model.graph.node:
        if node.op_type == "GemmAct" and node.output[0] in problems:
            kept = [a for a in node.attribute if a.name != "algo"]
            del node.attribute[:]
            node.attribute.extend([*kept, helper.make_attribute("algo", choices[problems[node.output[0]]].algo)])
    return {name: choices[problem] for name, problem in problems.items()}


def tune(model: onnx.ModelProto, feed: Mapping[str, np.ndarray], library: Path | None = None) -> str:
    """`tune_gemm_algos` on this machine's GPU with the built CUDA library (default: the one
    `deployfuse plugins build` makes) when both exist; one line saying what it did."""
    if not any(n.op_type == "GemmAct" and n.domain == DOMAIN for n in model.graph.node):
        return "no GemmAct node"
    import torch

    from deployfuse.ops.native import BUILD

    library = library or BUILD / "cuda" / "libdeployfuse_ops_cuda.so"
    if not torch.cuda.is_available():
        return "GemmAct algorithms not tuned: no CUDA device (each node keeps the heuristic's choice)"
    if not library.is_file():
        return f"GemmAct algorithms not tuned: {library} is not built (`deployfuse plugins build` with nvcc and TensorRT headers)"
    choices = tune_gemm_algos(model, feed, library)
    changed = sum(c.algo >= 0 for c in choices.values())
    gain = sum(c.heuristic_ms - c.best_ms for c in choices.values() if c.algo >= 0)
    return f"GemmAct algorithms tuned on {torch.cuda.get_device_name()}: {changed} of {len(choices)} nodes off the heuristic's choice ({gain * 1e3:.1f} us per run saved)"
