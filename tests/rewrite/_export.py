"""Export zoo models for the rewrite tests with either exporter, cached per process.

The rules must fuse what both exporters emit: the dynamo exporter already writes
LayerNormalization and Gelu, the TorchScript exporter writes decomposed forms.
"""

from __future__ import annotations

import functools
import io
import warnings

import numpy as np
import onnx
import torch
from _models import BLOCKS
from zoo import ZOO

from deployfuse.export import clean, flatten_outputs

EXPORTERS = ("dynamo", "torchscript")


def build(name: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """A zoo model or one of the rewrite tests' own blocks, by name."""
    return ZOO[name].build() if name in ZOO else BLOCKS[name]()


def _axes(name: str) -> dict[str, dict[int, str]]:
    if name not in ZOO:
        return {"x": {0: "batch"}}
    axes: dict[str, dict[int, str]] = {}
    for d in ZOO[name].dynamic:
        axes.setdefault(d.name, {})[d.axis] = d.label
    return axes


class _Positional(torch.nn.Module):
    """Calls the wrapped module with keyword inputs and returns its outputs as a flat tuple:
    the TorchScript tracer passes inputs positionally, which transformers 5 forwards reject."""

    def __init__(self, module: torch.nn.Module, names: list[str]) -> None:
        super().__init__()
        self.module, self.names = module, names

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(flatten_outputs(self.module(**dict(zip(self.names, tensors)))).values())


def _trained_like(module: torch.nn.Module) -> None:
    """Give constant-initialised tensors (zero biases, unit norm weights, BatchNorm statistics)
    random values, as trained weights have: a rule that dropped a zero bias would pass otherwise."""
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            if tensor.is_floating_point() and tensor.numel() and bool((tensor == tensor.flatten()[0]).all()):
                tensor.add_(torch.rand_like(tensor) * 0.2 if bool((tensor > 0).all()) else torch.randn_like(tensor) * 0.1)


@functools.cache
def exported(name: str, exporter: str, opset: int = 18) -> onnx.ModelProto:
    """Zoo model `name` exported by `exporter` ("dynamo" / "torchscript") and cleaned as the
    pipeline cleans it. Callers must not modify the returned proto (copy it)."""
    torch.manual_seed(0)
    module, inputs = build(name)
    _trained_like(module)
    names = list(inputs)
    with warnings.catch_warnings(), torch.inference_mode(False):
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            axes = _axes(name)
            shapes = {n: {a: torch.export.Dim.AUTO for a in axes.get(n, {})} or None for n in names}
            program = torch.onnx.export(module, (), kwargs=dict(inputs), dynamo=True, dynamic_shapes=shapes, opset_version=opset, optimize=True, verbose=False)
            model = program.model_proto
        else:
            buffer = io.BytesIO()
            torch.onnx.export(_Positional(module, names), tuple(inputs.values()), buffer, dynamo=False, input_names=names, dynamic_axes=_axes(name) or None,
                              opset_version=opset, do_constant_folding=True)
            model = onnx.load_from_string(buffer.getvalue())
    return clean(model)


def feeds(name: str, model: onnx.ModelProto, count: int = 2, seed: int = 1) -> list[dict[str, np.ndarray]]:
    """`count` fresh random input dicts shaped like the zoo example (ids within the vocabulary)."""
    rng = np.random.default_rng(seed)
    _, example = build(name)
    wanted = {i.name for i in model.graph.input}
    out = []
    for _ in range(count):
        feed = {}
        for key, value in example.items():
            if key not in wanted:
                continue
            v = value.numpy()
            if key == "attention_mask":
                feed[key] = np.ones_like(v)
            elif np.issubdtype(v.dtype, np.integer):
                feed[key] = rng.integers(0, max(int(v.max()) + 1, 2), size=v.shape, dtype=v.dtype)
            else:
                feed[key] = rng.standard_normal(v.shape).astype(v.dtype)
        out.append(feed)
    return out


@functools.cache
def fused(name: str, exporter: str, target: str, opset: int = 18) -> tuple[onnx.ModelProto, dict[str, int], tuple[str, ...]]:
    """`fuse` applied to an export, cached: (fused model, kept counts per rule, rolled-back
    families with reasons). Callers must not modify the model."""
    from deployfuse.rewrite import fuse

    model = exported(name, exporter, opset)
    out, report = fuse(model, target, feeds(name, model, seed=1))
    rolled = tuple(f"{f.family}: {f.reason}" for f in report.families if f.rolled_back)
    return out, report.counts(), rolled


def assert_same_outputs(original: onnx.ModelProto, rewritten: onnx.ModelProto, name: str, rtol: float = 1e-4) -> None:
    """Both models on fresh random inputs (not the guard's), ORT graph optimisations off:
    every output equal within `rtol` x the output's largest magnitude."""
    from deployfuse.backends.ort import run, session

    for feed in feeds(name, original, count=1, seed=7):
        want = run(session(original, optimize=False, threads=1), feed)
        got = run(session(rewritten, optimize=False, threads=1), feed)
        assert set(want) == set(got)
        for key, ref in want.items():
            scale = max(float(np.abs(ref).max()), 1e-6)
            err = float(np.abs(got[key].astype(np.float64) - ref).max())
            assert err <= rtol * scale, f"{key}: max abs error {err:.3e} > {rtol} x {scale:.3e}"


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    """Node count per `domain::op` (plain op name for the ONNX domain)."""
    counts: dict[str, int] = {}
    for node in model.graph.node:
        key = f"{node.domain}::{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type
        counts[key] = counts.get(key, 0) + 1
    return counts


def check_case(name: str, exporter: str, target: str, expected: dict[str, int], ops: dict[str, int] | None = None, opset: int = 18, rtol: float = 1e-4) -> onnx.ModelProto:
    """Fuse one export; assert the exact rule counts in `expected`, the exact op counts in
    `ops`, no rolled-back family, and the same numbers as the unfused graph."""
    model, counts, rolled = fused(name, exporter, target, opset)
    assert not [r for r in rolled if not r.startswith(("attention", "rotary"))], rolled
    assert {k: counts.get(k, 0) for k in expected} == expected, counts
    if ops is not None:
        have = op_counts(model)
        assert {k: have.get(k, 0) for k in ops} == ops, have
    assert_same_outputs(exported(name, exporter, opset), model, name, rtol)
    return model
