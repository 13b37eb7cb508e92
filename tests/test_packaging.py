"""The wheel works away from the checkout: built with pip, installed into a fresh venv in a tmp
folder, it builds its native plugins from the sources it carries, imports its examples, and
exports a Hugging Face folder by task.

The venv sees this interpreter's packages (--system-site-packages) and the wheel installs with
--no-deps, so torch and friends are not installed again; every command runs from a folder
outside the checkout, and the test checks deployfuse is imported from the venv.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import onnxruntime as ort
from conftest import ROOT

from deployfuse.ops.native import ort_include_dir


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: int = 300) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _source_copy(target: Path) -> Path:
    """What an sdist holds, copied, so pip's in-tree build writes nothing into the checkout
    (parallel test runs share it)."""
    target.mkdir()
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, target / name)

    def skip(folder: str, names: list[str]) -> list[str]:  # plugins/build holds built libraries
        return [n for n in names if n == "__pycache__" or (n == "build" and Path(folder) == ROOT / "plugins")]

    for folder in ("deployfuse", "plugins"):
        shutil.copytree(ROOT / folder, target / folder, ignore=skip)
    return target


def test_wheel_installs_builds_its_plugins_and_exports_outside_the_checkout(tmp_path):
    wheels, source = tmp_path / "wheels", _source_copy(tmp_path / "source")
    _run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels)], cwd=tmp_path)
    wheel = next(wheels.glob("deployfuse-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "deployfuse/_plugins/CMakeLists.txt" in names and "deployfuse/_plugins/ort_ops.cc" in names
    assert not any(n.startswith("deployfuse/_plugins/build/") for n in names), "build outputs must not ship"
    assert "deployfuse/examples/tiny_bert.py" in names and any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE") for n in names)

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], cwd=tmp_path)
    python, deployfuse = venv / "bin" / "python", venv / "bin" / "deployfuse"
    _run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)], cwd=tmp_path)
    work = tmp_path / "elsewhere"
    work.mkdir()
    # ONNX Runtime's headers as this checkout fetched them (Debian's package), so no download here.
    env = {**os.environ, "ONNXRUNTIME_INCLUDE_DIR": str(ort_include_dir()), "PYTHONPATH": ""}

    where = _run([str(python), "-c", "import deployfuse, deployfuse.ops.native as n; print(deployfuse.__file__); print(n.PLUGINS)"], cwd=work, env=env)
    package, sources = (Path(line) for line in where.split())
    assert package.is_relative_to(venv) and sources == package.parent / "_plugins"
    assert _run([str(deployfuse), "--version"], cwd=work, env=env).startswith("deployfuse ")

    built = _run([str(deployfuse), "plugins", "build", "--cuda", "off"], cwd=work, env=env)
    library = Path(built.split("built ", 1)[1].split()[0])
    assert library.is_file() and library.is_relative_to(sources / "build")
    options = ort.SessionOptions()
    options.register_custom_ops_library(str(library))  # a real ORT custom-op library

    # One process (torch and transformers load once): save the installed example as a
    # Hugging Face folder, then export it by task as the CLI would.
    _run([str(python), "-c", "from deployfuse.examples.tiny_bert import save_pretrained; from deployfuse.cli import main; save_pretrained('tiny-bert'); "
          "raise SystemExit(main(['export', 'tiny-bert', '-o', 'bert.onnx', '--task', 'fill-mask', '--no-fuse', '--report', 'bert.json', '-q']))"], cwd=work, env=env)
    report = json.loads((work / "bert.json").read_text())
    assert report["task"] == "fill-mask" and report["provenance"]["versions"]["deployfuse"]
    assert {"input_ids:0:batch_size", "input_ids:1:sequence_length"} <= set(report["dynamic"])
    assert all(o["passed"] for check in report["verify"] for o in check["outputs"])


def test_plugins_build_in_the_user_cache_when_the_sources_are_read_only(tmp_path, monkeypatch):
    import deployfuse
    from deployfuse.ops.native import build_root

    writable = tmp_path / "plugins"
    writable.mkdir()
    assert build_root(writable) == writable / "build"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    missing = tmp_path / "not-there"  # os.access says no: the state of a read-only install for any user, root included
    assert build_root(missing) == tmp_path / "cache" / "deployfuse" / deployfuse.__version__ / "plugins"
