"""The wheel works away from the checkout: built with pip, installed with [hf] into a fresh venv
in a tmp folder, it builds its native plugins from the sources it carries, runs its examples,
exports a Hugging Face folder by task with dynamic axes, and serves the artefact through
deployfuse.InferenceSession with the numbers `deployfuse compare` reports.

The venv sees this interpreter's packages (--system-site-packages) and pip installs with
--no-index, so torch and friends are found there, not installed again; every command runs from
a folder outside the checkout, and the tests check deployfuse is imported from the venv. The
wheel is built and installed once per session (a module fixture): that is the slow part.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import onnx
import onnxruntime as ort
import pytest
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


@dataclass(frozen=True)
class Installed:
    """The wheel installed with [hf] into a fresh venv, its plugins built there."""

    wheel: Path
    venv: Path
    work: Path  # a folder outside the checkout, where every command runs
    env: dict[str, str]
    package: Path  # where the venv imports deployfuse from
    library: Path  # the ONNX Runtime custom-op library `deployfuse plugins build` made

    def run(self, *args: str | Path, timeout: int = 300) -> str:
        """Run the venv's `python` or `deployfuse` (args[0]) in the work folder."""
        return _run([str(self.venv / "bin" / str(args[0])), *map(str, args[1:])], cwd=self.work, env=self.env, timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    """Build the wheel and install it once per session: the expensive part of these tests."""
    tmp = tmp_path_factory.mktemp("packaging")
    wheels, source = tmp / "wheels", _source_copy(tmp / "source")
    _run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels)], cwd=tmp)
    wheel = next(wheels.glob("deployfuse-*.whl"))

    venv = tmp / "venv"
    # No pip of its own: an ensurepip setuptools in the venv would shadow the newer one torch requires.
    _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], cwd=tmp)
    # ONNX Runtime's headers as this checkout fetched them (Debian's package), so no download here;
    # no PYTHONPATH: a checkout on it would count as deployfuse installed.
    env = {**os.environ, "ONNXRUNTIME_INCLUDE_DIR": str(ort_include_dir()), "PYTHONPATH": ""}
    # [hf] as a user installs it; --no-index: every dependency must already be met by this
    # interpreter's packages (the venv sees them), so torch and transformers are not installed again.
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-index", "-q", f"{wheel}[hf]"], cwd=tmp, env=env)
    work = tmp / "elsewhere"
    work.mkdir()
    python = venv / "bin" / "python"
    where = _run([str(python), "-c", "import deployfuse; print(deployfuse.__file__)"], cwd=work, env=env)
    package = Path(where.strip())
    built = _run([str(venv / "bin" / "deployfuse"), "plugins", "build", "--cuda", "off"], cwd=work, env=env)
    library = Path(built.split("built ", 1)[1].split()[0])
    return Installed(wheel, venv, work, env, package, library)


