"""More than forty bad inputs across export, compare, build, plugins, package and serve, as a careful user and a
hostile one would give them. Each row checks the exit code, a one-line message without a
traceback, that no file in the folder changed or appeared (inputs hashed before and after),
and, where one is promised, that the report was written."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import deployfuse
from deployfuse.inputs import InputSpec


class Small(torch.nn.Module):
    """Linear + GELU + LayerNorm: small, and not bit-exact between PyTorch and ONNX Runtime."""

    def __init__(self) -> None:
        super().__init__()
        self.linear, self.norm = torch.nn.Linear(64, 64), torch.nn.LayerNorm(64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(torch.nn.functional.gelu(self.linear(x)))


class SmallConv(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x).relu()


FACTORIES = '''
import torch

def raises():
    raise RuntimeError("boom: the factory failed")

def not_module():
    return 42


class Noisy(torch.nn.Module):
    """Random in its forward: no export can match it."""

    def forward(self, x):
        return x + torch.rand_like(x)


def noisy():
    return Noisy(), (torch.randn(2, 8),)
'''


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A folder of models, bad files and special files that every row runs in."""
    root = tmp_path_factory.mktemp("bad_inputs")
    torch.manual_seed(0)
    small = Small().eval()
    torch.jit.save(torch.jit.trace(small, torch.randn(2, 64)), root / "small.ts")
    torch.jit.save(torch.jit.trace(SmallConv().eval(), torch.randn(1, 3, 8, 8)), root / "conv.ts")
    torch.save(small.state_dict(), root / "weights.pt")
    torch.save(small, root / "pickled.pt")
    torch.save({"x": torch.randn(2, 64)}, root / "example.pt")
    torch.export.save(torch.export.export(small, (torch.randn(2, 64),)), root / "static.pt2")
    deployfuse.export(root / "small.ts", root / "small.onnx", inputs=[InputSpec("x", (2, 64))], verify=False)
    (root / "notes.txt").write_text("not a model\n")
    (root / "corrupt.pt").write_bytes(b"PK\x03\x04" + os.urandom(200))
    (root / "bad_factories.py").write_text(FACTORIES)
    (root / "broken_syntax.py").write_text("def build(:\n    return None\n")
    os.mkfifo(root / "fifo.onnx")
    os.symlink("small.ts", root / "link.ts")
    os.link(root / "small.onnx", root / "hardlink.onnx")
    (root / "out").mkdir()
    (root / "adir").mkdir()
    (root / "adir" / "kept.txt").write_text("a file of a model folder\n")
    return root


def _snapshot(root: Path) -> dict[str, str]:
    """Every entry under `root`: a hash for regular files, the kind for the rest."""
    seen = {}
    for path in sorted(root.rglob("*")):
        if "__pycache__" in path.parts:
            continue
        mode = path.lstat().st_mode
        rel = str(path.relative_to(root))
        seen[rel] = hashlib.sha256(path.read_bytes()).hexdigest() if stat.S_ISREG(mode) else stat.filemode(mode)[0]
    return seen


E, C, B = "export", "compare", "build"
EXPORT = ["small.ts", "-o", "out/m.onnx", "-q"]  # a good export, which rows add one bad flag to
COMPARE = ["small.ts", "small.onnx", "--iterations", "0", "-q"]
BUILD = ["small.onnx", "-o", "out/e.plan", "-q"]

