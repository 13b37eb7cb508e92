"""Where a result came from: package versions, device, threads, seed, command line and time.

Every JSON and HTML report carries this block, so a figure can be traced to the software and
machine that made it and the run repeated. Versions come from the installed distributions'
metadata (nothing is imported for them); the GPU name comes from torch only when torch is
already imported and sees a CUDA device.
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Any

# Reported name -> the distributions that provide it, first installed wins (onnxruntime-gpu
# is the CUDA build of onnxruntime; TensorRT ships as per-CUDA wheels, TensorRT-RTX apart).
PACKAGES: dict[str, tuple[str, ...]] = {
    "deployfuse": ("deployfuse",),
    "torch": ("torch",),
    "onnx": ("onnx",),
    "onnxruntime": ("onnxruntime-gpu", "onnxruntime"),
    "onnxscript": ("onnxscript",),
    "polygraphy": ("polygraphy",),
    "tensorrt": ("tensorrt", "tensorrt-cu13", "tensorrt-cu12"),
    "tensorrt-rtx": ("tensorrt-rtx-cu13", "tensorrt-rtx-cu12", "tensorrt-rtx"),
    "transformers": ("transformers",),
}

_command: list[str] | None = None


def record_command(argv: Sequence[str]) -> None:
    """Remember the command line a CLI run was given (the CLI calls this before running)."""
    global _command
    _command = list(argv)


def command_line() -> str:
    """The recorded command line, else this process's own."""
    argv = _command if _command is not None else [os.path.basename(sys.argv[0]) or "python", *sys.argv[1:]]
    return shlex.join(argv)


def versions() -> dict[str, str]:
    """Installed versions of deployfuse and the packages its results depend on (absent ones
    left out); the value names the distribution when it is not the reported name."""
    found: dict[str, str] = {}
    for name, distributions in PACKAGES.items():
        for distribution in distributions:
            try:
                version = metadata.version(distribution)
            except metadata.PackageNotFoundError:
                continue
            module = sys.modules.get(name)
            version = getattr(module, "__version__", version) if module is not None else version  # torch's has its CUDA tag
            found[name] = version if distribution == name else f"{version} ({distribution})"
            break
    return found


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else what the platform module says."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def onnxruntime_providers() -> list[str]:
    """The execution providers the imported ONNX Runtime offers (CUDA build or not)."""
    ort = sys.modules.get("onnxruntime")
    return list(ort.get_available_providers()) if ort is not None and hasattr(ort, "get_available_providers") else []


def gpus() -> list[str]:
    """Names of the CUDA devices torch sees, when torch is already imported; else none."""
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    try:
        if not torch.cuda.is_available():
            return []
        return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:  # a broken driver must not break a report
        return []


def threads() -> dict[str, Any]:
    """CPU cores, torch's intra-op threads and the thread variables that steer ORT and BLAS."""
    torch = sys.modules.get("torch")
    found: dict[str, Any] = {"cpu_count": os.cpu_count()}
    if torch is not None:
        found["torch"] = torch.get_num_threads()
    found.update({v: os.environ[v] for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") if v in os.environ})
    return found


def collect(seed: int | None = None) -> dict[str, Any]:
    """The provenance block: versions, device, threads, seed, command line and UTC time."""
    return {
        "versions": versions(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": {"cpu": cpu_model(), "gpus": gpus(), "onnxruntime_providers": onnxruntime_providers()},
        "threads": threads(),
        "seed": seed,
        "command": command_line(),
        "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def summary(block: dict[str, Any]) -> list[tuple[str, str]]:
    """The block as (label, text) rows for a table (HTML reports)."""
    device = block.get("device", {})
    rows = [(name, version) for name, version in block.get("versions", {}).items()]
    rows += [("python", block.get("python", "")), ("platform", block.get("platform", "")), ("cpu", device.get("cpu", "")),
             ("gpus", ", ".join(device.get("gpus", [])) or "none"),
             ("ONNX Runtime providers", ", ".join(device.get("onnxruntime_providers", []))),
             ("threads", ", ".join(f"{k} {v}" for k, v in block.get("threads", {}).items())),
             ("seed", "random" if block.get("seed") is None else str(block["seed"])),
             ("command", block.get("command", "")), ("time (UTC)", block.get("time_utc", ""))]
    return rows


__all__ = ["PACKAGES", "collect", "command_line", "record_command", "summary", "versions"]
