"""fp8 where it is faster: an Fp8GemmAct that runs slower than the fp16/bf16 GemmAct of the same shape on this GPU goes back to
the float GEMM (`--autotune`, ort-cuda), as TensorRT keeps the faster tactic per layer when both precisions are enabled.

Why: cuBLASLt's fp8 GEMM is not faster than fp16 for small problems, and an Fp8GemmAct whose X arrives in fp16 also pays its
own quantize pass (bench/results/fp8_ceiling_h200.md, H200). Attention's output projection in BERT/GPT-2/ViT (X the attention
output, K = N = 768): at 8192 rows fp8 0.0193 ms + quantize 0.0094 ms against fp16 0.0176 ms; at 1024 rows 0.0275 + 0.0137
against 0.0222. Twelve such nodes a model are 0.13 ms of BERT-base's ~2.3 ms at batch 64, a larger share at batch 8.

Three pieces: `to_float_gemm` (a pure graph rewrite: the node becomes a GemmAct on the weights dequantized offline, the
same math less X's rounding to float8), `slower_in_fp8` (the decision on given times, `gemm_tuning.MARGIN`) and
`measure` / `choose_precision` (each distinct problem timed on the GPU with `gemm_tuning`'s timing, then the rewrite).
Only Fp8GemmAct nodes whose X is not float8 (x_fp8 = 0: they run their own quantize pass) are candidates; those reading a
SkipLayerNormFp8's YQ (or any deployfuse op's float8 YQ) are left alone: reverting one would need the norm to write Y for it too.
This runs before the algorithm tuning (`gemm_tuning.tune`), which then tunes the reverted GemmAct nodes as GemmProblems.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from deployfuse.ops.defs import fp8_gemm_act, gemm_act
from deployfuse.ops.schema import DOMAIN
from deployfuse.ops.specs import SPECS
from deployfuse.quantize.qdq import fresh_name
from deployfuse.rewrite import gemm_tuning

FP8_OP, FLOAT_OP = fp8_gemm_act.SPEC.name, gemm_act.SPEC.name


FLOAT8_OUTPUT = "YQ"
"""The name deployfuse ops give an output they write in float8e4m3fn for the fp8 GEMMs (SkipLayerNormFp8's, FusedMHA's)."""


def _float8_values(graph: onnx.GraphProto) -> set[str]:
    """The values known to be float8e4m3fn: each deployfuse node's YQ (`FLOAT8_OUTPUT`) and any graph input, initializer or
    value_info so typed."""
    yq = {value for n in graph.node if n.domain == DOMAIN and n.op_type in SPECS
          for name, value in zip(SPECS[n.op_type].outputs, n.output, strict=False) if name == FLOAT8_OUTPUT and value}
    typed = [*graph.input, *graph.value_info]
    return yq | {v.name for v in typed if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT8E4M3FN} | {
        t.name for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT8E4M3FN}


def revertible(model: onnx.ModelProto) -> list[str]:
    """The Fp8GemmAct nodes (by their output's name) `to_float_gemm` can turn into a GemmAct: X not float8 (the node runs its
    own quantize pass), W, WScale and Bias initializers (the weight is dequantized offline, its type taken from Bias's)."""
    inits = {t.name for t in model.graph.initializer}
    fp8_x = _float8_values(model.graph)
    return [n.output[0] for n in model.graph.node if n.domain == DOMAIN and n.op_type == FP8_OP and len(n.input) >= 5
            and n.input[0] not in fp8_x and {n.input[2], n.input[3], n.input[4]} <= inits]


def to_float_gemm(model: onnx.ModelProto, names: Iterable[str]) -> onnx.ModelProto:
    """A copy of `model` in which each Fp8GemmAct node of `names` (output names, from `revertible`) is the equivalent GemmAct
    in the graph's float type T (Bias's): W = float(Wq) * WScale in float32, transposed to GemmAct's [K, N], rounded to T; Bias
    and the activation carried over (an empty Bias as zeros); XScale no longer read. Y = act(X W + Bias) computed from X itself, so the node is the fp8
    one less X's rounding to float8. Initializers no node reads any more are dropped; every other node stays as it is.
    The function bodies are not attached (`ops.attach_functions`). ValueError for a name that is not revertible."""
    wanted = set(names)
    missing = wanted - set(revertible(model))
    if missing:
        raise ValueError(f"not a revertible Fp8GemmAct output (X in float8, or weights not initializers): {', '.join(sorted(missing))}")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inits = {t.name: t for t in out.graph.initializer}
    taken = {*inits, *(o for n in out.graph.node for o in n.output), *(i.name for i in out.graph.input)}
    for node in out.graph.node:
        if node.domain != DOMAIN or node.op_type != FP8_OP or node.output[0] not in wanted:
            continue
        x, _, w, w_scale, bias = node.input[:5]
        dequantized = numpy_helper.to_array(inits[w]).astype(np.float32) * numpy_helper.to_array(inits[w_scale]).astype(np.float32)
        weight = dequantized.T.astype(helper.tensor_dtype_to_np_dtype(inits[bias].data_type))
        name = fresh_name(f"{w}_{gemm_act.SPEC.name}", taken)
        out.graph.initializer.append(numpy_helper.from_array(weight, name))
        if not numpy_helper.to_array(inits[bias]).size:  # none (empty): GemmAct takes its bias always, zeros here
            zeros = np.zeros(weight.shape[1], weight.dtype)
            bias = fresh_name(f"{bias}_zeros", taken)
            out.graph.initializer.append(numpy_helper.from_array(zeros, bias))
        attrs = fp8_gemm_act.SPEC.node_attrs(node)
        replacement = helper.make_node(FLOAT_OP, [x, name, bias], list(node.output), name=node.name, domain=DOMAIN, activation=attrs["activation"])
        node.CopyFrom(replacement)
    read = {i for n in out.graph.node for i in n.input} | {o.name for o in out.graph.output}
    kept = [t for t in out.graph.initializer if t.name in read]
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept)
    return out


