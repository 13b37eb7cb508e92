"""`build_engine`: a fused ONNX model in, a serialized TensorRT engine out.

The steps, each failing with a one-line reason before any time is spent building:
load the ONNX -> pick the builder -> load plugin libraries -> prepare the graph (give function
overloads their own names, lower the precision) -> pre-flight every node -> resolve the
optimisation profile -> parse with Polygraphy's `NetworkFromOnnxPath` -> build with
`EngineBytesFromNetwork` -> write the plan atomically.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx
from rich.console import RenderableType

from deployfuse import provenance, tables
from deployfuse.engine import builders, plugins as plugin_libs, precision as lowp
from deployfuse.engine.inspect import network_record, record_path
from deployfuse.engine.messages import captured
from deployfuse.engine.preflight import Preflight, check_nodes, split_overloads, walk_nodes
from deployfuse.engine.profiles import ShapeProfile, export_shapes, model_inputs, resolve_optimization_profiles
from deployfuse.engine.progress import progress_monitor
from deployfuse.errors import DeployfuseError, UsageError, first_line
from deployfuse.io import atomic_path, check_outputs

PRECISIONS = ("fp32", "fp16", "bf16")
DEPLOYFUSE_DOMAIN = "deployfuse"


@dataclass
class BuildResult:
    """What was built, how, and what it took."""

    engine: Path
    builder: str
    builder_version: str
    precision: str
    compute_capability: str | None
    profiles: list[list[ShapeProfile]]  # the optimisation profiles, each one entry per dynamic input
    network_layers: int
    plugin_layers: int
    preflight: Preflight
    plugin_libraries: list[Path] = field(default_factory=list)
    timing_cache: Path | None = None
    size_bytes: int = 0
    seconds: float = 0.0
    record: Path | None = None  # ENGINE.plan.build.json, what `deployfuse inspect` reads when no runtime can load the engine

    def summary(self) -> str:
        """`tables()` as plain text: a few lines for the terminal and the log."""
        return tables.plain(*self.tables())

    def tables(self) -> list[RenderableType]:
        """The summary as a key/value grid (rich renderables: `deployfuse.tables`)."""
        target = f"compute capability {self.compute_capability}" if self.compute_capability else "the builder's default target"
        nodes = f"{sum(self.preflight.native.values())} native"
        if self.preflight.plugin:
            nodes += ", plugins: " + ", ".join(f"{op} x{n}" for op, n in self.preflight.plugin.items())
        if self.preflight.function:
            nodes += ", from function bodies: " + ", ".join(f"{op} x{n}" for op, n in self.preflight.function.items())
        summary = tables.grid("", "", header=False)
        tables.add(summary, "engine", f"{self.engine} ({self.size_bytes / 1e6:.2f} MB, built in {self.seconds:.1f} s)")
        tables.add(summary, "builder", f"{self.builder} {self.builder_version}, {target}")
        tables.add(summary, "precision", self.precision)
        tables.add(summary, "layers", f"{self.network_layers} in the network, {self.plugin_layers} of them plugins")
        tables.add(summary, "nodes", nodes)
        for number, profile in enumerate(self.profiles, 1):
            for p in profile:
                tables.add(summary, f"profile {number}" if len(self.profiles) > 1 else "profile", str(p))
        if self.timing_cache is not None:
            tables.add(summary, "timing", str(self.timing_cache))
        return [summary]


def build_engine(
    model: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    precision: str = "fp32",
    profiles: Sequence[ShapeProfile] | Sequence[Sequence[ShapeProfile]] = (),
    plugins: Sequence[str | os.PathLike[str]] = (),
    deployfuse_plugins: bool = True,
    timing_cache: str | os.PathLike[str] | None = None,
    workspace_mib: int | None = None,
    compute_capability: str | None = None,
    builder: str = "auto",
    progress: Callable[[str], None] | None = None,
) -> BuildResult:
    """Build a TensorRT engine from the ONNX file `model` and write it to `output`.

    Args:
        model: an ONNX file, ideally exported with `--target tensorrt`.
        output: where the serialized engine goes (written atomically).
        precision: "fp32", "fp16" or "bf16"; the lower ones rewrite the graph (see
            `deployfuse.engine.precision`), the engine's inputs and outputs stay float32.
        profiles: the optimisation profiles, each a list of min/opt/max shapes for dynamic
            inputs (the inputs a profile leaves out are derived, see `deployfuse.engine.profiles`);
            a flat list of ShapeProfile is one profile.
        plugins: TensorRT plugin libraries to load.
        deployfuse_plugins: also load deployfuse's own plugin library when the model has
            `deployfuse` nodes and the library is built; otherwise those nodes are built from
            their ONNX function bodies.
        timing_cache: read the timing cache from this file if it exists, and write it back.
        workspace_mib: cap on the builder's workspace memory.
        compute_capability: "8.9" etc., the GPU generation to build for (TensorRT-RTX only:
            it builds without a GPU); TensorRT proper builds for the GPU it runs on.
        builder: "tensorrt", "tensorrt-rtx" or "auto" (TensorRT when installed).
        progress: called with one line per build phase.

    Raises:
        UsageError: bad arguments, or nodes TensorRT cannot build (all listed); nothing written.
        DeployfuseError: TensorRT failed to build the engine.
    """
    say = progress or (lambda line: None)
    start = time.perf_counter()
    if precision not in PRECISIONS:
        raise UsageError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    if workspace_mib is not None and workspace_mib <= 0:
        raise UsageError(f"--workspace must be a positive number of MiB, got {workspace_mib}")
    # The timing cache is read and written back: an output that may exist, but not another path of the run.
    paths = check_outputs({"-o": output, "--timing-cache": timing_cache}, {"ONNX": model, **{f"--plugins {p}": p for p in plugins}})
    target, cache = paths["-o"], paths.get("--timing-cache")
    onnx_model = _load_onnx(Path(model))
    name = builders.resolve_builder(builder)
    with captured() as errors:  # Polygraphy's and TensorRT's own messages: the log, not the terminal
        trt = builders.activate(name)
        capability = _parse_capability(compute_capability, name, trt)
        say(f"builder: {name} {trt.__version__}")
        if cache is not None and name == "tensorrt-rtx":
            say(f"timing cache {cache} not used: TensorRT-RTX has none (its timing cache calls are no-ops)")
            cache = None

        libraries = plugin_libs.load_plugins(trt, plugins, own=deployfuse_plugins and _uses_domain(onnx_model, DEPLOYFUSE_DOMAIN))
        registered = plugin_libs.registered_plugins(trt)
        if not deployfuse_plugins:  # the registry is per process: ignore deployfuse creators loaded earlier
            registered = {p for p in registered if p[1] != DEPLOYFUSE_DOMAIN}

        split_overloads(onnx_model, registered)
        if precision != "fp32":
            lowp.lower_precision(onnx_model, precision)
        preflight = check_nodes(onnx_model, _OperatorSupport(trt), registered)
        preflight.raise_for_offenders()
        shape_profiles = resolve_optimization_profiles(model_inputs(onnx_model), _as_profiles(profiles), export_shapes(onnx_model))

        with tempfile.TemporaryDirectory(prefix=".deployfuse-build.") as tmp:
            prepared = Path(tmp) / "model.onnx"
            onnx.save_model(onnx_model, prepared, save_as_external_data=True, all_tensors_to_one_file=True, location="model.onnx.data", size_threshold=1024)
            network = _parse(trt, prepared, use_plugins=bool(preflight.plugin), errors=errors)
            network_layers = network[1].num_layers
            plugin_layers = sum(1 for i in range(network_layers) if "PLUGIN" in network[1].get_layer(i).type.name)
            network_info = network_record(network[1])
            say(f"parsed: {network_layers} layers ({plugin_layers} plugins); building for {precision}" + (f", compute capability {compute_capability}" if capability else ""))
            config = _config(trt, name, shape_profiles, capability, cache, workspace_mib, progress_monitor(trt, say))
            engine = _build(network, config, cache, errors)

    result = BuildResult(
        engine=target, builder=name, builder_version=trt.__version__, precision=precision,
        compute_capability=compute_capability if capability else None, profiles=shape_profiles,
        network_layers=network_layers, plugin_layers=plugin_layers, preflight=preflight,
        plugin_libraries=libraries, timing_cache=cache, record=record_path(target),
    )
    with atomic_path(record_path(target)) as tmp_record, atomic_path(target) as tmp_engine:
        tmp_engine.write_bytes(memoryview(engine))  # type: ignore[arg-type]  # an IHostMemory
        result.size_bytes = tmp_engine.stat().st_size
        result.seconds = time.perf_counter() - start
        tmp_record.write_text(json.dumps(_record(result, network_info), indent=1))
    return result


def _record(result: BuildResult, network: dict) -> dict:
    """How the engine was built, for `deployfuse inspect` where no runtime can load it."""
    return {
        "builder": result.builder, "builder_version": result.builder_version, "precision": result.precision,
        "compute_capability": result.compute_capability, "size_bytes": result.size_bytes, "seconds": round(result.seconds, 2),
        "plugin_libraries": [os.fspath(p) for p in result.plugin_libraries],
        "plugins": [f"{op} x{n}" for op, n in result.preflight.plugin.items()],
        "profiles": [[{"name": p.name, "min": list(p.min), "opt": list(p.opt), "max": list(p.max)} for p in profile] for profile in result.profiles],
        "network": network,
        "provenance": provenance.collect(),  # versions (TensorRT's too), device, threads, command, UTC time
    }


def _as_profiles(profiles: Sequence[ShapeProfile] | Sequence[Sequence[ShapeProfile]]) -> list[list[ShapeProfile]]:
    """A flat list of ShapeProfile is one optimisation profile; a list of lists, several."""
    if all(isinstance(p, ShapeProfile) for p in profiles):
        return [list(profiles)] if profiles else []  # type: ignore[arg-type]
    return [list(p) for p in profiles]  # type: ignore[arg-type]


def _load_onnx(path: Path) -> onnx.ModelProto:
    if not path.is_file():
        raise UsageError(f"no such ONNX file: {path}")
    try:
        return onnx.load(os.fspath(path))
    except Exception as exc:  # protobuf raises DecodeError, external data raises anything
        raise UsageError(f"{path} is not a readable ONNX model: {first_line(exc, typed=True)}") from exc


def _parse_capability(text: str | None, builder: str, trt: Any) -> tuple[int, int] | None:
    """MAJOR.MINOR as ints, checked against the ones the builder can target (its
    `ComputeCapability` members SM75, SM89, SM120, ...)."""
    if text is None:
        return None
    if builder != "tensorrt-rtx":
        raise UsageError("--compute-capability needs --builder tensorrt-rtx: TensorRT builds for the GPU it runs on")
    match = re.fullmatch(r"(\d+)\.(\d)", text)
    if match is None:
        raise UsageError(f"--compute-capability {text!r}: expected MAJOR.MINOR, e.g. 8.9")
    known = [m.group(1) + "." + m.group(2) for m in (re.fullmatch(r"SM(\d+)(\d)", n) for n in getattr(trt.ComputeCapability, "__members__", {})) if m]
    if known and text not in known:
        raise UsageError(f"--compute-capability {text}: {builder} {trt.__version__} builds for {', '.join(known)}")
    return int(match[1]), int(match[2])


def _uses_domain(model: onnx.ModelProto, domain: str) -> bool:
    return any(n.domain == domain for n in walk_nodes(model.graph.node, *(f.node for f in model.functions)))


class _OperatorSupport:
    """`supports_operator` of a throwaway ONNX parser, cached per op type.

    The parser holds its network and builder by reference, so this object keeps all three alive.
    """

    def __init__(self, trt: Any) -> None:
        from polygraphy.backend.trt import util as trt_util

        logger = trt_util.get_trt_logger()
        self._builder = trt.Builder(logger)
        self._network = self._builder.create_network(0)
        self._parser = trt.OnnxParser(self._network, logger)
        self._cache: dict[str, bool] = {}

    def __call__(self, op_type: str) -> bool:
        if op_type not in self._cache:
            self._cache[op_type] = bool(self._parser.supports_operator(op_type))
        return self._cache[op_type]


def _reason(exc: Exception, errors: list[str]) -> str:
    """The first error TensorRT logged during the failed call (the cause; later ones follow from
    it), else the exception's last line."""
    return errors[0].splitlines()[0] if errors else str(exc).strip().splitlines()[-1]


