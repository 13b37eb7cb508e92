"""Report tables for the terminal, drawn with `rich`.

On a terminal: a ruled header and coloured verdicts, every cell whole (a table wider than the
terminal is not squeezed into ellipses: the terminal wraps its lines). Anywhere else (a pipe, a CI log, a test):
plain text with the same rows, columns two spaces apart, no box characters, no escape codes
and no wrapping, so what a script reads is what a person sees. rich honours NO_COLOR,
FORCE_COLOR and TERM=dumb.

Reports build their tables once (`grid`, `verdict`) and offer them both ways: `plain` for
their `table()` strings, `show` for the CLI.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Iterable
from typing import IO

from rich import box
from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

_WIDE = 10_000  # a pipe has no width: never wrap a row
_GOOD, _BAD = "green", "bold red"


def grid(*columns: str, title: str | None = None, header: bool = True) -> Table:
    """A table with these column headers; a header starting with ">" is right-aligned (numbers)."""
    table = Table(title=title, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                  show_header=header, header_style="bold")
    for column in columns:
        table.add_column(column.removeprefix(">"), justify="right" if column.startswith(">") else "left", no_wrap=True)
    return table


def add(table: Table, *cells: str | Text) -> None:
    """Add a row; strings are shown as they are (never read as rich markup: "[W]", "x[0]")."""
    table.add_row(*(Text(c) if isinstance(c, str) else c for c in cells))


def line(text: str, style: str = "") -> Text:
    """A line of text between tables, shown as it is (in `style` on a terminal)."""
    return Text(text, style=style)


def verdict(text: str, good: bool) -> Text:
    """A verdict cell or line: green when good, bold red when not."""
    return Text(text, style=_GOOD if good else _BAD)


def plain(*items: RenderableType) -> str:
    """The items as plain text, one after another (see the module docstring)."""
    buffer = io.StringIO()
    _render(Console(file=buffer, width=_WIDE, color_system=None, force_terminal=False, highlight=False), items, boxes=False)
    return "\n".join(line.rstrip() for line in buffer.getvalue().rstrip("\n").splitlines())


def show(items: Iterable[RenderableType], file: IO[str] | None = None) -> None:
    """Print the items on `file` (stdout): rich on a terminal, `plain` text elsewhere."""
    out = file if file is not None else sys.stdout
    console = Console(file=out, highlight=False)
    if console.is_terminal:
        _render(console, list(items), boxes=True)
    else:
        print(plain(*items), file=out)


def _render(console: Console, items: Iterable[RenderableType], boxes: bool) -> None:
    width = console.width
    for item in items:
        ruled = item.box if isinstance(item, Table) else None
        if isinstance(item, Table):
            item.box = ruled if boxes else None
            # Never squeeze a column into an ellipsis: a terminal narrower than the table
            # wraps its lines instead.
            console.width = max(width, console.measure(item, options=console.options.update_width(_WIDE)).maximum)
        try:
            console.print(item, markup=False, soft_wrap=not isinstance(item, Table))
        finally:
            console.width = width
            if isinstance(item, Table):
                item.box = ruled


__all__ = ["add", "grid", "line", "plain", "show", "verdict"]