@dataclass(frozen=True)
class PrecisionTiming:
    """One Fp8GemmAct problem timed on the GPU: ms per call of the fp8 node (its quantize pass included) and of the GemmAct of
    the same m, k, n, type and activation, each at its best cuBLASLt setting; NaN with `error` where it could not be timed."""

    fp8_ms: float
    float_ms: float
    error: str = ""


def slower_in_fp8(timings: Mapping[str, PrecisionTiming], margin: float = gemm_tuning.MARGIN) -> list[str]:
    """The nodes (keys of `timings`) to run as float GEMMs: those whose float GemmAct is faster than the fp8 node by more than
    `margin` (the share of the fp8 time, as algorithm tuning's); untimed ones (NaN) stay fp8."""
    return [name for name, t in timings.items() if t.float_ms < t.fp8_ms * (1 - margin)]


def _setting(problem: gemm_tuning.Problem, choice: gemm_tuning.AlgoChoice) -> gemm_tuning.Setting:
    return tuple(choice.algos.get(name, -1) for name in problem.algo_attrs)


def time_problem(library: Path, fp8: gemm_tuning.Fp8GemmProblem, rounds: int = 5, calls: int = 20) -> PrecisionTiming:
    """`fp8` (quantize pass + fp8 GEMM) against the GemmProblem of the same shape, type and activation: each one's best setting
    by `gemm_tuning.time_candidates`, then the two settings timed again in the same interleaved rounds (`time_settings`), so
    that the comparison shares the GPU's state. NaN and the reason where cuBLASLt refuses either (the node then stays fp8)."""
    gemm = gemm_tuning.GemmProblem(fp8.m, fp8.n, fp8.k, fp8.dtype, fp8.activation, residual=False)
    try:
        settings = [_setting(p, gemm_tuning.time_candidates(library, p, rounds, calls)) for p in (fp8, gemm)]
        lib = gemm_tuning.load_library(library)
        launches = [p.launcher(lib)[1] for p in (fp8, gemm)]
        ms = gemm_tuning.time_settings(lambda s: launches[s[0]](s[1:]), [(i, *s) for i, s in enumerate(settings)], rounds, calls)
    except RuntimeError as exc:
        return PrecisionTiming(math.nan, math.nan, str(exc))
    fp8_ms, float_ms = ms
    return PrecisionTiming(fp8_ms, float_ms)


