"""The cuBLASLt algorithms of GemmAct, Fp8GemmAct and Fp8Mlp nodes chosen by measurement on the target GPU (`--autotune`, ort-cuda).

cuBLASLt's heuristic ranks its candidate kernels (tile shapes, split-K, ...) per problem, and its
first choice is not the fastest for every shape: on the H200 the fastest candidate ran GPT-2's
64x128-token projections up to 1.3x faster (bench/results/gemm_act_h200.md), and BERT/ViT-sized
fp8 GEMMs with full accumulation up to 9.5 % faster (bench/results/fp8_gemm_h200.log; that log did
not time fast accumulation, the exports' setting, at the heuristic's choice). So each node's
problem at the export shapes (one problem type per op: `GemmProblem`, `Fp8GemmProblem`, `Fp8MlpProblem`)
is timed on this machine's GPU in interleaved rounds of CUDA-graph replays, through the deployfuse CUDA
library's C ABI on torch tensors; the fastest setting is stored in the node's algorithm attributes
(`algo`; Fp8Mlp's two GEMMs: `algo1`, `algo2`) when it beats the heuristic's own choice by more than
`MARGIN` (else the node is left as it is: -1, the heuristic's choice, which also follows a different
GPU). An algorithm picks a kernel, never the math (the ops' docstrings).

A problem's candidates are the heuristic's (8 for these models on the H100), then up to 240 variants that
the plugin's plan adds (plugins/common/cublaslt.cuh `Plan::extend`): each heuristic candidate with other
cluster shapes and CTA swizzles, and every algorithm id with every tile and stages id cuBLASLt lists,
where cublasLtMatmulAlgoCheck accepts them (19-101 candidates a problem). On the H100, at the batch-8 GEMMs of
BERT-base, GPT-2 and ViT-B/16, the fastest candidate was a variant in 7 of 8 shapes, 2-12 % faster than the
heuristic's choice (quantize pass included), and the tuned fp8 BERT-base's GPU time was 2.7-3.5 % below the untuned
one's, against 1.4 % with the heuristic's candidates alone (bench/results/h200_quant.md, section 10). GemmAct's
candidates are counted the same way: on the H100 every one of the checked problems (up to 248) matched the float64
reference, and the fastest was a variant at 5 of 8 timed shapes, up to 4 % under the heuristic's choice (section 12).

A problem with one GEMM has every candidate timed. Fp8Mlp's two GEMMs run chained in one launch, so a
setting is a pair; rather than the cross product of their candidates (up to 16 x 16 = 256 CUDA graphs
per problem), `best_setting` times each GEMM's candidates with the other at the heuristic's choice
(c1 + c2 - 1 graphs), then, where both GEMMs found a faster one, the pair of the two against each alone
(4 more): the two GEMMs share nothing but H, so each one's best is expected to stay best beside the
other's, which stage 2 checks (the search has not run on a GPU yet).
"""

from __future__ import annotations

import ctypes
import dataclasses
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

from deployfuse.ops.schema import DOMAIN, OpSpec
from deployfuse.ops.specs import SPECS

MARGIN = 0.03
"""A candidate must be this much faster than the heuristic's choice (single timings move by up to ~10 %; medians of interleaved rounds far less)."""
ACT_CODES = {"none": 0, "relu": 1, "gelu_tanh": 3}
"""GemmAct's activations as the C ABI's `act` codes (plugins/common/activation.h `Act`)."""
_DTYPES: dict[int, int] = {onnx.TensorProto.FLOAT: 0, onnx.TensorProto.FLOAT16: 1, onnx.TensorProto.BFLOAT16: 2}
WORKSPACE_BYTES = 32 << 20
"""The most workspace a GemmAct algorithm may ask for (plugins/gemm_act/gemm_act.cuh `kGemmActWorkspaceBytes`)."""

Weight = tuple[list[int], int]
"""An initializer weight's dims and element type."""
Setting = tuple[int, ...]
"""A candidate index per GEMM of a problem, in its `algo_attrs` order (-1: the heuristic's choice)."""
Launch = Callable[[Setting], None]
"""One launch of a problem on the current CUDA stream with a setting."""


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return SPECS[node.op_type].node_attrs(node)


def _torch_dtype(elem: int) -> Any:
    import torch

    return {0: torch.float32, 1: torch.float16, 2: torch.bfloat16}[_DTYPES[elem]]