def test_wheel_carries_its_plugin_sources_and_builds_them_outside_the_checkout(installed):
    names = zipfile.ZipFile(installed.wheel).namelist()
    assert "deployfuse/_plugins/CMakeLists.txt" in names and "deployfuse/_plugins/ort_ops.cc" in names
    assert not any(n.startswith("deployfuse/_plugins/build/") for n in names), "build outputs must not ship"
    assert "deployfuse/examples/tiny_bert.py" in names and any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE") for n in names)
    requires = zipfile.ZipFile(installed.wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert {"gpu", "tensorrt", "hf", "report", "dev"} <= {line.split(": ", 1)[1] for line in requires.splitlines() if line.startswith("Provides-Extra: ")}

    assert installed.package.is_relative_to(installed.venv)
    sources = Path(installed.run("python", "-c", "import deployfuse.ops.native as n; print(n.PLUGINS)").strip())
    assert sources == installed.package.parent / "_plugins"
    assert installed.run("deployfuse", "--version").startswith("deployfuse ")
    assert installed.library.is_file() and installed.library.is_relative_to(sources / "build")
    options = ort.SessionOptions()
    options.register_custom_ops_library(str(installed.library))  # a real ORT custom-op library


# Runs in the venv after the CLI's export and compare: deployfuse.InferenceSession on compare's
# inputs (saved by --save-results), against compare's ONNX Runtime and PyTorch outputs.
_SERVE = """
import json, sys
import numpy as np
import deployfuse
from polygraphy.comparator import RunResults
from polygraphy.json import load_json

inputs, results = load_json("cmp.results.inputs.json"), RunResults.load("cmp.results.json")
by_runner = {name.split("-")[0]: runs for name, runs in results.items()}  # Polygraphy suffixes each runner's name
sess = deployfuse.InferenceSession("m.onnx", providers=["CPUExecutionProvider"])
names = [o.name for o in sess.get_outputs()]
report = []
for index, feed in enumerate(inputs):
    got = dict(zip(names, sess.run(None, dict(feed))))
    report.append({"shapes": {k: list(v.shape) for k, v in feed.items()},
                   **{f"{runner}_{name}": float(np.max(np.abs(got[name] - runs[index][name]))) for runner, runs in by_runner.items() for name in names}})
print(json.dumps({"native_ops": sess.native_ops, "library": str(sess.custom_ops_library), "outputs": names, "feeds": report}))
"""


def test_wheel_exports_a_pretrained_folder_by_task_and_serves_it_as_compare_measured(installed):
    run = installed.run
    run("python", "-m", "deployfuse.examples.tiny_bert", "tiny-bert")  # a save_pretrained folder (BertForMaskedLM), from the installed examples
    # A task other than the saved architecture's, for TensorRT (deployfuse.* nodes, which ONNX Runtime runs through the built library).
    run("deployfuse", "export", "tiny-bert", "--task", "token-classification", "--target", "tensorrt", "-o", "m.onnx", "--report", "export.json", "-q")
    model = onnx.load(installed.work / "m.onnx")
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in model.graph.input}
    assert dims == {name: ["batch_size", "sequence_length"] for name in ("input_ids", "attention_mask", "token_type_ids")}
    assert any(n.domain == "deployfuse" for n in model.graph.node)
    exported = json.loads((installed.work / "export.json").read_text())
    assert exported["task"] == "token-classification" and all(o["passed"] for check in exported["verify"] for o in check["outputs"])

    # At a batch and sequence the export never saw; compare takes the task from m.onnx.
    shapes = [f"{name}:3x23:int64" for name in dims]
    compared = run("deployfuse", "compare", "tiny-bert", "m.onnx", *[a for s in shapes for a in ("--input", s)], "--custom-ops", installed.library,
                   "--seed", "7", "--iterations", "2", "--warmup", "1", "--json", "cmp.json", "--save-results", "cmp.results.json")
    assert "PASSED" in compared
    report = json.loads((installed.work / "cmp.json").read_text())
    assert report["passed"] and [a["shapes"] for a in report["accuracy"]] == [{name: [3, 23] for name in dims}]
    measured = {o["name"]: o for o in report["accuracy"][0]["outputs"]}

    served = json.loads(run("python", "-c", _SERVE).strip().splitlines()[-1])
    assert served["native_ops"] and Path(served["library"]) == installed.library, "the artefact's deployfuse.* nodes ran on the built library"
    assert served["outputs"] == ["logits"] and [f["shapes"] for f in served["feeds"]] == [{name: [3, 23] for name in dims}]
    for feed in served["feeds"]:
        assert feed["ort_logits"] == 0.0, "InferenceSession gives compare's ONNX Runtime outputs, bit for bit"
        # so its distance to PyTorch is the one compare reports, within compare's tolerance
        assert feed["torch_logits"] == pytest.approx(measured["logits"]["max_abs_error"], rel=1e-6) and feed["torch_logits"] <= measured["logits"]["atol"]

    # Every report carries its provenance.
    for data in (exported, report):
        block = data["provenance"]
        assert {"deployfuse", "torch", "onnx", "onnxruntime", "onnxscript", "polygraphy"} <= set(block["versions"])
        assert block["device"]["cpu"] and block["threads"] and block["command"].startswith("deployfuse ") and block["time_utc"].endswith("+00:00")
    assert report["provenance"]["seed"] == 7 and "--input" in report["provenance"]["command"]


def test_plugins_build_in_the_user_cache_when_the_sources_are_read_only(tmp_path, monkeypatch):
    import deployfuse
    from deployfuse.ops.native import build_root

    writable = tmp_path / "plugins"
    writable.mkdir()
    assert build_root(writable) == writable / "build"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    missing = tmp_path / "not-there"  # os.access says no: the state of a read-only install for any user, root included
    assert build_root(missing) == tmp_path / "cache" / "deployfuse" / deployfuse.__version__ / "plugins"
