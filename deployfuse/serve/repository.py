"""`package_triton`: a Triton model repository from a deployfuse artefact, written atomically.

    REPO/
      README.md                  the tritonserver command, and what the config could not carry
      NAME/
        config.pbtxt             checked against Triton's ModelConfig schema before anything is written
        1/model.onnx             (or 1/model.plan), with its external data files
        libdeployfuse_ort.so     when the graph has deployfuse.* nodes (libdeployfuse_trt.so for engines)

The repository is assembled in a hidden folder beside REPO and renamed into place, so a failure
leaves nothing half-written, and `force` replaces an existing repository only once the new one
is complete.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from deployfuse.errors import UsageError
from deployfuse.interrupts import held
from deployfuse.io import load_onnx, temporary_folder
from deployfuse.serve import triton_config
from deployfuse.serve.readme import repository_readme
from deployfuse.serve.signature import Signature, engine_signature, engine_signature_from_onnx, signature_of

ONNX_SUFFIXES = (".onnx",)
ENGINE_SUFFIXES = (".plan", ".engine", ".trt")
ORT_LIBRARY = "libdeployfuse_ort.so"
TRT_LIBRARY = "libdeployfuse_trt.so"


@dataclass
class PackageResult:
    """What `package_triton` wrote."""

    repository: Path
    name: str
    platform: str
    config: str
    signature: Signature
    library: Path | None = None
    unsupported: dict[str, str] = field(default_factory=dict)
    served_from: str = ""

    def summary(self) -> str:
        """A few lines for the terminal."""
        lines = [
            f"repository  {self.repository}",
            f"model       {self.name} ({self.platform})",
            "inputs      " + ", ".join(f"{t.name} {t.triton_type}" for t in self.signature.inputs),
            "outputs     " + ", ".join(f"{t.name} {t.triton_type}" for t in self.signature.outputs),
        ]
        if self.library is not None:
            lines.append(f"library     {self.library.name} (copied beside the model)")
        lines += [f"not carried {key}: {why}" for key, why in self.unsupported.items()]
        lines.append(f"serve with  tritonserver --model-repository={self.served_from or self.repository.resolve()}  (see {self.repository / 'README.md'})")
        return "\n".join(lines)


def artefact_kind(path: Path) -> str:
    """"onnx" or "tensorrt" from the file name; anything else is refused."""
    if not path.is_file():
        raise UsageError(f"no such artefact: {path}")
    suffix = path.suffix.lower()
    if suffix in ONNX_SUFFIXES:
        return "onnx"
    if suffix in ENGINE_SUFFIXES:
        return "tensorrt"
    raise UsageError(f"unknown artefact type {path.name!r}: expected an ONNX model ({', '.join(ONNX_SUFFIXES)}) or a TensorRT engine ({', '.join(ENGINE_SUFFIXES)})")


def package_triton(
    artefact: str | os.PathLike[str],
    repository: str | os.PathLike[str],
    *,
    name: str | None = None,
    max_batch_size: int = 0,
    instances: int = 1,
    device: str = "gpu",
    dynamic_batching: bool = False,
    force: bool = False,
    source_onnx: str | os.PathLike[str] | None = None,
    profiles: Sequence[object] = (),
    served_from: str | None = None,
) -> PackageResult:
    """Write a Triton model repository serving `artefact` at `repository`.

    Args:
        artefact: an ONNX model or a serialized TensorRT engine (.plan).
        repository: the folder to create; an existing non-empty one needs `force`.
        name: the model's name in Triton (default: the artefact's file stem).
        max_batch_size: > 0 lets Triton batch requests along the batch axis, up to this many.
        instances: model instances (execution copies) per device.
        device: "gpu" or "cpu" (the instance group kind).
        dynamic_batching: let Triton stack concurrent requests (needs max_batch_size > 0).
        force: replace an existing non-empty repository.
        source_onnx: for an engine that cannot be opened here (no GPU): the ONNX model it was
            built from; its dims and `profiles` (ShapeProfile, as `deployfuse build` resolves
            them) stand for the engine's.
        profiles: see `source_onnx`.
        served_from: the path the server sees the repository at (e.g. /models in a container),
            used for the custom-op library path in config.pbtxt; default: the repository's
            absolute path here.

    Raises:
        UsageError: bad input; nothing is written.
    """
    source = Path(artefact)
    kind = artefact_kind(source)
    target = Path(repository)
    _check_target(target, force)
    model_name = name if name is not None else source.stem
    options = triton_config.ServingOptions(model_name, max_batch_size, instances, device, dynamic_batching)
    triton_config.check_model_name(model_name)
    served_root = served_from or str(target.resolve())

    library: Path | None = None
    unsupported: dict[str, str] = {}
    if kind == "onnx":
        header = load_onnx(source, weights=False)
        signature = signature_of(header)
        triton_config.check_options(signature, options)
        from deployfuse.runtime import artefact_provider_options, native_library_for

        cuda = triton_config.map_cuda_options(artefact_provider_options(header))
        unsupported = dict(cuda.unsupported)
        library = native_library_for(header)
        if library is None and _uses_deployfuse(header):
            unsupported["deployfuse custom-op library"] = "not built here (`deployfuse plugins build`): the deployfuse.* nodes run as their ONNX function bodies"
        op_path = f"{served_root}/{model_name}/{ORT_LIBRARY}" if library is not None else None
        config = triton_config.onnx_config(signature, options, cuda, op_path)
        files = [(source, Path("1") / "model.onnx")] + [(source.parent / loc, Path("1") / loc) for loc in _external_files(header)]
        platform = triton_config.ONNX_PLATFORM
    else:
        built_from = load_onnx(source_onnx, weights=False) if source_onnx is not None else None
        signature = _engine_signature(source, built_from, profiles)
        triton_config.check_options(signature, options)
        config = triton_config.tensorrt_config(signature, options)
        files = [(source, Path("1") / "model.plan")]
        library = _trt_plugin_library(built_from)
        platform = triton_config.TENSORRT_PLATFORM
    triton_config.validate(config)
    if library is not None:
        files.append((library, Path(library.name)))
    readme = repository_readme(model_name, platform, served_root, signature, options, library, unsupported)

    _write_atomically(target, force, model_name, config, files, readme)
    return PackageResult(target, model_name, platform, config, signature, library, unsupported, served_root)


def _check_target(target: Path, force: bool) -> None:
    parent = target.resolve().parent
    if not parent.is_dir():
        raise UsageError(f"the folder to create the repository in does not exist: {parent}")
    if target.exists() and not target.is_dir():
        raise UsageError(f"{target} exists and is not a folder")
    if target.is_dir() and any(target.iterdir()) and not force:
        raise UsageError(f"{target} exists and is not empty: choose another folder or pass --force to replace it")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"cannot write in {parent}")


def _uses_deployfuse(model: onnx.ModelProto) -> bool:
    from deployfuse.runtime import uses_deployfuse_ops

    return uses_deployfuse_ops(model)


def _external_files(model: onnx.ModelProto) -> list[str]:
    """Relative locations of the external data files the model's weights live in."""
    locations: set[str] = set()
    for tensor in model.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            locations.update(e.value for e in tensor.external_data if e.key == "location")
    return sorted(locations)


