"""The export forms a user's model reaches deployfuse in, built through the product's own steps.

A form is one choice of: static or dynamic shapes, fp32 / fp16 / bf16, the dynamo or the
TorchScript exporter, and the module itself or the module wrapped in a `forward(self, *args)`
(inputs passed positionally, named by `--input`). `exported(model, form)` loads, folds, exports
and cleans a zoo model as `deployfuse export` does, once per process; `fused_ops(...)` fuses it
for a target and counts the fused ops in the result; `verify(...)` checks the fused graph
against PyTorch on fresh inputs at every shape the pipeline would verify.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass

import onnx
import torch
from _export import _trained_like
from zoo import ZOO

from deployfuse.backends import ort as ort_backend
from deployfuse.export import clean, flatten_outputs, to_onnx
from deployfuse.fold import fold_batchnorm
from deployfuse.inputs import InputSpec, Inputs, make_inputs, resized, specs_of
from deployfuse.loading import LoadedModel, given_inputs, load_model
from deployfuse.pipeline import DEFAULT_OPSET, PRECISIONS, _traceable
from deployfuse.rewrite import fuse
from deployfuse.verify import DEFAULT_RTOL, compare_outputs, to_numpy

# Ops a fusion emits (or a dynamo export already writes in fused form): the counts compared.
FUSED_OPS = frozenset({
    "LayerNormalization", "Gelu", "SimplifiedLayerNormalization", "RMSNormalization",
    "com.microsoft::Gelu", "com.microsoft::FastGelu", "com.microsoft::QuickGelu", "com.microsoft::BiasGelu",
    "com.microsoft::SkipLayerNormalization", "com.microsoft::SkipSimplifiedLayerNormalization",
    "com.microsoft::MultiHeadAttention", "com.microsoft::Attention", "com.microsoft::GroupQueryAttention",
    "com.microsoft::RotaryEmbedding", "com.microsoft::FusedConv", "com.microsoft::EmbedLayerNormalization",
    "deployfuse::LayerNormGelu", "deployfuse::GroupNormAct", "deployfuse::BiasAct", "deployfuse::FusedMHA",
})
# What each fused op covers: a form that fused a bigger op (SkipLayerNormalization) instead of
# its parts (LayerNormalization) has not lost the smaller fusion.
COVERS = {
    "com.microsoft::SkipLayerNormalization": "LayerNormalization",
    "com.microsoft::SkipSimplifiedLayerNormalization": "SimplifiedLayerNormalization",
    "deployfuse::LayerNormGelu": "LayerNormalization",
    "com.microsoft::BiasGelu": "com.microsoft::Gelu",
    "com.microsoft::EmbedLayerNormalization": "LayerNormalization",
}


@dataclass(frozen=True)
class Form:
    """One export form of a model."""

    shapes: str = "dynamic"  # or "static"
    precision: str = "fp32"  # "fp16", "bf16"
    exporter: str = "dynamo"  # or "torchscript"
    args: bool = False  # wrapped in a forward(self, *args) module

    @property
    def name(self) -> str:
        return f"{self.shapes}-{self.precision}-{self.exporter}{'-args' if self.args else ''}"


BASE = Form()
# One change from the base at a time (and static TorchScript, the other fallback form).
FP32_FORMS = (BASE, Form(shapes="static"), Form(exporter="torchscript"), Form(shapes="static", exporter="torchscript"), Form(args=True), Form(shapes="static", args=True))
SLOW_FORMS = (Form(precision="fp16"), Form(shapes="static", precision="fp16"), Form(precision="bf16"), Form(shapes="static", precision="bf16"),
              Form(exporter="torchscript", args=True))

# Forms a model cannot take, with the reason (asserted to still fail where that is checkable).
UNSUPPORTED = {
    # transformers 5's mask code calls aten::diff, which has no TorchScript ONNX symbolic
    ("gpt2", "torchscript"): "aten::diff has no TorchScript symbolic",
    ("llama", "torchscript"): "aten::diff has no TorchScript symbolic",
}


def supported(model: str, form: Form) -> bool:
    return (model, form.exporter) not in UNSUPPORTED


class Positional(torch.nn.Module):
    """A user's `forward(self, *args)` wrapper: positional tensors, the wrapped model called by
    name, its outputs as a flat tuple (as `...last_hidden_state` wrappers do)."""

    def __init__(self, module: torch.nn.Module, names: list[str]) -> None:
        super().__init__()
        self.module, self.names = module, names

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(flatten_outputs(self.module(**dict(zip(self.names, args)))).values())


@dataclass
class Exported:
    """One model in one form: the cleaned ONNX, the loaded module and its verification inputs."""

    model: onnx.ModelProto
    loaded: LoadedModel
    checks: list[Inputs]
    references: list[dict[str, torch.Tensor]]


def _run(loaded: LoadedModel, inputs: Inputs) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in flatten_outputs(loaded(inputs)).items()}


@functools.cache
def exported(model: str, form: Form) -> Exported:
    """`model` loaded, folded, exported and cleaned in `form`, as the pipeline does it."""
    torch.manual_seed(0)
    module, example = ZOO[model].build()
    _trained_like(module)
    if form.args:
        module = Positional(module, list(example))
    loaded = load_model(module)
    dtype = PRECISIONS[form.precision]
    specs = [InputSpec(s.name, s.shape, dtype if s.dtype.is_floating_point else s.dtype) for s in specs_of(example)]
    example = given_inputs(loaded, specs, seed=0)
    assert example is not None
    if dtype != torch.float32:
        loaded.module.to(dtype)
    dynamic = ZOO[model].dynamic if form.shapes == "dynamic" else ()
    shapes = [specs_of(example)] + ([resized(specs_of(example), dynamic)] if dynamic else [])
    checks = [make_inputs(s, loaded.module, seed=1 + i) for i, s in enumerate(shapes)]
    references = [_run(loaded, x) for x in checks]  # from the unfolded model: verification checks the fold
    output_names = list(_run(loaded, example))
    fold_batchnorm(loaded.module, example)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onnx_model, attempts = to_onnx(loaded, _traceable(example, dynamic), dynamic, output_names, DEFAULT_OPSET, (form.exporter,))
    return Exported(clean(onnx_model), loaded, checks, references)


@functools.cache
def fused(model: str, form: Form, target: str) -> tuple[onnx.ModelProto, tuple[str, ...]]:
    """The form fused for `target`, and the families the guard rolled back (with reasons)."""
    done = exported(model, form)
    feeds = [{k: to_numpy(v) for k, v in x.items()} for x in done.checks]
    out, report = fuse(done.model, target, feeds)
    return out, tuple(f"{f.family}: {f.reason}" for f in report.families if f.rolled_back)


def op_key(node: onnx.NodeProto) -> str:
    return f"{node.domain}::{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type


def fused_ops(model: str, form: Form, target: str) -> dict[str, int]:
    """Fused-op counts by kind in `model` exported in `form` and fused for `target`."""
    counts: dict[str, int] = {}
    for node in fused(model, form, target)[0].graph.node:
        key = op_key(node)
        if key in FUSED_OPS:
            counts[key] = counts.get(key, 0) + 1
    return counts


def covered(counts: dict[str, int]) -> dict[str, int]:
    """Counts with each bigger fused op also counted as the smaller fusion it contains."""
    out = dict(counts)
    for big, small in COVERS.items():
        if big in counts:
            out[small] = out.get(small, 0) + counts[big]
    return out


def verify(model: str, form: Form, target: str) -> list[str]:
    """Failures of the fused graph against PyTorch (ORT CPU, fresh inputs, every verified shape)."""
    done = exported(model, form)
    session = ort_backend.session(fused(model, form, target)[0])
    failures = []
    for inputs, reference in zip(done.checks, done.references):
        outputs = ort_backend.run(session, {k: to_numpy(v) for k, v in inputs.items()})
        for check in compare_outputs(reference, outputs, DEFAULT_RTOL[form.precision]):
            if not check.passed:
                failures.append(f"{check.stats.name}: {check.stats.mismatched} elements beyond {check.tolerance:.3e} + rtol |ref| (max abs error {check.stats.max_abs_error:.3e})")
    return failures
