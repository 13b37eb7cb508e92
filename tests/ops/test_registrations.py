"""One list of ops: the specs, the ONNX Runtime and TensorRT registration lists and the plugins
README name the same ops, and the TensorRT fields are the spec's attributes."""

from __future__ import annotations

import re
from pathlib import Path

from deployfuse.ops import SPECS

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"


def test_ort_registration_list_matches_specs():
    source = (PLUGINS / "ort_ops.cc").read_text()
    registered = re.findall(r"new Op<(\w+)>", source)
    assert sorted(registered) == sorted(SPECS)
    names = dict(re.findall(r"struct (\w+) \{\s*static constexpr const char\* kName = \"(\w+)\"", source))
    assert all(names[adapter] == adapter for adapter in registered)


def test_trt_registration_list_matches_specs():
    source = (PLUGINS / "trt_plugins.cpp").read_text()
    adapters = re.findall(r"static Creator<(\w+)> \w+;", source)
    adapter_bodies = dict(re.findall(r"struct (\w+) \{(.*?)\n\};", source, flags=re.S))
    ops = {}
    for adapter in adapters:
        body = adapter_bodies[adapter]
        name = re.search(r'kName = "(\w+)"', body)[1]
        ops[name] = {m for m in re.findall(r'\{"(\w+)", k(?:Int|Float|Text)', body)}
    assert sorted(ops) == sorted(SPECS)
    for name, fields in ops.items():
        assert fields == set(SPECS[name].attrs), name


def test_readme_lists_every_op():
    table = re.findall(r"^\| `(\w+)` \|", (PLUGINS / "README.md").read_text(), flags=re.M)
    assert sorted(table) == sorted(SPECS)
