"""Argument groups shared by the commands (model inputs), with deployfuse's error messages."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

from deployfuse.errors import UsageError
from deployfuse.inputs import DynamicAxis, InputSpec

T = TypeVar("T")


def argument_type(parse: Callable[[str], T]) -> Callable[[str], T]:
    """Wrap a parser raising UsageError so argparse reports our message (exit 2)."""

    def convert(text: str) -> T:
        try:
            return parse(text)
        except UsageError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc

    convert.__name__ = parse.__qualname__
    return convert


def add_model_input_arguments(parser: argparse.ArgumentParser) -> None:
    """--input, --example-inputs, --dynamic and --trust-pickle: how a command gets model inputs."""
    group = parser.add_argument_group("model inputs")
    group.add_argument("--input", dest="inputs", action="append", default=[], type=argument_type(InputSpec.parse), metavar="NAME:SHAPE[:DTYPE]",
                       help="an input to make random values for, e.g. input_ids:1x128:int64 (repeat per input)")
    group.add_argument("--example-inputs", metavar="FILE.pt", help="a tuple or dict of tensors saved with torch.save")
    group.add_argument("--dynamic", action="append", default=[], type=argument_type(DynamicAxis.parse), metavar="NAME:AXIS:LABEL",
                       help="an axis that varies at run time, e.g. input_ids:1:seq (repeat per axis)")
    group.add_argument("--trust-pickle", action="store_true", help="allow loading a pickled module (runs code from the file)")
