"""Export a module to ONNX: the dynamo exporter first, the TorchScript exporter as fallback.

Several real models (T5 encoders, Swin, TorchScript archives) fail `torch.export` today; the
TorchScript exporter still handles most of them, so a dynamo failure is recorded, not fatal.
What the tracer could not record (a branch on tensor values) is recorded with the attempt
(see `data_dependence`), for the caller to refuse or accept.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import onnx
import torch

from deployfuse.errors import DeployfuseError, first_line
from deployfuse.export.cleanup import FOLDING_LOGGER
from deployfuse.export.data_dependence import DataDependence, DataDependenceSpy, dynamo_data_dependence
from deployfuse.export.overflow_clamp import OverflowClampAsWhere
from deployfuse.export.type_check import mistyped_node
from deployfuse.inputs import DynamicAxis, Inputs
from deployfuse.loading import LoadedModel
from deployfuse.ops import DOMAIN, attach_functions
from deployfuse.ops.torch_ops import translation_table
from deployfuse.quiet_logs import quieted

EXPORTERS = ("dynamo", "torchscript")


@dataclass
class ExportAttempt:
    """One exporter's try: which, why it failed (None when it worked), and the Python values
    it took from tensor data, each with the tracer's warning (a graph that follows one branch)."""

    exporter: str
    error: str | None = None
    data_dependent: list[DataDependence] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _axes(dynamic: Sequence[DynamicAxis], inputs: Inputs) -> dict[str, dict[int, str]]:
    axes: dict[str, dict[int, str]] = {}
    for d in dynamic:
        axes.setdefault(d.name, {})[d.axis % inputs[d.name].dim()] = d.label
    return axes


@contextmanager
def _without_cache(module: torch.nn.Module) -> Iterator[None]:
    """Export a transformers model with `config.use_cache` off, then put it back.

    With it on, decoders return their key/value cache as a `Cache` object, which neither
    exporter can flatten (torch.export: "not a known type"; TorchScript: "unsupported type").
    The exported graph takes no past keys and values, and `flatten_outputs` names no output
    for a cache, so the outputs are the same without it.
    """
    configs: dict[int, Any] = {}
    for submodule in module.modules():
        config = getattr(submodule, "config", None)
        if getattr(config, "use_cache", None) is True:
            configs[id(config)] = config
    for config in configs.values():
        config.use_cache = False
    try:
        yield
    finally:
        for config in configs.values():
            config.use_cache = True


def _dynamo(loaded: LoadedModel, inputs: Inputs, dynamic: Sequence[DynamicAxis], output_names: list[str], opset: int) -> onnx.ModelProto:
    args, kwargs = loaded.call_arguments(inputs)
    axes = _axes(dynamic, inputs)
    shapes: dict[str, object] | tuple[object, ...] | None = None
    if axes:
        if kwargs:
            shapes = {name: axes.get(name) for name in kwargs}
        else:
            shapes = tuple(axes.get(name) for name in loaded.input_names if name in inputs)
            if loaded.variadic and loaded.form != "exported-program":
                shapes = (shapes,)  # torch.export sees one `*args` parameter holding them all
    with _without_cache(loaded.module), OverflowClampAsWhere():  # transformers' fp16 overflow clamps: a where, not a refused branch
        program = torch.onnx.export(
            loaded.module, args, kwargs=kwargs or None, dynamo=True, dynamic_shapes=shapes,
            output_names=output_names, opset_version=opset, optimize=True, verbose=False,
            input_names=list(inputs) if loaded.variadic else None,  # `*args` inputs take the caller's names
            custom_translation_table=translation_table(),  # torch.ops.deployfuse.* calls become one node each
        )
    assert program is not None  # dynamo=True returns the program
    model = program.model_proto
    if any(n.domain == DOMAIN for n in model.graph.node):
        attach_functions(model)  # their ONNX function bodies, so any runtime runs them
    return model


