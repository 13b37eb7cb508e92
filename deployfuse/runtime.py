"""`deployfuse.InferenceSession`: run an artefact the way it was measured, in your own code.

An artefact carries facts a plain `onnxruntime.InferenceSession` ignores: the CUDA execution
provider options it was tuned with (metadata key `deployfuse.cuda_provider_options`: NHWC
convolutions, TF32, the CUDA graph, the attention kernel) and `deployfuse.*` nodes that run
fastest through deployfuse's native custom-op library. This module is the one place that reads
those facts; deployfuse's own sessions (`deployfuse.backends.ort`) go through it too.

    sess = deployfuse.InferenceSession("model.onnx")            # CUDA when ORT has it, else CPU
    outputs = sess.run(None, {"input_ids": ids, "attention_mask": mask})
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx

from deployfuse import metadata
from deployfuse.backends.u8s8 import for_this_cpu
from deployfuse.errors import UsageError, first_line
from deployfuse.io import load_onnx

LOG = logging.getLogger("deployfuse.runtime")
DEPLOYFUSE_DOMAIN = "deployfuse"
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"

# An execution provider as onnxruntime takes it: a name, or (name, options).
Provider = str | tuple[str, Mapping[str, Any]]


def artefact_provider_options(model: onnx.ModelProto | str | os.PathLike[str]) -> dict[str, str]:
    """The CUDA EP options stored in the model's metadata by `deployfuse export --target ort-cuda`.

    They travel inside the artefact, so every session deployfuse makes (and any user who reads
    them) runs the model as it was measured.
    """
    if not isinstance(model, onnx.ModelProto):
        model = _load_header(model)
    options = metadata.read(model, metadata.CUDA_PROVIDER_OPTIONS) or {}
    return {str(k): str(v) for k, v in options.items()}  # type: ignore[attr-defined]  # a JSON object


def resolve_providers(
    model: onnx.ModelProto | str | os.PathLike[str], providers: Sequence[Provider], overrides: Mapping[str, str] | None = None
) -> list[Provider]:
    """`providers` with the artefact's CUDA options applied to the CUDA EP entry.

    Options given by the caller (in a `(name, options)` entry or in `overrides`) win over the
    artefact's; other providers pass through unchanged.
    """
    resolved: list[Provider] = []
    stored: dict[str, str] | None = None
    for provider in providers:
        name, given = (provider, {}) if isinstance(provider, str) else (provider[0], dict(provider[1]))
        if name != CUDA:
            resolved.append(provider)
            continue
        if stored is None:
            stored = artefact_provider_options(model)
        resolved.append((CUDA, {**stored, **{k: str(v) for k, v in given.items()}, **dict(overrides or {})}))
    return resolved


def uses_deployfuse_ops(model: onnx.ModelProto) -> bool:
    """Whether any node (in the graph, its subgraphs or its functions) is a `deployfuse.*` op."""

    def walk(nodes: Sequence[onnx.NodeProto]) -> bool:
        for node in nodes:
            if node.domain == DEPLOYFUSE_DOMAIN:
                return True
            for attr in node.attribute:
                graphs = [attr.g] if attr.HasField("g") else list(attr.graphs)
                if any(walk(g.node) for g in graphs):
                    return True
        return False

    return walk(model.graph.node) or any(walk(f.node) for f in model.functions)


def default_providers() -> list[str]:
    """CUDA then CPU when this onnxruntime has the CUDA EP, else CPU alone."""
    import onnxruntime as ort

    return [CUDA, CPU] if CUDA in ort.get_available_providers() else [CPU]


def native_library_for(model: onnx.ModelProto) -> Path | None:
    """deployfuse's built custom-op library when `model` has `deployfuse.*` nodes, else None.

    Never builds: a session should not start a compiler. Without the library the nodes run as
    the ONNX function bodies stored in the model (same results, slower).
    """
    if not uses_deployfuse_ops(model):
        return None
    from deployfuse.ops import ort_custom_ops_library

    try:
        return ort_custom_ops_library(build=False)
    except UsageError as exc:
        LOG.info("deployfuse.* nodes run as their ONNX function bodies: %s", exc)
        return None


class InferenceSession:
    """A thin layer over `onnxruntime.InferenceSession` that honours what the artefact carries.

    Everything `onnxruntime.InferenceSession` has (`run`, `get_inputs`, `get_outputs`,
    `run_with_iobinding`, `io_binding`, ...) is reached through this object; the underlying
    session is `.session`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        providers: Sequence[Provider] | None = None,
        *,
        sess_options: Any = None,
        custom_ops_library: str | os.PathLike[str] | bool = True,
        provider_options: Mapping[str, str] | None = None,
    ) -> None:
        """Open the model at `path`.

        Args:
            path: an ONNX artefact (external data beside it is found as usual).
            providers: execution providers in priority order, names or `(name, options)`;
                None picks CUDA then CPU when this onnxruntime has CUDA, else CPU.
            sess_options: an `onnxruntime.SessionOptions` to start from.
            custom_ops_library: True registers deployfuse's built library when the model has
                `deployfuse.*` nodes; a path registers that library; False registers none
                (the nodes then run as their ONNX function bodies).
            provider_options: CUDA EP options applied over the artefact's own.

        Raises:
            UsageError: no such file, not an ONNX model, or a library that does not exist.
        """
        import onnxruntime as ort

        self.path = Path(path)
        model = _load_header(self.path)
        self.uses_deployfuse_ops = uses_deployfuse_ops(model)
        if custom_ops_library is True:
            library = native_library_for(model)
        elif custom_ops_library is False:
            library = None
        else:
            library = Path(custom_ops_library)
            if not library.is_file():
                raise UsageError(f"no such custom-op library: {library}")
        options = sess_options if sess_options is not None else ort.SessionOptions()
        if sess_options is None:
            options.log_severity_level = 3
        if library is not None:
            try:
                options.register_custom_ops_library(str(library))
            except Exception as exc:  # onnxruntime's own error types; dlopen failed (say, no CUDA runtime here)
                if custom_ops_library is not True:
                    raise UsageError(f"cannot load the custom-op library {library}: {first_line(exc)}") from exc
                LOG.warning("deployfuse.* nodes run as their ONNX function bodies: %s does not load here (%s)", library, first_line(exc))
                library = None
        self.custom_ops_library: Path | None = library
        self.providers = resolve_providers(model, list(providers) if providers is not None else default_providers(), provider_options)
        self.session = ort.InferenceSession(for_this_cpu(str(self.path), self.providers, header=model), sess_options=options, providers=self.providers)
        if self.uses_deployfuse_ops and library is None:
            LOG.info("%s: deployfuse.* nodes run as their ONNX function bodies (no custom-op library registered)", self.path.name)

    @property
    def native_ops(self) -> bool:
        """True when `deployfuse.*` nodes run through the native library, False when they run
        as function bodies (or the model has none)."""
        return self.custom_ops_library is not None and self.uses_deployfuse_ops

    def __getattr__(self, name: str) -> Any:
        if name == "session":  # not set yet: __init__ failed before opening it
            raise AttributeError(name)
        return getattr(self.session, name)

    def __repr__(self) -> str:
        ops = "native deployfuse ops" if self.native_ops else ("deployfuse ops as function bodies" if self.uses_deployfuse_ops else "no deployfuse ops")
        return f"InferenceSession({str(self.path)!r}, providers={self.session.get_providers()}, {ops})"