def _cuda_example(spec: OpSpec, shape: tuple[int, ...]) -> list[Any]:
    """The op's example_inputs at `shape` as torch tensors on the current CUDA device (float8 weights, float32 scales)."""
    import torch

    def rand(*dims: int, scale: float = 1.0, shift: float = 0.0) -> Any:  # the spec's RandFn, in torch on the GPU
        return torch.randn(*dims, device="cuda") * scale + shift

    return list(spec.example_fn(shape, rand, {}))


def _checked(entry: str, err: int, problem: object, setting: Setting) -> None:
    if err:
        raise RuntimeError(f"{entry}: CUDA error {err} for {problem}, setting {setting}")


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
    weight_inputs: ClassVar[tuple[int, ...]] = (1,)
    bias_input: ClassVar[int] = 2
    algo_attrs: ClassVar[tuple[str, ...]] = ("algo",)

    @classmethod
    def of(cls, node: onnx.NodeProto, x_dims: list[int], x_elem: int, weights: list[Weight]) -> GemmProblem | None:
        """`node`'s problem with X of `x_dims` and its initializer weight (dims [K, N], element type); None where it has none."""
        [((k, n), elem)] = weights
        if not x_dims or x_dims[-1] != k or elem not in _DTYPES:
            return None
        return cls(math.prod(x_dims[:-1]), n, k, elem, _attrs(node)["activation"], len(node.input) > 3 and bool(node.input[3]))

    def launcher(self, lib: ctypes.CDLL) -> tuple[tuple[int, ...], Launch]:
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

        def launch(setting: Setting) -> None:
            _checked("df_gemm_act", lib.df_gemm_act(code, torch.cuda.current_stream().cuda_stream, *ptrs(), self.m, self.n, self.k, act, *setting,
                                                    workspace.data_ptr(), WORKSPACE_BYTES), self, setting)

        return (lib.df_gemm_act_candidates(code, *ptrs(), self.m, self.n, self.k, act),), launch


@dataclass(frozen=True)
class Fp8GemmProblem(_Gemm):
    """One Fp8GemmAct launch as the ORT adapter runs it: X[m, k] in `dtype` quantized to float8 by
    the op's own pass, then Y[m, n] = act(dq(X) dq(W)^T + b) by cuBLASLt's fp8 GEMM with
    `fast_accum`. Float32 nodes have none: ONNX Runtime's CUDA EP leaves them to the CPU kernel."""

    fast_accum: int
    x_fp8: int = 0
    """1: X comes already in float8e4m3fn (a SkipLayerNormFp8's YQ): no quantize pass, as the ORT adapter then runs it."""
    bias: int = 1
    """0: the node's Bias is empty (none): cuBLASLt's epilogue adds none, another plan with its own candidates."""

    op_type: ClassVar[str] = "Fp8GemmAct"
    weight_inputs: ClassVar[tuple[int, ...]] = (2,)
    bias_input: ClassVar[int] = 4  # in T: the problem's type where X is in float8
    algo_attrs: ClassVar[tuple[str, ...]] = ("algo",)

    @classmethod
    def of(cls, node: onnx.NodeProto, x_dims: list[int], x_elem: int, weights: list[Weight]) -> Fp8GemmProblem | None:
        """`node`'s problem with X of `x_dims` in `x_elem` and its float8 initializer weight (dims [N, K]); None where it has none."""
        [((n, k), elem)] = weights
        if not x_dims or x_dims[-1] != k or not _fp8_cuda(x_elem, elem):
            return None
        return cls(math.prod(x_dims[:-1]), n, k, x_elem, _attrs(node)["activation"], int(_attrs(node)["fast_accum"]))

    def launcher(self, lib: ctypes.CDLL) -> tuple[tuple[int, ...], Launch]:
        """The candidate count and the launch (df_fp8_gemm_act: quantize pass + fp8 GEMM) on inputs made on the current CUDA
        device as the op's example_inputs makes them: float8 W and float32 scales, the largest |X| saturating."""
        import torch

        from deployfuse.ops.defs.fp8_gemm_act import SPEC

        dtype, code, act = _torch_dtype(self.dtype), _DTYPES[self.dtype], ACT_CODES[self.activation]
        x, x_scale, w, w_scale, bias = _cuda_example(SPEC, (self.m, self.k, self.n))
        x, bias = _x_operand(x, x_scale, dtype, self.x_fp8), bias.to(dtype)
        y = torch.empty(self.m, self.n, device="cuda", dtype=dtype)

        def bias_ptr() -> int | None:  # NULL: none, as the ORT adapter passes an empty Bias; the closure keeps bias alive
            return bias.data_ptr() if self.bias else None

        scratch_bytes = lib.df_fp8_gemm_act_scratch_bytes(code, self.m, self.n, self.k)
        scratch = torch.empty(scratch_bytes, dtype=torch.uint8, device="cuda")
        fast = self.fast_accum | (FP8_X_OPTION if self.x_fp8 else 0)

        def launch(setting: Setting) -> None:
            _checked("df_fp8_gemm_act", lib.df_fp8_gemm_act(code, torch.cuda.current_stream().cuda_stream, x.data_ptr(), x_scale.data_ptr(), w.data_ptr(),
                                                            w_scale.data_ptr(), bias_ptr(), y.data_ptr(), self.m, self.n, self.k, act, *setting, fast,
                                                            scratch.data_ptr(), scratch_bytes), self, setting)

        count = lib.df_fp8_gemm_act_candidates(code, x_scale.data_ptr(), w.data_ptr(), w_scale.data_ptr(), bias_ptr(), y.data_ptr(),
                                               self.m, self.n, self.k, act, self.fast_accum)
        return (count,), launch