def measure(model: onnx.ModelProto, feed: Mapping[str, np.ndarray], library: Path) -> dict[str, PrecisionTiming]:
    """Each revertible Fp8GemmAct node (by output name) whose problem the CUDA EP runs with X in T (x_fp8 = 0) -> its timing on
    this GPU at `feed`'s shapes (`gemm_tuning.gemm_problems`); each distinct problem timed once."""
    candidates = set(revertible(model))
    problems = {name: p for name, p in gemm_tuning.gemm_problems(model, feed).items()
                if name in candidates and isinstance(p, gemm_tuning.Fp8GemmProblem) and not p.x_fp8}
    timed = {p: time_problem(library, p) for p in set(problems.values())}
    return {name: timed[p] for name, p in problems.items()}


@dataclass(frozen=True)
class SpeedPrecision:
    """What `choose_precision` did: the nodes now float GEMMs (by node name, as the gate names its layers) with their timings,
    and one line saying so."""

    reverted: dict[str, PrecisionTiming]
    line: str

    def to_dict(self) -> dict[str, object]:
        """The report's entry: the layers, each one's ms per call in fp8 (its quantize pass included) and in float, the line."""
        return {"layers": list(self.reverted), "ms": {name: {"fp8": t.fp8_ms, "float": t.float_ms} for name, t in self.reverted.items()},
                "summary": self.line}


def choose_precision(model: onnx.ModelProto, feed: Mapping[str, np.ndarray], library: Path | None = None,
                     float_name: str = "fp16") -> tuple[onnx.ModelProto, SpeedPrecision]:
    """`model` with each Fp8GemmAct that is slower than its float GemmAct on this GPU turned into that GemmAct (functions
    attached), and what was done; without a GPU or the built CUDA library (default: `deployfuse plugins build`'s) `model`
    unchanged and the line says why. `float_name` names the float type in the line (fp16 or bf16)."""
    from deployfuse.ops import attach_functions
    from deployfuse.ops.native import BUILD

    candidates = revertible(model)
    if not candidates:
        fp8 = sum(n.domain == DOMAIN and n.op_type == FP8_OP for n in model.graph.node)
        return model, SpeedPrecision({}, f"{FP8_OP} precision not timed against {float_name}: all {fp8} read a float8 X, no quantize pass to save"
                                     if fp8 else "")
    library = library or BUILD / "cuda" / "libdeployfuse_ops_cuda.so"
    why = gemm_tuning.not_tunable(library)
    if why is not None:
        return model, SpeedPrecision({}, f"{FP8_OP} precision not timed against {float_name}: {why.split(' (')[0]} (all {len(candidates)} kept in fp8)")
    timings = measure(model, feed, library)
    slower = slower_in_fp8(timings)
    reverted = {name: timings[name] for name in slower}
    failed = [t.error for t in timings.values() if t.error]
    untimed = f"; {len(failed)} not timed, kept in fp8: {failed[0]}" if failed else ""
    if not slower:
        return model, SpeedPrecision({}, f"{FP8_OP}: 0 of {len(timings)} kept in {float_name} for speed (fp8 as fast or faster){untimed}")
    shipped = to_float_gemm(model, slower)
    attach_functions(shipped)
    node_names = {n.output[0]: n.name or n.output[0] for n in model.graph.node if n.output}
    saved = sum(t.fp8_ms - t.float_ms for t in reverted.values())
    return shipped, SpeedPrecision({node_names[name]: t for name, t in reverted.items()},
                                   f"{FP8_OP}: {len(slower)} of {len(timings)} kept in {float_name} for speed, faster than fp8 with its quantize pass "
                                   f"({saved * 1e3:.1f} us per run saved: {', '.join(node_names[name] for name in slower)}){untimed}")