def _load_header(path: str | os.PathLike[str]) -> onnx.ModelProto:
    """The model without its external weights (enough for metadata and nodes)."""
    return load_onnx(path, weights=False)


def input_shapes(model: onnx.ModelProto, given: Mapping[str, Sequence[int]] | None = None) -> dict[str, tuple[int, ...]]:
    """A concrete shape for every model input: `given`, else the shape the export recorded
    (metadata `deployfuse.input_shapes`), else the graph's static dims.

    Raises:
        UsageError: an input with a dynamic axis and no shape to take, or a shape of the wrong rank.
    """
    given = dict(given or {})
    recorded = metadata.read(model, metadata.INPUT_SHAPES) or {}
    initializers = {t.name for t in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in initializers]
    unknown = set(given) - {v.name for v in inputs}
    if unknown:
        raise UsageError(f"the model has no input named {sorted(unknown)[0]!r}; its inputs: {', '.join(v.name for v in inputs)}")
    labels: dict[str, int] = {}  # an axis label's size in the given shapes: attention_mask follows input_ids
    for value in inputs:
        for dim, size in zip(value.type.tensor_type.shape.dim, given.get(value.name, ())):
            if dim.dim_param:
                labels.setdefault(dim.dim_param, int(size))
    shapes: dict[str, tuple[int, ...]] = {}
    for value in inputs:
        dims = [d.dim_value if d.HasField("dim_value") else None for d in value.type.tensor_type.shape.dim]
        shape = given.get(value.name) or recorded.get(value.name)  # type: ignore[attr-defined]
        if shape is None:
            shape = [s if s is not None else labels.get(d.dim_param) for d, s in zip(value.type.tensor_type.shape.dim, dims)]
            if None in shape:
                raise UsageError(f"input {value.name!r} has dynamic axes and no recorded shape: give --input {value.name}:SHAPE")
        elif value.name not in given:
            shape = [labels.get(d.dim_param, s) if d.dim_param else s for d, s in zip(value.type.tensor_type.shape.dim, shape)]
        if len(shape) != len(dims) or any(d is not None and d != s for d, s in zip(dims, shape)):
            raise UsageError(f"input {value.name!r}: shape {'x'.join(map(str, shape))} does not fit the model's dims {[d if d is not None else '?' for d in dims]}")
        shapes[value.name] = tuple(int(s) for s in shape)
    return shapes


def random_feed(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]], seed: int = 0) -> dict[str, Any]:
    """Random numpy inputs a model accepts (see `deployfuse.inputs.random_tensor`): token ids
    stay below the smallest embedding table the input indexes, masks are ones."""
    import numpy as np
    import torch

    from deployfuse.inputs import random_tensor

    generator = torch.Generator().manual_seed(seed)
    types = {v.name: v.type.tensor_type.elem_type for v in model.graph.input}
    feed = {}
    for name, shape in shapes.items():
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(types[name]))
        torch_dtype = torch.from_numpy(np.zeros(0, dtype=dtype)).dtype
        feed[name] = random_tensor(name, shape, torch_dtype, _embedding_rows(model, name), generator).numpy()
    return feed


def _embedding_rows(model: onnx.ModelProto, name: str) -> int:
    """Rows of the smallest table a Gather indexes with `name` (2 when there is none)."""
    tables = {t.name: t.dims[0] for t in model.graph.initializer if t.dims}
    rows = [tables[n.input[0]] for n in model.graph.node if n.op_type == "Gather" and len(n.input) > 1 and n.input[1] == name and n.input[0] in tables]
    return min(rows) if rows else 2
