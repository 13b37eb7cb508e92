"""`deployfuse inspect` on engines built here by TensorRT-RTX for compute capability 8.9: no
runtime on this CPU machine can load them, so the report comes from the build record and says
why; the engine-inspector path needs a GPU the engine was built for (not run here)."""

from __future__ import annotations

import json
import shutil

import pytest

from deployfuse.engine import build_engine
from deployfuse.engine.profiles import parse_profile
from deployfuse.ops.native import trt_plugins_library


@pytest.fixture(scope="module")
def bert_engine(bert_onnx, tmp_path_factory):
    trt_plugins_library()  # built as a user builds it, so the engine takes the deployfuse nodes as plugins (without it: function bodies)
    out = tmp_path_factory.mktemp("inspect") / "bert.plan"
    profiles = [parse_profile("input_ids:1x8:1x16:1x32"), parse_profile("input_ids:4x8:8x16:8x32")]
    return build_engine(bert_onnx, out, precision="fp16", profiles=profiles, compute_capability="8.9")


def test_text_report_from_the_build_record(bert_engine, cli):
    code, out, err = cli("inspect", bert_engine.engine)
    assert code == 0, err
    assert "source     the build record bert.plan.build.json: the engine was not loaded (tensorrt_rtx" in out
    assert "could not deserialize it:" in out  # TensorRT-RTX's own reason (no GPU here)
    assert "built      tensorrt-rtx" in out and "fp16, compute capability 8.9" in out
    assert "binding    input  input_ids int64 -1x-1" in out and "binding    output " in out
    assert "profile 1  attention_mask:1x8:1x16:1x32" in out and "profile 2  input_ids:4x8:8x16:8x32" in out
    assert f"layers     {bert_engine.network_layers} (" in out and "half" in out and "float" in out  # Casts at the float32 ends


def test_json_report_matches_the_build(bert_engine, cli):
    code, out, err = cli("inspect", bert_engine.engine, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["source"] == "build record" and report["why_not_loaded"]
    assert len(report["layers"]) == bert_engine.network_layers
    assert [[p["name"] for p in profile] for profile in report["profiles"]] == [[p.name for p in profile] for profile in bert_engine.profiles]
    assert report["built"]["precision"] == "fp16"
    made = report["built"]["provenance"]  # the build record carries its provenance, as every report does
    assert made["versions"]["tensorrt-rtx"] and made["device"]["cpu"] and made["time_utc"].endswith("+00:00")
    assert report["plugins"] == [f"{op} x{n}" for op, n in bert_engine.preflight.plugin.items()] != []  # deployfuse's own plugins


def test_bad_input_exits_2(bert_engine, tmp_path, cli):
    code, _, err = cli("inspect", tmp_path / "none.plan")
    assert code == 2 and "no such engine file" in err
    bare = tmp_path / "bare.plan"
    shutil.copy(bert_engine.engine, bare)  # an engine without its build record
    code, _, err = cli("inspect", bare)
    assert code == 2 and "could not be loaded here" in err and "no build record bare.plan.build.json" in err, err
