"""Load a MODEL argument into a callable `torch.nn.Module` and learn its input names.

Forms: a TorchScript archive, a `torch.export` program (`.pt2`), a full pickled module
(`torch.save(model)`, which runs code when loaded and so needs `trust_pickle`), or a factory
`package.module:callable` returning a module or `(module, example_inputs)`, or a Hugging Face
folder written by `save_pretrained` (see `deployfuse.hf`).
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import pickle
import re
import sys
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from deployfuse.errors import UsageError, first_line
from deployfuse.hf import is_pretrained_folder
from deployfuse.inputs import DynamicAxis, InputSpec, Inputs, make_inputs

_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


@dataclass
class LoadedModel:
    """A model ready to run and export.

    Attributes:
        module: the model in eval mode; for a `.pt2` this is the program's `module()`.
        form: "torchscript", "exported-program", "pickle", "factory" or "huggingface".
        input_names: the forward's parameter names, in order.
        example_inputs: inputs that came with the model (factory, `.pt2`, Hugging Face), else None.
        dynamic: axes that are dynamic unless the user pins them (a Hugging Face task's batch
            and sequence axes).
        task: the Hugging Face task it was loaded for.
        variadic: the forward takes `*args`: inputs go positionally in the order given, named by
            the caller (`--input` names become the ONNX input names).
    """

    module: torch.nn.Module
    form: str
    input_names: list[str]
    example_inputs: Inputs | None = None
    dynamic: list[DynamicAxis] = field(default_factory=list)
    task: str | None = None
    variadic: bool = False

    def __call__(self, inputs: Mapping[str, torch.Tensor]) -> Any:
        """Run the model on named inputs (positionally where the names are a prefix)."""
        args, kwargs = self.call_arguments(inputs)
        with torch.inference_mode():
            return self.module(*args, **kwargs)

    def call_arguments(self, inputs: Mapping[str, torch.Tensor]) -> tuple[tuple[torch.Tensor, ...], dict[str, torch.Tensor]]:
        """Split named inputs into positional args (the leading ones in signature order) and kwargs."""
        names = list(inputs)
        if self.variadic:
            return tuple(inputs.values()), {}
        if self.form in ("torchscript", "exported-program") or names == self.input_names[: len(names)]:
            return tuple(inputs[n] for n in self.input_names if n in inputs), {}
        return (), dict(inputs)

    def name_inputs(self, values: Sequence[torch.Tensor] | Mapping[str, torch.Tensor]) -> Inputs:
        """Name positional example inputs by the forward's signature."""
        if self.variadic:
            if not isinstance(values, Mapping):
                names = self.input_names or [f"input_{i}" for i in range(len(values))]
                values = dict(zip(names, (values,) if isinstance(values, torch.Tensor) else values))
            self.rename_inputs(list(values))
        if isinstance(values, Mapping):
            unknown = [k for k in values if self.input_names and k not in self.input_names]
            if unknown:
                raise UsageError(f"example inputs name {', '.join(unknown)}, but the model's inputs are {', '.join(self.input_names)}")
            return {str(k): _as_tensor(k, v) for k, v in values.items()}
        if isinstance(values, torch.Tensor):
            values = (values,)
        if len(values) > len(self.input_names):
            raise UsageError(f"{len(values)} example inputs given, but the model takes {len(self.input_names)}: {', '.join(self.input_names)}")
        return {name: _as_tensor(name, v) for name, v in zip(self.input_names, values)}

    def rename_inputs(self, names: Sequence[str]) -> None:
        """Name a variadic forward's inputs, in order (a `.pt2` keeps its number of inputs)."""
        if self.form == "exported-program" and len(names) != len(self.input_names):
            raise UsageError(f"{len(names)} inputs named, but the program takes {len(self.input_names)} positional inputs ({', '.join(self.input_names)})")
        renamed = dict(zip(self.input_names, names))
        self.dynamic = [DynamicAxis(renamed.get(d.name, d.name), d.axis, d.label) for d in self.dynamic]
        if self.example_inputs is not None:
            self.example_inputs = {renamed.get(k, k): v for k, v in self.example_inputs.items()}
        self.input_names = list(names)


