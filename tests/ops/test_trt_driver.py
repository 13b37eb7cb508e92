"""libdeployfuse_trt through plugins/tests/trt_driver, which plays TensorRT's part (IPluginV3 life
cycle, no TensorRT library): on this CPU machine every step but enqueue runs for every case of
tests/ops/cases.py in fp32, fp16 and bf16; with a GPU the enqueue outputs are compared with the
references too (bench/results/trt_plugins_h200.md). Failures must show: a bad attribute makes
createPlugin fail with the plugin's message, a library without the entry points is refused."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from deployfuse.ops.native import build_plugins

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plugins" / "tests"))
import trt_driver_check  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="no CUDA toolkit (nvcc): libdeployfuse_trt cannot compile")

BUILD_STEPS = [
    "creator lookup",
    "getFieldNames",
    "createPlugin",
    "clone",
    "getCapabilityInterface.PLUGIN_V3ONE_CORE",
    "getCapabilityInterface.PLUGIN_V3ONE_BUILD",
    "getCapabilityInterface.PLUGIN_V3ONE_RUNTIME",
    "core identity",
    "getNbOutputs",
    "getOutputDataTypes",
    "getOutputShapes.symbolic",
    "getOutputShapes.constant",
    "supportsFormatCombination",
    "configurePlugin",
    "getWorkspaceSize",
    "getFieldsToSerialize",
    "attachToContext",
    "createPlugin.fromSerialized",
    "attachToContext.fromSerialized",
    "getFieldsToSerialize.fromSerialized",
]


@pytest.fixture(scope="module")
def built() -> tuple[Path, Path]:
    out = build_plugins(cuda=True, tensorrt=True)
    return out / "trt_driver", out / "libdeployfuse_trt.so"


def test_every_plugin_case_passes_the_life_cycle(built):
    report = trt_driver_check.check(*built, which="ci")
    assert len(report["cases"]) == 3 * len(trt_driver_check.CASES)
    bad = [(c["id"], c["failed"], c["outputs"]) for c in report["cases"] if not c["ok"]]
    assert not bad, bad
    for c in report["cases"]:
        assert [s for s in c["steps"] if s in BUILD_STEPS] == BUILD_STEPS
        assert c["steps"][-1] == "destroy"
        if report["enqueue"]:  # a GPU: both enqueues ran and matched the reference
            assert len(c["outputs"]) == 2 and all(o["ok"] for o in c["outputs"])
    assert report["ok"] and report["driver_rc"] == 0


def _lines(driver: Path, lib: Path, manifest: Path) -> tuple[int, list[dict]]:
    proc = subprocess.run([str(driver), str(lib), str(manifest)], capture_output=True, text=True, timeout=120)
    return proc.returncode, [json.loads(line) for line in proc.stdout.splitlines()]


def test_bad_attribute_fails_create_plugin_with_the_plugins_message(built, tmp_path):
    cases = trt_driver_check.make_cases("ci", ["float"], tmp_path, {"GroupNormAct"})
    cases = cases[:1]
    cases[0].attrs = {"num_groups": 4, "activation": "bogus"}
    trt_driver_check.write_manifest(cases, tmp_path / "manifest.txt")
    rc, lines = _lines(*built, tmp_path / "manifest.txt")
    create = next(line for line in lines if line.get("step") == "createPlugin")
    assert rc == 1 and not create["ok"]
    assert "plugin logged" in create["detail"] and "bogus" in create["detail"]
    assert lines[-1]["summary"] and lines[-1]["failed"] == ["createPlugin"]


def test_shapes_that_disagree_with_the_attributes_are_caught_at_enqueue_not_before(built, tmp_path):
    """GroupNormAct with 6 channels and 4 groups: no build-time interface sees the channel count
    against the attribute (as in TensorRT), so every step but enqueue passes."""
    cases = trt_driver_check.make_cases("ci", ["float"], tmp_path, {"GroupNormAct"})[-1:]  # (1, 6, 1, 3)
    cases[0].attrs = {"num_groups": 4}
    trt_driver_check.write_manifest(cases, tmp_path / "manifest.txt")
    rc, lines = _lines(*built, tmp_path / "manifest.txt")
    steps = {line["step"]: line["ok"] for line in lines if "step" in line}
    assert all(steps[s] for s in BUILD_STEPS)
    if next(line for line in lines if line.get("step") == "device")["enqueue"]:
        assert rc == 1 and steps["attached.enqueue"] is False
    else:
        assert rc == 0 and steps["enqueue"]


def test_a_library_without_the_plugin_entry_points_is_refused(built, tmp_path):
    driver, lib = built
    (tmp_path / "manifest.txt").write_text("")
    rc, lines = _lines(driver, lib.parent / "libdeployfuse_ort.so", tmp_path / "manifest.txt")
    assert rc == 1
    entry = next(line for line in lines if line["step"] == "entry points")
    assert not entry["ok"]