FP8_X_OPTION = 2
"""df_fp8_gemm_act's / df_fp8_mlp's `options` bit for an X given in float8 (bit 0: fast_accum)."""


def _x_operand(x: Any, x_scale: Any, dtype: Any, x_fp8: int) -> Any:
    """The example X in `dtype`, or quantized to float8e4m3fn (q(X, XScale)) for a problem whose X comes in float8."""
    from deployfuse.ops.schema import to_element_type

    return to_element_type(x / x_scale, "float8e4m3fn") if x_fp8 else x.to(dtype)


def _fp8_cuda(x_elem: int, *weight_elems: int) -> bool:
    """Whether the CUDA EP runs a float8 op with X in `x_elem` and these weights (float32 nodes run on the CPU EP)."""
    return x_elem in (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16) and all(e == onnx.TensorProto.FLOAT8E4M3FN for e in weight_elems)


@dataclass(frozen=True)
class Fp8MlpProblem:
    """One Fp8Mlp launch as the ORT adapter runs it: X[m, k] in `dtype` quantized to float8, FC1 (k -> n1, `activation`) writing
    the hidden activation in float8, FC2 (n1 -> n2) writing Y, both cuBLASLt fp8 GEMMs with `fast_accum`; a setting is
    (FC1's candidate, FC2's)."""

    m: int
    k: int
    n1: int
    n2: int
    dtype: int
    activation: str
    fast_accum: int
    x_fp8: int = 0
    """As Fp8GemmProblem's."""
    b1: int = 1
    b2: int = 1
    """0: B1 / B2 empty (none), as Fp8GemmProblem's bias."""

    op_type: ClassVar[str] = "Fp8Mlp"
    weight_inputs: ClassVar[tuple[int, ...]] = (2, 6)
    bias_input: ClassVar[int] = 8
    algo_attrs: ClassVar[tuple[str, ...]] = ("algo1", "algo2")

    @classmethod
    def of(cls, node: onnx.NodeProto, x_dims: list[int], x_elem: int, weights: list[Weight]) -> Fp8MlpProblem | None:
        """`node`'s problem with X of `x_dims` in `x_elem` and its float8 initializer weights W1 [N1, K], W2 [N2, N1]; None where
        it has none (N1 off a multiple of 16: the CUDA kernel refuses it)."""
        [((n1, k), elem1), ((n2, n1_of_w2), elem2)] = weights
        if not x_dims or x_dims[-1] != k or n1_of_w2 != n1 or n1 % 16 or not _fp8_cuda(x_elem, elem1, elem2):
            return None
        return cls(math.prod(x_dims[:-1]), k, n1, n2, x_elem, _attrs(node)["activation"], int(_attrs(node)["fast_accum"]))

    def launcher(self, lib: ctypes.CDLL) -> tuple[tuple[int, ...], Launch]:
        """FC1's and FC2's candidate counts and the launch (df_fp8_mlp) on inputs made on the current CUDA device as the op's
        example_inputs makes them (the largest |X| and hidden values saturating)."""
        import torch

        from deployfuse.ops.defs.fp8_mlp import SPEC

        dtype, code, act = _torch_dtype(self.dtype), _DTYPES[self.dtype], ACT_CODES[self.activation]
        inputs = _cuda_example(SPEC, (self.m, self.k, self.n1, self.n2))
        inputs[0] = _x_operand(inputs[0], inputs[1], dtype, self.x_fp8)
        for i in (4, 8):  # B1, B2 in T
            inputs[i] = inputs[i].to(dtype)
        y = torch.empty(self.m, self.n2, device="cuda", dtype=dtype)
        scratch_bytes = lib.df_fp8_mlp_scratch_bytes(code, self.m, self.k, self.n1, self.n2)
        scratch = torch.empty(scratch_bytes, dtype=torch.uint8, device="cuda")
        shape, fast = (self.m, self.k, self.n1, self.n2), self.fast_accum
        options = fast | (FP8_X_OPTION if self.x_fp8 else 0)
        h_inverse = 1 / inputs[5]  # 1/HScale given, as the ORT adapter keeps it for the constant HScale an export has
        absent = {i for given, i in ((self.b1, 4), (self.b2, 8)) if not given}

        def ptrs() -> list[int | None]:  # NULL for a bias given empty, as the ORT adapter passes it; the closure keeps the tensors alive
            return [None if i in absent else t.data_ptr() for i, t in enumerate(inputs)]

        def launch(setting: Setting) -> None:
            _checked("df_fp8_mlp", lib.df_fp8_mlp(code, torch.cuda.current_stream().cuda_stream, *ptrs(), y.data_ptr(), *shape,
                                                  act, *setting, options, scratch.data_ptr(), scratch_bytes, h_inverse.data_ptr()), self, setting)

        counts = (ctypes.c_int(), ctypes.c_int())
        err = lib.df_fp8_mlp_candidates(code, *ptrs()[1:], y.data_ptr(), *shape, act, fast, *(ctypes.byref(c) for c in counts))
        return ((-err, -err) if err else (counts[0].value, counts[1].value)), launch