def given_inputs(
    loaded: LoadedModel,
    specs: Sequence[InputSpec] = (),
    example_inputs: str | os.PathLike[str] | Sequence[torch.Tensor] | Mapping[str, torch.Tensor] | None = None,
    seed: int | None = None,
) -> Inputs | None:
    """The inputs a user gave, by priority: random tensors for `--input` specs, the tensors of
    `--example-inputs` (a `torch.save`d file, or tensors), the model's own example inputs.
    None when there are none."""
    if specs:
        if loaded.variadic:
            loaded.rename_inputs([s.name for s in specs])
        unknown = [s.name for s in specs if loaded.input_names and s.name not in loaded.input_names]
        if unknown:
            raise UsageError(f"--input {', '.join(unknown)}: the model's inputs are {', '.join(loaded.input_names)}")
        return make_inputs(specs, loaded.module, seed)
    if isinstance(example_inputs, (str, os.PathLike)):
        path = Path(example_inputs)
        if not path.is_file():
            raise UsageError(f"example inputs file not found: {path}")
        try:
            example_inputs = torch.load(str(path), map_location="cpu", weights_only=True)
        except Exception as exc:
            raise UsageError(f"could not load example inputs from {path}: {(str(exc).splitlines() or [''])[0]}") from exc
    if example_inputs is not None:
        return loaded.name_inputs(example_inputs)  # type: ignore[arg-type]
    return loaded.example_inputs


def _as_tensor(name: object, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise UsageError(f"example input {name!r} is a {type(value).__name__}, not a tensor")
    return value


def forward_parameter_names(module: torch.nn.Module) -> list[str]:
    """Names of the forward's parameters (no self, no *args/**kwargs)."""
    if isinstance(module, torch.jit.ScriptModule):
        return [a.name for a in module.forward.schema.arguments[1:]]  # type: ignore[attr-defined]  # a ScriptMethod
    params = inspect.signature(module.forward).parameters.values()
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _takes_varargs(module: torch.nn.Module) -> bool:
    """True when the forward has a `*args` parameter and no other positional one."""
    if isinstance(module, torch.jit.ScriptModule):
        return False
    kinds = [p.kind for p in inspect.signature(module.forward).parameters.values()]
    return inspect.Parameter.VAR_POSITIONAL in kinds and not any(k in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD) for k in kinds)


def load_model(model: str | os.PathLike[str] | torch.nn.Module, trust_pickle: bool = False, task: str | None = None) -> LoadedModel:
    """Load MODEL in any supported form; raise `UsageError` with a one-line reason otherwise.

    `task` (Optimum's task names) applies to a Hugging Face folder only."""
    if task is not None and (isinstance(model, torch.nn.Module) or not is_pretrained_folder(Path(model))):
        raise UsageError(f"--task {task} needs a Hugging Face model folder (save_pretrained, with config.json), not {model}")
    if isinstance(model, torch.nn.Module):
        return _finish(model, "module", None)
    text = str(model)
    path = Path(text)
    if is_pretrained_folder(path):
        from deployfuse.hf import load_pretrained

        hf = load_pretrained(path, task)
        return LoadedModel(hf.module, "huggingface", hf.input_names, hf.example_inputs, hf.dynamic, hf.task)
    if not path.exists() and _FACTORY.match(text):
        return _load_factory(text)
    if not path.exists():
        raise UsageError(f"model not found: {text} (give a file, or package.module:callable)")
    if path.is_dir():
        raise UsageError(f"{text} is a folder without config.json: give a Hugging Face folder written by save_pretrained, or a model file")
    if not path.is_file() or not os.access(path, os.R_OK):
        raise UsageError(f"model is not a readable file: {text}")
    if not zipfile.is_zipfile(path):
        raise UsageError(f"{text} is not a PyTorch model file (expected a TorchScript archive, a .pt2 program or torch.save output)")
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
    if any(n.endswith("/archive_format") for n in names):
        return _load_exported_program(path)
    if any("/code/__torch__/" in n for n in names):
        return _finish(_guard(lambda: torch.jit.load(str(path), map_location="cpu"), text), "torchscript", None)
    return _load_pickle(path, trust_pickle)


def _guard(load: Any, text: str) -> Any:
    try:
        return load()
    except UsageError:
        raise
    except Exception as exc:  # a corrupt archive surfaces as many exception types
        raise UsageError(f"could not load {text}: {first_line(exc, typed=True)}") from exc


