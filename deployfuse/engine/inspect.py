"""What an engine holds: layers, precision per layer, plugins, bindings and profiles.

Two sources. The engine itself, through TensorRT's runtime and engine inspector, when a runtime
here can deserialize it (a GPU it was built for, the plugin libraries it needs). Otherwise the
build record `deployfuse build` writes beside every engine (`ENGINE.plan.build.json`): the
parsed network's layers (before TensorRT fused them), the bindings, the profiles and how it was
built, with the reason the engine itself could not be loaded.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import RenderableType

from deployfuse import tables
from deployfuse.errors import UsageError

RECORD_SUFFIX = ".build.json"


def record_path(engine: str | os.PathLike[str]) -> Path:
    """Where `deployfuse build` records how `engine` was built."""
    return Path(os.fspath(engine) + RECORD_SUFFIX)


def _dtype(value: Any) -> str:
    return str(value).rsplit(".", 1)[-1].lower()


def network_record(network: Any) -> dict[str, Any]:
    """Bindings and layers of a parsed TensorRT network (INetworkDefinition), as JSON values."""

    def tensor(t: Any) -> dict[str, Any]:
        return {"name": t.name, "dtype": _dtype(t.dtype), "shape": [int(d) for d in t.shape]}

    layers = []
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        outputs = [layer.get_output(j) for j in range(layer.num_outputs)]
        layers.append({"name": layer.name, "type": layer.type.name, "precision": _dtype(outputs[0].dtype) if outputs else "-"})
    return {
        "inputs": [tensor(network.get_input(i)) for i in range(network.num_inputs)],
        "outputs": [tensor(network.get_output(i)) for i in range(network.num_outputs)],
        "layers": layers,
    }


@dataclass
class EngineReport:
    """An engine's contents, from the engine (`source == "engine"`) or its build record."""

    engine: Path
    source: str  # "engine" or "build record"
    why_not_loaded: str | None
    bindings: list[dict[str, Any]]  # name, mode (input/output), dtype, shape
    profiles: list[list[dict[str, Any]]]  # per profile: name, min, opt, max
    layers: list[dict[str, Any]]  # name, type, precision
    plugins: list[str]
    built: dict[str, Any] = field(default_factory=dict)  # builder, version, precision, target, ...

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "engine": str(self.engine)}

    def to_text(self) -> str:
        """`tables()` as plain text."""
        return tables.plain(*self.tables())

    def tables(self) -> list[RenderableType]:
        """A summary (engine, source, build, bindings, profiles, plugins) and the layer table
        (rich renderables: `deployfuse.tables`)."""
        summary = tables.grid("", "", header=False)
        tables.add(summary, "engine", f"{self.engine} ({self.engine.stat().st_size / 1e6:.2f} MB)")
        if self.source == "engine":
            tables.add(summary, "source", "the engine, through TensorRT's runtime and engine inspector")
        else:
            tables.add(summary, "source", f"the build record {record_path(self.engine).name}: the engine was not loaded ({self.why_not_loaded})")
            tables.add(summary, "", "layers are the parsed network's, before TensorRT fused them")
        if self.built:
            b = self.built
            target = f"compute capability {b['compute_capability']}" if b.get("compute_capability") else "the builder's default target"
            tables.add(summary, "built", f"{b.get('builder')} {b.get('builder_version')}, {b.get('precision')}, {target}")
        for t in self.bindings:
            tables.add(summary, "binding", f"{t['mode']:<6} {t['name']} {t['dtype']} {'x'.join(map(str, t['shape']))}")
        for number, profile in enumerate(self.profiles, 1):
            for p in profile:
                tables.add(summary, f"profile {number}", f"{p['name']}:{'x'.join(map(str, p['min']))}:{'x'.join(map(str, p['opt']))}:{'x'.join(map(str, p['max']))}")
        tables.add(summary, "plugins", ", ".join(self.plugins) if self.plugins else "none")
        by_precision: dict[str, int] = {}
        for layer in self.layers:
            by_precision[layer["precision"]] = by_precision.get(layer["precision"], 0) + 1
        tables.add(summary, "layers", f"{len(self.layers)} (" + ", ".join(f"{p} {n}" for p, n in sorted(by_precision.items())) + ")")
        layers = tables.grid("type", "precision", "name")
        for layer in self.layers:
            tables.add(layers, layer["type"], layer["precision"], layer["name"])
        return [summary, tables.line(""), layers]