Problem = GemmProblem | Fp8GemmProblem | Fp8MlpProblem
PROBLEM_TYPES: dict[str, type[GemmProblem] | type[Fp8GemmProblem] | type[Fp8MlpProblem]] = {
    t.op_type: t for t in (GemmProblem, Fp8GemmProblem, Fp8MlpProblem)}
"""The tuned ops (deployfuse domain) by op type."""


@dataclass(frozen=True)
class AlgoChoice:
    """What tuning found for one problem: the attributes to store (name -> candidate index; none where the heuristic's choice
    stays), the GPU ms per call of the heuristic's setting and of the fastest one, and each GEMM's candidate count."""

    algos: Mapping[str, int]
    heuristic_ms: float
    best_ms: float
    candidates: tuple[int, ...]
    error: str = ""
    """Why the problem could not be timed (its nodes keep the heuristic's choice); empty when it was."""


def gemm_problems(model: onnx.ModelProto, feed: Mapping[str, np.ndarray]) -> dict[str, Problem]:
    """GemmAct, Fp8GemmAct and Fp8Mlp node (by its output's name) -> its problem on these inputs (the export's example).

    The X shapes come from one run of the model on ONNX Runtime's CPU EP (function bodies): shape
    inference cannot see through com.microsoft ops. Nodes whose weights are not initializers, or
    that no CUDA kernel runs, are left out (they keep the heuristic's choice)."""
    from deployfuse.backends.ort import run, session

    weights = {t.name: (list(t.dims), t.data_type) for t in model.graph.initializer}

    def tunable(node: onnx.NodeProto) -> bool:
        kind = PROBLEM_TYPES.get(node.op_type) if node.domain == DOMAIN else None
        return kind is not None and len(node.input) > max(kind.weight_inputs) + 1 and all(node.input[i] in weights for i in kind.weight_inputs)

    nodes = [n for n in model.graph.node if tunable(n)]
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
        x_elem = helper.np_dtype_to_tensor_dtype(x.dtype)
        # ORT hands a float8 X (a SkipLayerNormFp8's YQ) over as uint8: the fp8 op's problem is then in T (its bias's type), X as it is
        x_fp8 = x.dtype == np.uint8 and kind is not GemmProblem and node.input[kind.bias_input] in weights
        if x_fp8:
            x_elem = weights[node.input[kind.bias_input]][1]
        problem = kind.of(node, list(x.shape), x_elem, [weights[node.input[i]] for i in kind.weight_inputs])
        if isinstance(problem, Fp8GemmProblem | Fp8MlpProblem) and x_fp8:
            problem = dataclasses.replace(problem, x_fp8=1) if problem.k % 16 == 0 else None  # the CUDA GEMM reads X's rows as they are
        if isinstance(problem, Fp8GemmProblem):
            problem = dataclasses.replace(problem, bias=_given(weights, node.input[4]))
        elif isinstance(problem, Fp8MlpProblem):
            problem = dataclasses.replace(problem, b1=_given(weights, node.input[4]), b2=_given(weights, node.input[8]))
        if problem is not None:
            out[node.output[0]] = problem
    return out