# (command, arguments, exit code, a part of the one-line message, files the run must write)
ROWS = [
    # export: the model
    (E, ["missing.pt", "-o", "out/m.onnx"], 2, "model not found", ()),
    (E, ["notes.txt", "-o", "out/m.onnx"], 2, "not a PyTorch model file", ()),
    (E, ["weights.pt", "-o", "out/m.onnx", "--input", "x:2x64"], 2, "holds weights (a state dict), not a model", ()),
    (E, ["pickled.pt", "-o", "out/m.onnx", "--input", "x:2x64"], 2, "--trust-pickle", ()),
    (E, ["corrupt.pt", "-o", "out/m.onnx", "--input", "x:2x64"], 2, "not a PyTorch model file", ()),
    (E, ["adir", "-o", "out/m.onnx"], 2, "adir", ()),
    (E, ["no_such_package.module:build", "-o", "out/m.onnx"], 2, "cannot import 'no_such_package.module'", ()),
    (E, ["bad_factories:raises", "-o", "out/m.onnx"], 2, "raised RuntimeError: boom: the factory failed", ()),
    (E, ["bad_factories:not_module", "-o", "out/m.onnx"], 2, "returned a int, not a torch.nn.Module", ()),
    (E, ["bad_factories:missing", "-o", "out/m.onnx"], 2, "has no attribute 'missing'", ()),
    (E, ["broken_syntax:build", "-o", "out/m.onnx"], 2, "SyntaxError", ()),
    # export: inputs and axes
    (E, EXPORT, 2, "no inputs to export with: give --input NAME:SHAPE[:DTYPE] for x", ()),
    (E, [*EXPORT, "--input", "x:2x63"], 2, "the model rejects inputs x:2x63:float32", ()),
    (E, [*EXPORT, "--input", "image:2x64"], 2, "the model's inputs are x", ()),
    (E, [*EXPORT, "--input", "x:100000x100000"], 2, "of memory available", ()),
    (E, [*EXPORT, "--input", "x:1by3"], 2, "SHAPE must be positive integers", ()),
    (E, [*EXPORT, "--input", "x:2x64:float99"], 2, "unknown dtype", ()),
    (E, [*EXPORT, "--example-inputs", "nowhere.pt"], 2, "example inputs file not found", ()),
    (E, [*EXPORT, "--example-inputs", "notes.txt"], 2, "could not load example inputs", ()),
    (E, [*EXPORT, "--input", "x:2x64", "--dynamic", "y:0:b", "--no-verify"], 2, "--dynamic names input 'y', which is not among the inputs: x", ()),
    (E, [*EXPORT, "--input", "x:2x64", "--dynamic", "x:2:b"], 2, "input x has rank 2", ()),
    (E, [*EXPORT, "--input", "x:2x64", "--dynamic", "x:zero:b"], 2, "expected NAME:AXIS:LABEL", ()),
    (E, ["static.pt2", "-o", "out/m.onnx", "-q", "--dynamic", "x:0:batch"], 2, "the .pt2 program fixes axis 0 of x to 2", ()),
    # export: options
    (E, [*EXPORT, "--input", "x:2x64", "--opset", "5"], 2, "--opset 5 is not supported: choose 14 to 25", ()),
    (E, [*EXPORT, "--input", "x:2x64", "--opset", "99"], 2, "--opset 99 is not supported: choose 14 to 25", ()),
    (E, [*EXPORT, "--input", "x:2x64", "--rtol", "-1"], 2, "--rtol must be a positive number", ()),
    (E, [*EXPORT, "--input", "x:2x64", "--rtol", "0"], 2, "--rtol must be a positive number", ()),
    (E, [*EXPORT, "--input", "x:2x64", "--rtol", "nan"], 2, "--rtol must be a positive number", ()),
    (E, [*EXPORT, "--input", "x:2x64", "--target", "tpu"], 2, "invalid choice: 'tpu'", ()),
    (E, [*EXPORT, "--input", "x:2x64", "--precision", "fp8"], 2, "--precision fp8 needs --target tensorrt or ort-cuda", ()),
    (E, [*EXPORT, "--input", "x:2x64", "--cuda-graph"], 2, "--cuda-graph needs --target ort-cuda", ()),
    (E, [*EXPORT, "--input", "x:2x64", "--no-tf32"], 2, "--no-tf32 is an ONNX Runtime CUDA option", ()),
    (E, ["conv.ts", "-o", "out/m.onnx", "-q", "--input", "x:1x3x8x8", "--precision", "bf16"], 2, "cannot run this bfloat16 model", ()),
    # export: outputs
    (E, ["small.ts", "-o", "small.ts", "--input", "x:2x64"], 2, "-o small.ts is the MODEL of this run", ()),
    (E, ["small.ts", "-o", "link.ts", "--input", "x:2x64"], 2, "-o link.ts is the MODEL of this run", ()),
    (E, ["adir", "-o", "adir/kept.txt"], 2, "-o adir/kept.txt is a file of the MODEL folder of this run", ()),
    (E, [*EXPORT, "--example-inputs", "example.pt", "--report", "example.pt"], 2, "--report example.pt is the --example-inputs of this run", ()),
    (E, [*EXPORT, "--input", "x:2x64", "--report", "out/m.onnx"], 2, "--report and -o both name out/m.onnx", ()),
    (E, ["small.ts", "-o", "fifo.onnx", "--input", "x:2x64"], 2, "-o fifo.onnx: exists and is a FIFO", ()),
    (E, ["small.ts", "-o", "/dev/null", "--input", "x:2x64"], 2, "-o /dev/null: exists and is a character device", ()),
    (E, ["small.ts", "-o", "adir", "--input", "x:2x64"], 2, "output path is a directory", ()),
    (E, ["small.ts", "-o", "missing/dir/m.onnx", "--input", "x:2x64"], 2, "output directory does not exist", ()),
    (E, ["small.ts", "-o", "/proc/m.onnx", "--input", "x:2x64"], 2, "not writable", ()),
    # export: a real mismatch (no file, the report says why)
    (E, ["bad_factories:noisy", "-o", "out/m.onnx", "-q", "--report", "out/r.json"], 1, "differs from PyTorch beyond tolerance", ("out/r.json",)),
    # compare
    (C, ["small.ts", "missing.onnx", "-q"], 2, "no such ONNX file: missing.onnx", ()),
    (C, ["small.ts", "notes.txt", "-q"], 2, "notes.txt is not a readable ONNX model", ()),
    (C, ["missing.pt", "small.onnx", "-q"], 2, "model not found", ()),
    (C, [*COMPARE, "--json", "small.onnx"], 2, "--json small.onnx is the ONNX of this run", ()),
    (C, [*COMPARE, "--save-results", "small.ts"], 2, "--save-results small.ts is the MODEL of this run", ()),
    (C, [*COMPARE, "--json", "out/r.json", "--report", "out/r.json"], 2, "--report and --json both name out/r.json", ()),
    (C, [*COMPARE, "--save-results", "out/s.json", "--json", "out/s.inputs.json"], 2, "both name out/s.inputs.json", ()),
    (C, [*COMPARE, "--json", "fifo.onnx"], 2, "--json fifo.onnx: exists and is a FIFO", ()),
    (C, [*COMPARE, "--backends", "torch"], 2, "needs at least two backends", ()),
    (C, [*COMPARE, "--backends", "torch,tpu"], 2, "unknown backend 'tpu'", ()),
    (C, [*COMPARE, "--iterations", "-1"], 2, "must be >= 0", ()),
    (C, [*COMPARE, "--atol", "-1"], 2, "a tolerance must be a non-negative number", ()),
    (C, [*COMPARE, "--input", "x:3x64"], 2, "but the ONNX model takes 2x64", ()),
    # build
    (B, ["missing.onnx", "-o", "out/e.plan", "-q"], 2, "no such ONNX file", ()),
    (B, ["notes.txt", "-o", "out/e.plan", "-q"], 2, "is not a readable ONNX model", ()),
    (B, ["small.onnx", "-o", "small.onnx", "-q"], 2, "-o small.onnx is the ONNX of this run", ()),
    (B, ["small.onnx", "-o", "hardlink.onnx", "-q"], 2, "-o hardlink.onnx is the ONNX of this run", ()),
    (B, [*BUILD, "--timing-cache", "small.onnx"], 2, "--timing-cache small.onnx is the ONNX of this run", ()),
    (B, [*BUILD, "--timing-cache", "out/e.plan"], 2, "--timing-cache and -o both name out/e.plan", ()),
    (B, ["small.onnx", "-o", "fifo.onnx", "-q"], 2, "-o fifo.onnx: exists and is a FIFO", ()),
    (B, [*BUILD, "--compute-capability", "99.9"], 2, "--compute-capability 99.9: tensorrt-rtx", ()),
    (B, [*BUILD, "--compute-capability", "8"], 2, "expected MAJOR.MINOR", ()),
    (B, [*BUILD, "--workspace", "0"], 2, "--workspace must be a positive number", ()),
    (B, [*BUILD, "--profile", "x:1:2"], 2, "expected NAME:MIN:OPT:MAX", ()),
    (B, [*BUILD, "--profile", "y:1x64:2x64:4x64"], 2, "not a model input", ()),
    (B, [*BUILD, "--fp16", "--bf16"], 2, "not allowed with argument", ()),
    # plugins
    ("plugins", [], 2, "required", ()),
    ("plugins", ["build", "--cuda", "maybe"], 2, "invalid choice: 'maybe'", ()),
    ("plugins", ["remove"], 2, "invalid choice: 'remove'", ()),
    # package, serve: their output paths (checked before anything is written or started)
    ("package", ["small.onnx", "--triton", ".", "--force"], 2, "--triton . holds the ARTEFACT of this run: replacing the folder would delete it", ()),
    ("package", ["small.onnx", "--triton", "notes.txt"], 2, "--triton notes.txt: exists and is not a folder", ()),
    ("serve", ["small.onnx", "--log-file", "small.onnx"], 2, "--log-file small.onnx is the ARTEFACT of this run", ()),
    ("serve", ["small.onnx", "--log-file", "no_such_dir/triton.log"], 2, "output directory does not exist", ()),
]