class _KeywordCall(torch.nn.Module):
    """Calls a module with keyword inputs from positional ones.

    The TorchScript exporter passes inputs positionally; transformers models (whose forwards
    take more than their tensors) refuse that, so every input is passed by name.
    """

    def __init__(self, module: torch.nn.Module, names: Sequence[str], spy: DataDependenceSpy):
        super().__init__()
        self.module, self.names, self.spy = module, list(names), spy
        self.positional = False  # a `forward(self, *args)` takes its inputs in order, not by name
        # The exporter restores the wrapper's mode afterwards, recursively: it must match the model's.
        self.train(module.training)

    def forward(self, *tensors: torch.Tensor) -> object:
        self.spy.mark_inputs(tensors)
        return self.module(*tensors) if self.positional else self.module(**dict(zip(self.names, tensors)))


def _torchscript(loaded: LoadedModel, inputs: Inputs, dynamic: Sequence[DynamicAxis], output_names: list[str], opset: int,
                 spy: DataDependenceSpy) -> onnx.ModelProto:
    module: torch.nn.Module
    if isinstance(loaded.module, torch.jit.ScriptModule):  # scripted: its control flow is in the graph
        module, args = loaded.module, loaded.call_arguments(inputs)[0]
    else:
        module, args = _KeywordCall(loaded.module, list(inputs), spy), tuple(inputs.values())
        module.positional = loaded.variadic
    buffer = io.BytesIO()
    with _without_cache(loaded.module), spy, OverflowClampAsWhere():  # inside the spy: the overflow tests it rewrites are no baked branch
        torch.onnx.export(
            module, args, buffer,  # type: ignore[arg-type]  # a file object is accepted
            dynamo=False, input_names=list(inputs), output_names=output_names,
            dynamic_axes=_axes(dynamic, inputs) or None, opset_version=min(opset, 20), do_constant_folding=True,
        )
    model = onnx.load_from_string(buffer.getvalue())
    problem = mistyped_node(model)
    if problem is not None:  # refused here, with the reason, rather than by ONNX Runtime in a later step
        raise DeployfuseError(f"it wrote a graph that mixes element types ({problem}), which ONNX Runtime refuses; "
                              "in fp16 this is its scaled_dot_product_attention with a boolean mask: use the dynamo exporter")
    return model


def _failure(exc: BaseException) -> str:
    """One line for an exporter's failure: torch.onnx says which of its steps failed, then
    "Next steps:" (`ConversionError: Failed to decompose the FX graph ... Next steps:`); the
    reason is the exception it chains from, so that is named beside the step."""
    cause = exc
    while cause.__cause__ is not None and cause.__cause__ is not cause:
        cause = cause.__cause__
    if cause is exc:
        return first_line(exc, typed=True, limit=400)
    step = first_line(exc, typed=True, limit=200).split(". ")[0]
    return f"{step}: {first_line(cause, typed=True, limit=300)}"


def to_onnx(
    loaded: LoadedModel,
    inputs: Inputs,
    dynamic: Sequence[DynamicAxis],
    output_names: list[str],
    opset: int,
    exporters: Sequence[str] = EXPORTERS,
) -> tuple[onnx.ModelProto, list[ExportAttempt]]:
    """Export with the first exporter that works; return the model and every attempt.

    Raises DeployfuseError naming each exporter's failure when none works.
    """
    attempts: list[ExportAttempt] = []
    for exporter in exporters:
        spy = DataDependenceSpy()
        try:
            with warnings.catch_warnings(), quieted(FOLDING_LOGGER):
                warnings.simplefilter("ignore")
                if exporter == "dynamo":
                    model = _dynamo(loaded, inputs, dynamic, output_names, opset)
                else:
                    model = _torchscript(loaded, inputs, dynamic, output_names, opset, spy)
        except Exception as exc:  # exporters raise anything from torch internals
            attempts.append(ExportAttempt(exporter, dynamo_data_dependence(exc) or _failure(exc)))
            continue
        attempts.append(ExportAttempt(exporter, data_dependent=list(spy.found)))
        return model, attempts
    detail = "; ".join(f"{a.exporter}: {a.error}" for a in attempts)
    raise DeployfuseError(f"no exporter could export the model ({detail})")


