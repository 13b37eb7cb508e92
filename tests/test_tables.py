"""Terminal tables: colour and rules on a terminal, plain parseable text in a pipe."""

from __future__ import annotations

import io
import re

from deployfuse import tables
from deployfuse.report import ExportReport, Step

ESCAPE = re.compile(r"\x1b\[")
BOX = re.compile(r"[\u2500-\u257f]")  # box-drawing characters


def _report() -> ExportReport:
    report = ExportReport("m.pt", "m.onnx", "ort-cpu", "fp32", 18)
    report.steps = [Step("load", "ok", 1.25, "huggingface"), Step("fuse", "skipped", 0.0, "--no-fuse [x]"), Step("verify", "failed", 0.5, "x" * 300)]
    report.verify = [{"shapes": {"input_ids": [2, 16]}, "draw": d, "outputs": [{"name": "logits[0]", "max_abs_error": 1e-7 * (d + 1), "max_rel_error": 2e-7,
                                                                              "tolerance": 1e-4, "passed": d != 1}]} for d in range(3)]
    return report


def test_piped_tables_are_plain_columns_that_never_wrap():
    out = io.StringIO()  # not a terminal
    tables.show(_report().tables(), file=out)
    text = out.getvalue()
    assert text == _report().table() + "\n"
    assert not ESCAPE.search(text) and not BOX.search(text)
    lines = text.splitlines()
    assert lines[0].split() == ["step", "status", "time", "detail"]
    assert lines[2].split() == ["fuse", "skipped", "0.00s", "--no-fuse", "[x]"], "text is shown as it is, never read as markup"
    assert lines[3].endswith("x" * 300), "a long row stays on one line"
    rows = [line.split() for line in lines if line.strip().startswith(("1 ", "2 ", "3 "))]
    assert [(r[0], r[1], float(r[2]), r[-1]) for r in rows] == [("1", "logits[0]", 1e-7, "ok"), ("2", "logits[0]", 2e-7, "FAIL"), ("3", "logits[0]", 3e-7, "ok")]
    assert all(line == line.rstrip() for line in lines)


def test_terminal_tables_have_colour_and_a_ruled_header(monkeypatch):
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("TERM", raising=False)
    out = io.StringIO()
    tables.show(_report().tables(), file=out)
    text = out.getvalue()
    assert ESCAPE.search(text) and BOX.search(text)
    assert "\x1b[1;31mFAIL" in text and "\x1b[32mok" in text  # red failure, green pass
    monkeypatch.setenv("COLUMNS", "40")  # a narrow terminal: the lines get long, no cell is cut to an ellipsis
    out = io.StringIO()
    tables.show(_report().tables(), file=out)
    assert "\u2026" not in out.getvalue() and "logits[0]" in out.getvalue() and "1.000e-07" in out.getvalue()
    monkeypatch.setenv("NO_COLOR", "1")
    out = io.StringIO()
    tables.show(_report().tables(), file=out)
    assert "\x1b[32m" not in out.getvalue(), "NO_COLOR drops the colours"
