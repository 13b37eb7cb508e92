"""`deployfuse plugins build`: build the native custom-op libraries (CMake under plugins/)."""

from __future__ import annotations

import argparse

SUMMARY = "build the deployfuse custom-op libraries"
DESCRIPTION = "Build the native libraries under plugins/ with CMake: the ONNX Runtime custom-op library and the TensorRT plugins."
EPILOG = None


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="plugins_command", metavar="ACTION")
    sub.required = True
    b = sub.add_parser("build", help="build libdeployfuse_ort.so (CPU; with nvcc also its CUDA kernels and libdeployfuse_trt.so)")
    b.add_argument("--cuda", choices=("auto", "on", "off"), default="auto", help="build the CUDA kernels (default: when nvcc is on PATH)")


def run(args: argparse.Namespace) -> int:
    """`plugins build` (its one action)."""
    from deployfuse.ops.native import build_plugins

    out = build_plugins(cuda=None if args.cuda == "auto" else args.cuda == "on")
    for library in ("libdeployfuse_ort.so", "libdeployfuse_trt.so"):
        if (out / library).is_file():
            print(f"built {out / library}")
    return 0
