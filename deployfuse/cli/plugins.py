"""`deployfuse plugins build`: build the native custom-op libraries (CMake under plugins/)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("plugins", help="build the deployfuse custom-op libraries")
    sub = p.add_subparsers(dest="plugins_command", metavar="ACTION")
    sub.required = True
    b = sub.add_parser("build", help="build libdeployfuse_ort.so (CPU; with nvcc also its CUDA kernels and libdeployfuse_trt.so)")
    b.add_argument("--cuda", choices=("auto", "on", "off"), default="auto", help="build the CUDA kernels (default: when nvcc is on PATH)")
    b.set_defaults(run=_build)


def _build(args: argparse.Namespace) -> int:
    from deployfuse.ops.native import build_plugins

    out = build_plugins(cuda=None if args.cuda == "auto" else args.cuda == "on")
    for library in ("libdeployfuse_ort.so", "libdeployfuse_trt.so"):
        if (out / library).is_file():
            print(f"built {out / library}")
    return 0
