"""Building and finding the native deployfuse libraries (plugins/, CMake underneath).

ONNX Runtime's wheels ship no C++ headers: they come from ONNXRUNTIME_INCLUDE_DIR, a system
install, or Debian's libonnxruntime-dev (API 21, fetched with apt-get options that leave the
system's apt configuration alone) cached in plugins/build/ort-include.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from deployfuse.errors import UsageError

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"
BUILD = PLUGINS / "build"
_HEADER = "onnxruntime_cxx_api.h"
_DEBIAN = "deb http://deb.debian.org/debian trixie main\n"


def _run(cmd: list[str], cwd: Path | None = None) -> None:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise UsageError(f"`{' '.join(cmd[:3])} ...` failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")


def ort_include_dir(fetch: bool = True) -> Path:
    """A directory holding onnxruntime_cxx_api.h; fetches Debian's headers when none is found."""
    for cand in (os.environ.get("ONNXRUNTIME_INCLUDE_DIR"), str(BUILD / "ort-include"), "/usr/include/onnxruntime", "/usr/local/include/onnxruntime"):
        if cand and (Path(cand) / _HEADER).is_file():
            return Path(cand)
    if not fetch:
        raise UsageError("ONNX Runtime C++ headers not found: set ONNXRUNTIME_INCLUDE_DIR or run `deployfuse plugins build`")
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise UsageError("ONNX Runtime C++ headers not found and apt-get/dpkg-deb are missing to fetch them: set ONNXRUNTIME_INCLUDE_DIR")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "sources.list").write_text(_DEBIAN)
        (work / "lists" / "partial").mkdir(parents=True)
        opts = [f"-oDir::Etc::SourceList={work / 'sources.list'}", "-oDir::Etc::SourceParts=/dev/null", f"-oDir::State::Lists={work / 'lists'}", "-oAPT::Sandbox::User=root", "-q"]
        _run(["apt-get", *opts, "update"])
        _run(["apt-get", *opts, "download", "libonnxruntime-dev"], cwd=work)
        deb = next(work.glob("libonnxruntime-dev_*.deb"))
        _run(["dpkg-deb", "-x", str(deb), str(work / "x")])
        target = BUILD / "ort-include"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(work / "x" / "usr" / "include" / "onnxruntime", target)
    return target


def build_plugins(cuda: bool | None = None) -> Path:
    """Configure and build plugins/ (CPU ORT library; CUDA too when nvcc exists and cuda is not
    False). Returns the build directory."""
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise UsageError(f"building the deployfuse plugins needs `{tool}` on PATH")
    cuda = shutil.which("nvcc") is not None if cuda is None else cuda
    out = BUILD / ("cuda" if cuda else "cpu")
    cmd = ["cmake", "-S", str(PLUGINS), "-B", str(out), f"-DONNXRUNTIME_INCLUDE_DIR={ort_include_dir()}", "-DCMAKE_BUILD_TYPE=Release", f"-DDEPLOYFUSE_CUDA={'ON' if cuda else 'OFF'}"]
    if shutil.which("ninja"):
        cmd += ["-G", "Ninja"]
    _run(cmd)
    _run(["cmake", "--build", str(out), "-j", str(os.cpu_count() or 2)])
    return out


def ort_custom_ops_library(build: bool = True) -> Path:
    """Path of libdeployfuse_ort.so (CUDA build preferred), building the CPU one if needed.

    Raises UsageError naming what is missing (headers, cmake, a compiler)."""
    for flavour in ("cuda", "cpu"):
        lib = BUILD / flavour / "libdeployfuse_ort.so"
        if lib.is_file():
            return lib
    if not build:
        raise UsageError("libdeployfuse_ort.so is not built: run `deployfuse plugins build`")
    return build_plugins(cuda=False) / "libdeployfuse_ort.so"