def _row_id(row) -> str:
    command, args, *_ = row
    return f"{command} {' '.join(args)}"[:80]


def test_the_table_is_large_enough():
    assert len(ROWS) >= 40 and {r[0] for r in ROWS} == {E, C, B, "plugins", "package", "serve"}


@pytest.mark.parametrize(("command", "args", "code", "message", "written"), ROWS, ids=[_row_id(r) for r in ROWS])
def test_bad_input(cli, folder, monkeypatch, command, args, code, message, written):
    monkeypatch.chdir(folder)
    monkeypatch.syspath_prepend(str(folder))  # let the broken factories' modules be found fresh
    before = _snapshot(folder)
    null_mode = os.stat("/dev/null").st_mode
    got, _, stderr = cli(command, *args)
    after = _snapshot(folder)
    errors = [line for line in stderr.splitlines() if "error:" in line]
    assert got == code, stderr
    assert "Traceback" not in stderr
    assert len(errors) == 1 and message in errors[0], stderr
    new = {k: v for k, v in after.items() if k not in before}
    assert set(new) == set(written), f"left behind: {sorted(set(new) - set(written))}, missing: {sorted(set(written) - set(new))}"
    assert {k: after[k] for k in before} == before, "an input or existing file changed"
    assert os.stat("/dev/null").st_mode == null_mode
    for path in written:  # written where promised: the report, saying which step failed
        report = json.loads((folder / path).read_text())
        assert report["error"] and any(s["status"] == "failed" for s in report["steps"])
        (folder / path).unlink()


