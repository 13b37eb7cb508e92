"""`deployfuse inspect`: what a TensorRT engine holds (layers, precisions, plugins, bindings, profiles)."""

from __future__ import annotations

import argparse
import json

SUMMARY = "show a TensorRT engine's layers, precisions, plugins, bindings and profiles"
DESCRIPTION = """\
Show what a TensorRT engine holds. Where a TensorRT runtime here can load the engine (a GPU it
was built for), through TensorRT's engine inspector; otherwise from the build record
`deployfuse build` writes beside it (ENGINE.plan.build.json: the parsed network, before
TensorRT's fusions), saying why the engine itself was not loaded.
"""
EPILOG = "exit codes: 0 shown, 2 bad input (no such file; not loadable and no build record)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("engine", metavar="ENGINE.plan", help="an engine written by `deployfuse build` (or any TensorRT engine, where it loads)")
    parser.add_argument("--plugins", action="append", metavar="LIB", help="plugin library the engine needs (repeatable; default: the ones its build loaded)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    """Print the report; errors reach the CLI as DeployfuseError."""
    from deployfuse.engine.inspect import inspect_engine

    report = inspect_engine(args.engine, plugins=args.plugins)
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    else:
        from deployfuse.tables import show

        show(report.tables())
    return 0
