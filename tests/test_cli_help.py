"""Every command's --help: made by one parser factory, descriptions wrapped to the terminal,
the epilog's indented lines (examples, tables) kept as written, and --rtol stated as one rule."""

from __future__ import annotations

import pytest

from deployfuse.cli import COMMANDS

WIDTH = 80


@pytest.mark.parametrize("command", [name for name, _ in COMMANDS])
def test_help_wraps_prose_and_keeps_examples(cli, monkeypatch, command):
    from deployfuse.cli import build_parser

    monkeypatch.setenv("COLUMNS", str(WIDTH))
    code, out, _ = cli(command, "--help")
    assert code == 0 and out.startswith(f"usage: deployfuse {command}")
    parser = build_parser()._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
    first_words = " ".join(parser.description.split()[:6])
    assert first_words in " ".join(out.split())  # the description is shown, re-wrapped
    kept = [line for line in (parser.epilog or "").splitlines() if line[:1].isspace()]
    assert all(line.rstrip() in out for line in kept)  # indented epilog lines exactly as written
    prose = out.split("\n\n")[1]  # the description paragraph
    assert max(len(line) for line in prose.splitlines()) <= WIDTH


def test_rtol_is_one_rule_in_both_commands(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # one help line per option
    rule = "<= atol + rtol * |reference|"
    _, compare_help, _ = cli("compare", "--help")
    _, export_help, _ = cli("export", "--help")
    assert rule in compare_help and "export's --rtol is the same" in compare_help
    assert "an element passes when |onnx - torch| <= atol + R * |torch|, atol being R * the output's max |value|" in export_help