def _given(weights: Mapping[str, Weight], bias: str) -> int:
    """1 for a bias with values, 0 for an initializer of no elements (an empty bias: none)."""
    return int(not (bias in weights and math.prod(weights[bias][0]) == 0))


def load_library(library: Path | str) -> ctypes.CDLL:
    """The CUDA library (libdeployfuse_ops_cuda.so) with its GemmAct, Fp8GemmAct and Fp8Mlp C ABI entries declared."""
    lib = ctypes.CDLL(str(library))
    p, i64, c_int, size = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_size_t
    lib.df_gemm_act.argtypes = [c_int, p, p, p, p, p, p, i64, i64, i64, c_int, c_int, p, size]
    lib.df_gemm_act_candidates.argtypes = [c_int, p, p, p, p, p, i64, i64, i64, c_int]
    lib.df_fp8_gemm_act.argtypes = [c_int, p, p, p, p, p, p, p, i64, i64, i64, c_int, c_int, c_int, p, size]
    lib.df_fp8_gemm_act_candidates.argtypes = [c_int, p, p, p, p, p, i64, i64, i64, c_int, c_int]
    lib.df_fp8_gemm_act_scratch_bytes.argtypes = [c_int, i64, i64, i64]
    lib.df_fp8_gemm_act_scratch_bytes.restype = size
    lib.df_fp8_mlp.argtypes = [c_int, p, *[p] * 10, i64, i64, i64, i64, c_int, c_int, c_int, c_int, p, size, p]
    lib.df_fp8_mlp_candidates.argtypes = [c_int, *[p] * 9, i64, i64, i64, i64, c_int, c_int, p, p]
    lib.df_fp8_mlp_scratch_bytes.argtypes = [c_int, i64, i64, i64, i64]
    lib.df_fp8_mlp_scratch_bytes.restype = size
    return lib


def time_settings(launch: Launch, settings: list[Setting], rounds: int = 5, calls: int = 20) -> list[float]:
    """Median GPU ms per call of each setting on the current CUDA device over `rounds` interleaved rounds, each a
    CUDA-graph replay of `calls` launches."""
    import torch

    graphs = []
    for setting in settings:
        launch(setting)  # the plan exists before capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                launch(setting)
        graphs.append(graph)
    times: list[list[float]] = [[] for _ in settings]
    for _ in range(rounds):
        for t, graph in zip(times, graphs, strict=True):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            graph.replay()  # warm
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            t.append(start.elapsed_time(end) / calls)
    return [statistics.median(t) for t in times]


def best_setting(counts: tuple[int, ...], time: Callable[[list[Setting]], list[float]]) -> tuple[Setting, float, float]:
    """(the fastest setting found, the heuristic's ms, its ms) for GEMMs with these candidate counts; `time` times settings
    in interleaved rounds. Stage 1: each GEMM's candidates past the heuristic's first (the same kernel as -1) with the
    others at -1, beside the all -1 setting; stage 2, where more than one GEMM found a faster candidate: those alone and
    together, timed again beside all -1 (so the compared settings share rounds). One GEMM: every candidate, once."""
    base: Setting = (-1,) * len(counts)
    singles = [base[:i] + (a,) + base[i + 1:] for i, count in enumerate(counts) for a in range(1, count)]
    ms = dict(zip([base, *singles], time([base, *singles]), strict=True))
    bests = [min((s for s in ms if all(v == -1 for j, v in enumerate(s) if j != i)), key=ms.__getitem__) for i in range(len(counts))]
    improved = [s for s in bests if s != base]
    if len(improved) > 1:
        joint = tuple(max(s[i] for s in bests) for i in range(len(counts)))  # each GEMM's best, -1 where none was faster
        ms = dict(zip([base, *improved, joint], time([base, *improved, joint]), strict=True))
    best = min(ms, key=ms.__getitem__)
    return best, ms[base], ms[best]


