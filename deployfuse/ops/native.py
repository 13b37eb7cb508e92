"""Building and finding the native deployfuse libraries (plugins/, CMake underneath).

The sources are plugins/ in a source checkout, or the copy an installed wheel carries in
deployfuse/_plugins (setup.py puts it there). Libraries are built in build/ beside the sources,
or, when that folder is not writable (a system-wide install), in the user's cache
($XDG_CACHE_HOME or ~/.cache)/deployfuse/<version>/plugins.

ONNX Runtime's wheels ship no C++ headers: they come from ONNXRUNTIME_INCLUDE_DIR, a system
install, or Debian's libonnxruntime-dev (API 21, fetched with apt-get options that leave the
system's apt configuration alone) cached in <build>/ort-include. TensorRT's headers come
from TENSORRT_INCLUDE_DIR, a system install, or the `kernel-lens` wheel on PyPI (it carries the
Apache-2.0 TensorRT 10 headers; fetched with pip, never installed) cached in
<build>/trt-include. The TensorRT plugin library needs the CUDA build (nvcc).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from deployfuse.errors import UsageError


def plugin_sources() -> Path:
    """The folder holding the plugins' CMakeLists.txt: the checkout's plugins/, else the copy
    installed in the package (returned even when missing; `build_plugins` says so)."""
    package = Path(__file__).resolve().parents[1]
    checkout = package.parent / "plugins"
    return checkout if (checkout / "CMakeLists.txt").is_file() else package / "_plugins"


def build_root(sources: Path) -> Path:
    """Where libraries and fetched headers go: beside the sources when that folder is writable,
    else a per-version folder in the user's cache."""
    if os.access(sources, os.W_OK):
        return sources / "build"
    from deployfuse import __version__

    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "deployfuse" / __version__ / "plugins"


PLUGINS = plugin_sources()
BUILD = build_root(PLUGINS)
_HEADER = "onnxruntime_cxx_api.h"
_DEBIAN = "deb http://deb.debian.org/debian trixie main\n"
_TRT_HEADER = "NvInferRuntime.h"
_TRT_HEADERS_WHEEL = "kernel-lens==2.0.1"  # TensorRT 10.14 headers under kernel_lens/include/tensorrt/


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


def trt_include_dir(fetch: bool = True) -> Path:
    """A directory holding NvInferRuntime.h; fetches the headers from PyPI when none is found."""
    for cand in (os.environ.get("TENSORRT_INCLUDE_DIR"), str(BUILD / "trt-include"), "/usr/include/x86_64-linux-gnu", "/usr/include", "/usr/local/tensorrt/include"):
        if cand and (Path(cand) / _TRT_HEADER).is_file():
            return Path(cand)
    if not fetch:
        raise UsageError("TensorRT C++ headers not found: set TENSORRT_INCLUDE_DIR or run `deployfuse plugins build --cuda on`")
    with tempfile.TemporaryDirectory() as tmp:
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", tmp, _TRT_HEADERS_WHEEL])
        target = BUILD / "trt-include"
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        with zipfile.ZipFile(next(Path(tmp).glob("*.whl"))) as wheel:
            for name in wheel.namelist():
                if name.startswith("kernel_lens/include/tensorrt/") and name.endswith(".h"):
                    (target / Path(name).name).write_bytes(wheel.read(name))
    if not (target / _TRT_HEADER).is_file():
        raise UsageError(f"{_TRT_HEADERS_WHEEL} no longer carries {_TRT_HEADER}: set TENSORRT_INCLUDE_DIR")
    return target


def build_plugins(cuda: bool | None = None, tensorrt: bool | None = None) -> Path:
    """Configure and build plugins/ (CPU ORT library; CUDA too when nvcc exists and cuda is not
    False; with CUDA, the TensorRT plugins too unless tensorrt is False — True makes missing
    TensorRT headers an error instead of a skip). Returns the build directory."""
    if not (PLUGINS / "CMakeLists.txt").is_file():
        raise UsageError(f"the deployfuse plugin sources are missing ({PLUGINS}): reinstall deployfuse")
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise UsageError(f"building the deployfuse plugins needs `{tool}` on PATH")
    cuda = shutil.which("nvcc") is not None if cuda is None else cuda
    out = BUILD / ("cuda" if cuda else "cpu")
    cmd = ["cmake", "-S", str(PLUGINS), "-B", str(out), f"-DONNXRUNTIME_INCLUDE_DIR={ort_include_dir()}", "-DCMAKE_BUILD_TYPE=Release",
           f"-DDEPLOYFUSE_CUDA={'ON' if cuda else 'OFF'}", f"-DDEPLOYFUSE_PYTHON={sys.executable}"]
    if cuda:  # given every time: a build directory may have cached nvcc's own default (sm_75 for CUDA 13)
        cmd.append(f"-DCMAKE_CUDA_ARCHITECTURES={os.environ.get('CUDAARCHS', '80;90')}")
    if cuda and tensorrt is not False:
        try:
            cmd.append(f"-DTENSORRT_INCLUDE_DIR={trt_include_dir()}")
        except UsageError:
            if tensorrt:
                raise
    if shutil.which("ninja"):
        cmd += ["-G", "Ninja"]
    BUILD.mkdir(parents=True, exist_ok=True)
    with open(BUILD / f".{out.name}.lock", "w") as lock:  # one build of a flavour at a time (pytest -n)
        fcntl.flock(lock, fcntl.LOCK_EX)
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


def trt_plugins_library(build: bool = True) -> Path:
    """Path of libdeployfuse_trt.so (TensorRT IPluginV3 plugins), building it if needed.

    Load it with `IPluginRegistry.load_library` (TensorRT >= 10 or TensorRT-RTX). Raises
    UsageError naming what is missing (nvcc, TensorRT headers, cmake, a compiler)."""
    lib = BUILD / "cuda" / "libdeployfuse_trt.so"
    if lib.is_file():
        return lib
    if not build:
        raise UsageError("libdeployfuse_trt.so is not built: run `deployfuse plugins build --cuda on`")
    if shutil.which("nvcc") is None:
        raise UsageError("libdeployfuse_trt.so needs the CUDA toolkit (nvcc on PATH) to compile its kernels")
    return build_plugins(cuda=True, tensorrt=True) / "libdeployfuse_trt.so"