# --- outcomes that are not bad input: a deployfuse bug, signals -------------------------------


def test_internal_failure_is_exit_3_with_a_log_and_the_report(cli, folder, monkeypatch):
    """A bug inside a step (here: the clean step raising) is one line naming a log file with
    the traceback, exit 3, no ONNX file, and the --report saying which step failed."""
    import deployfuse.pipeline

    def broken(model):
        raise RuntimeError("clean exploded")

    monkeypatch.setattr(deployfuse.pipeline, "clean", broken)
    monkeypatch.chdir(folder)
    before = _snapshot(folder)
    code, _, stderr = cli("export", "small.ts", "-o", "out/m.onnx", "--input", "x:2x64", "--report", "out/r.json", "-q")
    assert code == 3, stderr
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1
    assert "internal error" in stderr and "RuntimeError: clean exploded" in stderr
    log = Path(stderr.strip().rsplit("traceback in ", 1)[1])
    assert "Traceback" in log.read_text() and "clean exploded" in log.read_text()
    log.unlink()
    report = json.loads((folder / "out/r.json").read_text())
    (folder / "out/r.json").unlink()
    assert [s["name"] for s in report["steps"] if s["status"] == "failed"] == ["clean"]
    assert "clean exploded" in report["error"]
    assert _snapshot(folder) == before