def time_candidates(library: Path, problem: Problem, rounds: int = 5, calls: int = 20) -> AlgoChoice:
    """`best_setting` of `problem` on the current CUDA device; its attributes where it beats the heuristic by more than MARGIN."""
    counts, launch = problem.launcher(load_library(library))
    if min(counts) <= 0:
        raise RuntimeError(f"cuBLASLt has no algorithm for {problem} (code {min(counts)})")
    best, heuristic_ms, best_ms = best_setting(counts, lambda settings: time_settings(launch, settings, rounds, calls))
    keep = best_ms < heuristic_ms * (1 - MARGIN)
    algos = {name: algo for name, algo in zip(problem.algo_attrs, best, strict=True) if keep and algo >= 0}
    return AlgoChoice(algos, heuristic_ms, best_ms, counts)


def tune_gemm_algos(model: onnx.ModelProto, feed: Mapping[str, np.ndarray], library: Path) -> dict[str, AlgoChoice]:
    """Set the algorithm attributes of each GemmAct, Fp8GemmAct and Fp8Mlp node (in place) to its problem's fastest setting on
    this GPU where that beats the heuristic's choice (the others are left as they are); returns node output -> the choice.
    Each distinct problem is timed once."""
    problems = gemm_problems(model, feed)
    choices = {problem: _timed_or_why(library, problem) for problem in set(problems.values())}
    by_node = {name: choices[problem] for name, problem in problems.items()}
    store_algos(model, by_node)
    return by_node


def _timed_or_why(library: Path, problem: Problem) -> AlgoChoice:
    """`time_candidates`, or, where cuBLASLt has no algorithm or a candidate fails on this GPU, a choice that changes nothing and
    says why: tuning is an optional speed-up, and one untimeable problem must not fail the export."""
    try:
        return time_candidates(library, problem)
    except RuntimeError as exc:
        return AlgoChoice({}, math.nan, math.nan, (), error=str(exc))


def store_algos(model: onnx.ModelProto, choices: Mapping[str, AlgoChoice]) -> int:
    """Write each choice's attributes into its node (by output name), in place, replacing those of the same name; the other
    attributes and nodes stay as they are. Returns how many nodes were written."""
    written = 0
    for node in model.graph.node:
        if node.output and node.output[0] in choices and (algos := choices[node.output[0]].algos):
            kept = [a for a in node.attribute if a.name not in algos]
            del node.attribute[:]
            node.attribute.extend([*kept, *(helper.make_attribute(name, algo) for name, algo in algos.items())])
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
    if not names:
        return f"no {' or '.join(PROBLEM_TYPES)} node"
    import torch

    from deployfuse.ops.native import BUILD

    library = library or BUILD / "cuda" / "libdeployfuse_ops_cuda.so"
    why = not_tunable(library)
    if why is not None:
        return f"{names} algorithms not tuned: {why}"
    choices = tune_gemm_algos(model, feed, library)
    op_of = {n.output[0]: n.op_type for n in model.graph.node if n.output}
    by_op = {op: [c for name, c in choices.items() if op_of[name] == op] for op in PROBLEM_TYPES}
    counts = ", ".join(f"{op} {sum(bool(c.algos) for c in cs)} of {len(cs)}" for op, cs in by_op.items() if cs)
    gain = sum(c.heuristic_ms - c.best_ms for c in choices.values() if c.algos)
    failed = [c.error for c in choices.values() if c.error]
    untimed = f"; {len(failed)} nodes not timed, kept at the heuristic's choice: {failed[0]}" if failed else ""
    return (f"{names} algorithms tuned on {torch.cuda.get_device_name()}: {counts or 'no'} nodes off the heuristic's choice "
            f"({gain * 1e3:.1f} us per run saved){untimed}")