def _load_exported_program(path: Path) -> LoadedModel:
    # torch.export.load logs the real reason (e.g. an output type it cannot deserialize) and
    # raises a generic error: keep the logged reason for the message.
    reasons: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: reasons.append(str(record.exc_info[1]) if record.exc_info else record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("torch.export")
    logger.addHandler(handler)
    try:
        program = torch.export.load(str(path))
    except Exception as exc:
        reason = reasons[-1].strip().splitlines()[-1] if reasons else first_line(exc)
        raise UsageError(f"could not load the exported program {path}: {reason}") from exc
    finally:
        logger.removeHandler(handler)
    names = [s.arg.name for s in program.graph_signature.input_specs if s.kind == torch.export.graph_signature.InputKind.USER_INPUT]
    loaded = LoadedModel(program.module(), "exported-program", names, variadic=_from_varargs(names))
    example = getattr(program, "example_inputs", None)
    if example is not None:
        args, kwargs = example
        named = loaded.name_inputs(args)
        named.update({k: _as_tensor(k, v) for k, v in kwargs.items()})
        loaded.example_inputs = named
    loaded.dynamic = _program_dynamic_axes(program, names)
    return loaded


def _from_varargs(names: Sequence[str]) -> bool:
    """True when a program's input names are those torch.export gives a `*args` forward: `a_0, a_1, ...`."""
    found = [re.fullmatch(r"(\w+)_(\d+)", n) for n in names]
    return bool(names) and all(found) and len({m.group(1) for m in found}) == 1 and [int(m.group(2)) for m in found] == list(range(len(names)))  # type: ignore[union-attr]


def _program_dynamic_axes(program: torch.export.ExportedProgram, names: Sequence[str]) -> list[DynamicAxis]:
    """The user inputs' axes that the program keeps symbolic (its range constraints), labelled
    by their symbol, so axes that share a symbol share a label."""
    symbols = {str(s) for s in program.range_constraints}
    axes = []
    for node in program.graph.nodes:
        value = node.meta.get("val") if node.op == "placeholder" and node.name in names else None
        for axis, dim in enumerate(getattr(value, "shape", ())):
            if isinstance(dim, torch.SymInt) and str(dim.node.expr) in symbols:
                axes.append(DynamicAxis(node.name, axis, str(dim.node.expr)))
    return axes


def _load_pickle(path: Path, trust_pickle: bool) -> LoadedModel:
    _import_from_cwd()  # the module's class is often defined beside it, as for package.module:callable
    try:
        content = torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if not trust_pickle:
            raise UsageError(
                f"{path} is a pickled module; loading it runs code from the file. "
                "Pass --trust-pickle if you trust it, or save it with torch.jit.save / torch.export.save"
            ) from exc
        content = _guard(lambda: torch.load(str(path), map_location="cpu", weights_only=False), str(path))
    except Exception as exc:
        raise UsageError(f"could not load {path}: {first_line(exc, typed=True)}") from exc
    if not isinstance(content, torch.nn.Module):
        kind = "weights (a state dict)" if isinstance(content, Mapping) else f"a {type(content).__name__}"
        raise UsageError(f"{path} holds {kind}, not a model; save the module itself or give package.module:callable")
    return _finish(content, "pickle", None)


def _load_factory(spec: str) -> LoadedModel:
    module_name, attr = spec.split(":")
    _import_from_cwd()
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"cannot import {module_name!r} for {spec}: {exc}") from exc
    except Exception as exc:  # the user's module fails to compile or raises when imported
        raise UsageError(f"importing {module_name!r} for {spec} failed: {first_line(exc, typed=True)}") from exc
    for part in attr.split("."):
        if not hasattr(target, part):
            raise UsageError(f"{module_name} has no attribute {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise UsageError(f"{spec} is not callable")
    try:
        made = target() if not isinstance(target, torch.nn.Module) else target
    except Exception as exc:
        raise UsageError(f"{spec} raised {first_line(exc, typed=True)}") from exc
    example = None
    if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], torch.nn.Module):
        made, example = made
    if not isinstance(made, torch.nn.Module):
        raise UsageError(f"{spec} returned a {type(made).__name__}, not a torch.nn.Module or (module, example_inputs)")
    return _finish(made, "factory", example)


def _import_from_cwd() -> None:
    """Let user modules in the current folder be imported, as `python -m` does."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())


def _finish(module: torch.nn.Module, form: str, example: object) -> LoadedModel:
    module.eval()
    loaded = LoadedModel(module, form, forward_parameter_names(module), variadic=_takes_varargs(module))
    if example is not None:
        loaded.example_inputs = loaded.name_inputs(example)  # type: ignore[arg-type]
    return loaded