def _parse(trt: object, path: Path, use_plugins: bool, errors: list[str]) -> tuple:
    """Polygraphy's NetworkFromOnnxPath, strongly typed; plugins win over function bodies."""
    from polygraphy.backend.trt import NetworkFromOnnxPath
    from polygraphy.exception import PolygraphyException

    flags = [trt.OnnxParserFlag.ENABLE_PLUGIN_OVERRIDE] if use_plugins and hasattr(trt.OnnxParserFlag, "ENABLE_PLUGIN_OVERRIDE") else None  # type: ignore[attr-defined]
    before = len(errors)
    try:
        return NetworkFromOnnxPath(os.fspath(path), flags=flags, strongly_typed=True)()
    except PolygraphyException as exc:
        raise UsageError(f"TensorRT's ONNX parser rejected the model: {_reason(exc, errors[before:])}") from exc


def _config(trt, builder, shape_profiles, capability, cache, workspace_mib, monitor):
    """The Polygraphy config loader for `builder`: profiles, cache, workspace, target, progress."""
    from polygraphy.backend.trt import CreateConfig, Profile

    profiles = []
    for shapes in shape_profiles:
        profile = Profile()
        for p in shapes:
            profile.add(p.name, p.min, p.opt, p.max)
        profiles.append(profile)
    options = {
        "profiles": profiles if any(shape_profiles) else None,
        "load_timing_cache": os.fspath(cache) if cache is not None and cache.is_file() else None,
        "memory_pool_limits": {trt.MemoryPoolType.WORKSPACE: workspace_mib << 20} if workspace_mib else None,
        "progress_monitor": monitor,
        "profiling_verbosity": trt.ProfilingVerbosity.DETAILED,  # the engine inspector then gives each layer's precision
    }
    if builder == "tensorrt-rtx":
        from polygraphy.backend.tensorrt_rtx import CreateConfigRTX

        loader = CreateConfigRTX(compute_capabilities=[capability] if capability else None, **options)
    else:
        loader = CreateConfig(**options)
    expected = len(profiles) if any(shape_profiles) else 0

    def checked(trt_builder, network):
        """The config, once TensorRT has taken every profile (each shape set through
        IOptimizationProfile.set_shape, which refuses a bad one)."""
        config = loader(trt_builder, network)
        if expected and config.num_optimization_profiles != expected:  # Polygraphy adds a default one to a static network
            raise DeployfuseError(f"TensorRT took {config.num_optimization_profiles} optimisation profiles of {expected}")
        return config

    return checked


def _build(network: tuple, config: object, cache: Path | None, errors: list[str]) -> object:
    from polygraphy.backend.trt import EngineBytesFromNetwork
    from polygraphy.exception import PolygraphyException

    before = len(errors)
    try:
        with warnings.catch_warnings():  # Polygraphy always sets a timing cache, which TensorRT-RTX deprecates
            warnings.simplefilter("ignore", DeprecationWarning)
            return EngineBytesFromNetwork(network, config=config, save_timing_cache=os.fspath(cache) if cache is not None else None)()
    except PolygraphyException as exc:
        raise DeployfuseError(f"TensorRT could not build the engine: {_reason(exc, errors[before:])}") from exc