def _deployfuse(*args: str, cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])}  # this checkout
    return subprocess.Popen([sys.executable, "-m", "deployfuse", *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_sigint_while_importing_is_one_line_and_exit_130(folder):
    """Ctrl-C while torch is still being imported (it takes seconds): no traceback."""
    process = _deployfuse("export", "small.ts", "-o", "out/m.onnx", "--input", "x:2x64", cwd=folder)
    maps, deadline = Path(f"/proc/{process.pid}/maps"), time.monotonic() + 60
    while process.poll() is None and "libtorch" not in maps.read_text() and time.monotonic() < deadline:
        time.sleep(0.005)  # until torch's libraries are being loaded: a fixed sleep races a busy machine's start-up
    assert process.poll() is None
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "interrupted" in stderr and "Traceback" not in stderr
    assert not any((folder / "out").iterdir())


def test_a_closed_pipe_is_not_an_internal_error(monkeypatch, capsys):
    """`deployfuse ... | head` where the reader has gone while deployfuse writes: exit 141 as a
    shell reports SIGPIPE, nothing on stderr (it was 'internal error: BrokenPipeError', exit 3)."""
    read, write = os.pipe()
    os.close(read)
    monkeypatch.setattr(sys, "stdout", os.fdopen(write, "w", buffering=1))  # every line reaches the closed pipe
    from deployfuse.cli import main

    assert main(["--version"]) == 141
    assert capsys.readouterr().err == ""


def test_sigterm_during_save_removes_the_temporary_folder(tmp_path):
    """SIGTERM while the ONNX file is being written (64 MB of weights, so the write takes a
    while): the hidden temporary folder beside the output goes, and nothing else is written."""
    big = tmp_path
    torch.jit.save(torch.jit.trace(torch.nn.Linear(2048, 8192).eval(), torch.randn(1, 2048)), big / "big.ts")
    out = big / "out"
    out.mkdir()
    process = _deployfuse("export", "big.ts", "-o", "out/big.onnx", "--input", "input:1x2048", "--no-fold", "--no-fuse", "--no-verify", "-q", cwd=big)
    deadline = time.monotonic() + 120
    while process.poll() is None and not any(out.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.002)
    assert process.poll() is None, "the export finished before its temporary folder was seen"
    assert [p.name for p in out.iterdir()][0].startswith(".big.onnx.")
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert "interrupted" in stderr and "Traceback" not in stderr
    assert list(out.iterdir()) == []


def test_compare_takes_the_shapes_the_export_recorded(cli, tmp_path):
    """A dynamic export records its input shapes; compare uses them when no --input is given
    (it used to ask for --input again)."""
    torch.manual_seed(0)
    torch.jit.save(torch.jit.trace(Small().eval(), torch.randn(2, 64)), tmp_path / "small.ts")
    deployfuse.export(tmp_path / "small.ts", tmp_path / "dyn.onnx", inputs=[InputSpec("x", (3, 64))], dynamic=[deployfuse.DynamicAxis("x", 0, "batch")], fuse=False, verify=False)
    code, _, stderr = cli("compare", tmp_path / "small.ts", tmp_path / "dyn.onnx", "--iterations", "0", "-q", "--json", tmp_path / "cmp.json")
    assert code == 0, stderr
    shapes = {tuple(a["shapes"]["x"]) for a in json.loads((tmp_path / "cmp.json").read_text())["accuracy"]}
    assert shapes == {(3, 64)}


class _TwoInputs(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * y + 1


def test_compare_resizes_the_inputs_that_share_a_dynamic_axis(cli, tmp_path):
    """--dynamic x:0:batch alone: y has the same symbolic batch in the ONNX model, so the second
    feed resizes it too (it used to keep y's size and fail in ONNX Runtime)."""
    deployfuse.export(_TwoInputs(), tmp_path / "two.onnx", inputs=[InputSpec("x", (3, 4)), InputSpec("y", (3, 4))],
                      dynamic=[deployfuse.DynamicAxis("x", 0, "batch"), deployfuse.DynamicAxis("y", 0, "batch")], fuse=False, verify=False)
    torch.save(_TwoInputs(), tmp_path / "two.pt")
    code, _, stderr = cli("compare", tmp_path / "two.pt", tmp_path / "two.onnx", "--trust-pickle", "--dynamic", "x:0:batch", "--iterations", "0", "-q", "--json",
                          tmp_path / "cmp.json")
    assert code == 0, stderr
    shapes = [a["shapes"] for a in json.loads((tmp_path / "cmp.json").read_text())["accuracy"]]
    assert len(shapes) == 2 and all(s["x"] == s["y"] for s in shapes) and shapes[0]["x"] != shapes[1]["x"]