def inspect_engine(engine: str | os.PathLike[str], plugins: list[str | os.PathLike[str]] | None = None) -> EngineReport:
    """Read `engine` with a TensorRT runtime when one here can load it, else its build record.

    Raises UsageError when the file is missing, or neither source is available (the message
    says why the engine could not be loaded).
    """
    path = Path(engine)
    if not path.is_file():
        raise UsageError(f"no such engine file: {path}")
    record = _read_record(path)
    libraries = [Path(p) for p in (plugins if plugins is not None else (record or {}).get("plugin_libraries", []))]
    loaded, why = _from_runtime(path, (record or {}).get("builder"), libraries)
    if loaded is not None:
        loaded.built = {k: v for k, v in (record or {}).items() if k not in ("network", "profiles")}
        return loaded
    if record is None:
        raise UsageError(f"{path}: the engine could not be loaded here ({why}) and it has no build record {record_path(path).name}")
    network = record["network"]
    return EngineReport(
        engine=path, source="build record", why_not_loaded=why,
        bindings=[{**t, "mode": "input"} for t in network["inputs"]] + [{**t, "mode": "output"} for t in network["outputs"]],
        profiles=record["profiles"], layers=network["layers"], plugins=record.get("plugins", []),
        built={k: v for k, v in record.items() if k not in ("network", "profiles")},
    )


def _read_record(engine: Path) -> dict[str, Any] | None:
    path = record_path(engine)
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        record["network"]["layers"]  # noqa: B018  (the one part every report needs)
        return record
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{path} is not a deployfuse build record: {exc}") from exc


def _from_runtime(path: Path, builder: str | None, libraries: list[Path]) -> tuple[EngineReport | None, str]:
    """The report from a deserialized engine, or None and why not."""
    from deployfuse.backends.trt import load_engine
    from deployfuse.engine import builders

    installed = builders.installed_builders()
    if builder is not None and builder not in installed:
        return None, f"it was built by {builder}, which is not installed here"
    if not installed:
        return None, "neither TensorRT nor TensorRT-RTX is installed"
    try:
        loaded = load_engine(path, builders.activate(builder or installed[0]), [p for p in libraries if p.is_file()], own_plugins=False)
    except UsageError as exc:
        return None, str(exc)
    return _report(loaded.trt, path, loaded.engine), ""


def _report(trt: Any, path: Path, engine: Any) -> EngineReport:
    """Bindings, profiles and the inspector's layers of a deserialized engine (needs a GPU)."""
    from deployfuse.backends.trt import engine_profiles

    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    bindings = [{"name": n, "mode": "input" if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT else "output",
                 "dtype": _dtype(engine.get_tensor_dtype(n)), "shape": [int(d) for d in engine.get_tensor_shape(n)]} for n in names]
    profiles = engine_profiles(engine, [b["name"] for b in bindings if b["mode"] == "input" and any(d < 0 for d in b["shape"])])
    info = json.loads(engine.create_engine_inspector().get_engine_information(trt.LayerInformationFormat.JSON))
    layers, plugins = [], set()
    for layer in info.get("Layers", []):
        if isinstance(layer, str):  # built without detailed profiling verbosity: names only
            layers.append({"name": layer, "type": "?", "precision": "?"})
            continue
        outputs = layer.get("Outputs") or [{}]
        fmt = str(outputs[0].get("Format/Datatype", "?"))
        precision = next((t for t in ("FP32", "Float", "FP16", "Half", "BF16", "Int8", "Int32", "Int64", "Bool") if t.lower() in fmt.lower()), fmt)
        layers.append({"name": layer.get("Name", "?"), "type": layer.get("LayerType", "?"), "precision": precision.lower()})
        if "plugin" in str(layer.get("LayerType", "")).lower():
            plugins.add(str(layer.get("Name", "?")))
    return EngineReport(engine=path, source="engine", why_not_loaded=None, bindings=bindings, profiles=profiles, layers=layers, plugins=sorted(plugins))