def _engine_signature(engine: Path, built_from: onnx.ModelProto | None, profiles: Sequence[object]) -> Signature:
    if built_from is None:
        return engine_signature(engine)
    from deployfuse.engine.profiles import export_shapes, model_inputs, resolve_profiles

    resolved = resolve_profiles(model_inputs(built_from), list(profiles), export_shapes(built_from))  # type: ignore[arg-type]
    return engine_signature_from_onnx(built_from, {p.name: (p.min, p.opt, p.max) for p in resolved})


def _trt_plugin_library(built_from: onnx.ModelProto | None) -> Path | None:
    """deployfuse's TensorRT plugin library when it is built (and, when the source model is
    known, only if it has deployfuse.* nodes): an engine that uses the plugins needs it loaded."""
    from deployfuse.ops import trt_plugins_library

    if built_from is not None and not _uses_deployfuse(built_from):
        return None
    try:
        return trt_plugins_library(build=False)
    except UsageError:
        return None


def _write_atomically(target: Path, force: bool, name: str, config: str, files: list[tuple[Path, Path]], readme: str) -> None:
    parent = target.resolve().parent
    with temporary_folder(parent, f".{target.name}.", ".part") as staging, temporary_folder(parent, f".{target.name}.", ".old") as old:
        model_dir = staging / name
        (model_dir / "1").mkdir(parents=True)
        (model_dir / "config.pbtxt").write_text(config)
        for src, rel in files:
            if not src.is_file():
                raise UsageError(f"missing file the model needs: {src}")
            dst = model_dir / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
        (staging / "README.md").write_text(readme)
        os.chmod(staging, 0o755)  # mkdtemp makes 0700; a repository is read by the server's user
        with held():  # the two renames, uninterrupted: a signal between them would lose the previous repository
            if target.exists():
                if not force and any(target.iterdir()):
                    raise UsageError(f"{target} appeared while packaging and is not empty")
                os.replace(target, old / "repo")
            try:
                os.replace(staging, target)
            except OSError:
                if (old / "repo").exists() and not target.exists():
                    os.replace(old / "repo", target)  # put the previous repository back
                raise
