"""The `deployfuse` command line: one module per command, registered in COMMANDS."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import textwrap
import warnings
from collections.abc import Sequence

from deployfuse.errors import DeployfuseError

# (command, module under deployfuse.cli). Each module has SUMMARY (its line in `deployfuse
# --help`), DESCRIPTION, EPILOG (None or text: indented lines are kept as written),
# add_arguments(parser) and run(args) -> exit code; `build_parser` makes the parsers.
COMMANDS: list[tuple[str, str]] = [
    ("export", "export"),
    ("plugins", "plugins"),
    ("build", "build"),
    ("inspect", "inspect"),
    ("compare", "compare"),
    ("run", "run"),
    ("package", "package"),
    ("serve", "serve"),
]

DESCRIPTION = """\
Export PyTorch models to fused ONNX for ONNX Runtime and TensorRT, and prove they still match.

  deployfuse export model.pt -o model.onnx --input x:1x3x224x224     fold BN, export, fuse, verify
  deployfuse compare model.pt model.onnx --input x:1x3x224x224      accuracy, latency, first diverging node
  deployfuse build model.onnx -o model.plan --fp16                   TensorRT engine (TensorRT or TensorRT-RTX)
  deployfuse plugins build                                           the ORT custom-op library and TensorRT plugins
  deployfuse run model.onnx --iterations 50                          latency through deployfuse.InferenceSession
  deployfuse package model.onnx --triton models --max-batch-size 16  a Triton model repository
  deployfuse serve model.onnx --port 8000                            a local Triton endpoint (PyTriton) until Ctrl-C

Each command's --help has the details. Exit codes: 0 ok, 1 accuracy failure, 2 bad input,
3 internal failure (one line, the traceback in a log file it names; --report still written),
130 interrupted (Ctrl-C; 143 for SIGTERM), temporary files removed.
"""


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every registered command."""
    parser = argparse.ArgumentParser(prog="deployfuse", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=_version(), help="show deployfuse's version and those of the packages it uses")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, module in COMMANDS:
        command = importlib.import_module(f"deployfuse.cli.{module}")
        subparser = sub.add_parser(name, help=command.SUMMARY, description=command.DESCRIPTION, epilog=command.EPILOG, formatter_class=HelpFormatter)
        command.add_arguments(subparser)
        subparser.set_defaults(run=command.run)
    return parser


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, except that in a description or epilog an indented line (an
    example, a table row) is kept as written; the other lines are wrapped as paragraphs."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out: list[str] = []
        paragraph: list[str] = []

        def flush() -> None:
            if paragraph:
                out.extend(textwrap.wrap(" ".join(paragraph), width, initial_indent=indent, subsequent_indent=indent))
                paragraph.clear()

        for line in text.strip("\n").splitlines():
            if line.strip() and not line[0].isspace():
                paragraph.append(line.strip())
                continue
            flush()
            out.append(indent + line.rstrip())
        flush()
        return "\n".join(out)


def _version() -> str:
    from deployfuse import provenance

    found = provenance.versions()
    return f"deployfuse {found.pop('deployfuse', '?')} ({', '.join(f'{k} {v}' for k, v in found.items())})"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse, run, and turn every outcome into one line and an exit code."""
    from deployfuse import provenance
    from deployfuse.cli import _outcome

    command = "deployfuse"
    given = list(sys.argv[1:] if argv is None else argv)
    provenance.record_command(["deployfuse", *given])  # for the reports
    with _outcome.signals_as_exceptions():
        try:
            if given == ["--version"]:  # without importing every command (torch)
                print(_version())
                return 0
            args = build_parser().parse_args(given)  # imports torch: a Ctrl-C there is caught below too
            command = f"deployfuse {args.command}"
            if not getattr(args, "verbose", False):
                # torch and transformers warn about deprecations on every load and export; users act on our errors.
                warnings.filterwarnings("ignore")
                logging.getLogger("onnxscript").setLevel(logging.ERROR)  # constant folding logs every shape it cannot evaluate
            return int(args.run(args))
        except DeployfuseError as exc:
            print(f"{command}: error: {exc}", file=sys.stderr)
            return exc.exit_code
        except KeyboardInterrupt as exc:
            return _outcome.interrupted(command, exc)
        except BrokenPipeError:  # the reader went away (`deployfuse inspect e.plan | head`): not a failure of ours
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the interpreter's final flush stays quiet
            return 141  # 128 + SIGPIPE, as a shell reports it
        except Exception as exc:
            return _outcome.internal_failure(command, given, exc)


if __name__ == "__main__":
    sys.exit(main())
