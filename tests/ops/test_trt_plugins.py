"""libdeployfuse_trt with TensorRT-RTX, on a machine without a GPU: the library compiles, loads
through `IPluginRegistry.load_library`, registers one creator per spec op, and engines for
compute capability 8.9 containing each op as a plugin layer build in fp32, fp16 and bf16.

TensorRT-RTX cannot deserialise or run an engine without a GPU, so enqueue is exercised only by
the GPU check (bench/gpu_ops.sh), which drives the same CUDA launchers.
"""

from __future__ import annotations

import importlib.util
import shutil

import onnx
import pytest
from onnx import numpy_helper

from deployfuse.errors import UsageError
from deployfuse.ops import SPECS, trt_plugins_library
from deployfuse.ops.models import example_inputs, single_op_model

pytestmark = [
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="no CUDA toolkit (nvcc): the plugins' kernels cannot compile"),
    pytest.mark.skipif(importlib.util.find_spec("tensorrt_rtx") is None, reason="TensorRT-RTX is not installed (pip install tensorrt-rtx-cu13)"),
]

# (op, X shape, attributes, precision): every op, every precision, non-default attributes.
ENGINES = [
    ("LayerNormGelu", (2, 8, 24), {"approximate": "tanh", "epsilon": 1e-3}, "fp16"),
    ("GroupNormAct", (2, 8, 4, 4), {"num_groups": 4, "activation": "gelu"}, "fp32"),
    ("BiasAct", (4, 16), {"activation": "sigmoid"}, "bf16"),
    ("FusedMHA", (2, 8, 8, 32), {"num_heads": 2, "causal": 1, "mask": True}, "fp16"),
    ("GemmAct", (2, 8, 24, 16), {"activation": "gelu_tanh", "mask": True}, "bf16"),  # Y [2, 8, 16]: its own output shape and workspace
]


@pytest.fixture(scope="module")
def library():
    return trt_plugins_library()


def _engine_model(tmp_path, op: str, shape: tuple[int, ...], attrs: dict) -> tuple:
    """A one-node model whose weights (Scale, Bias, Mask) are initializers, as after an export;
    returns its path and a fixed-shape profile per graph input."""
    from deployfuse.engine import ShapeProfile

    attrs = dict(attrs)
    xs = [x for x in example_inputs(op, shape, **attrs) if x is not None]
    attrs.pop("mask", None)
    model = single_op_model(op, xs, **attrs)
    graph_inputs = 3 if op == "FusedMHA" else 1
    for value_info, x in list(zip(list(model.graph.input), xs))[graph_inputs:]:
        model.graph.initializer.append(numpy_helper.from_array(x, value_info.name))
        model.graph.input.remove(value_info)
    path = tmp_path / f"{op}.onnx"
    onnx.save(model, path)
    profiles = [ShapeProfile.parse(f"{vi.name}:" + ":".join(["x".join(map(str, x.shape))] * 3)) for vi, x in zip(model.graph.input, xs)]
    return path, profiles


def test_library_registers_one_creator_per_op(library):
    from deployfuse.engine import plugins
    from deployfuse.engine.builders import activate

    trt = activate("tensorrt-rtx")
    plugins.load_libraries(trt, [library])
    creators = {c.name: c for c in trt.get_plugin_registry().all_creators if c.plugin_namespace == "deployfuse"}
    assert set(creators) == {name for name, spec in SPECS.items() if spec.trt_plugin}
    for name, creator in creators.items():
        assert creator.plugin_version == "1"
        assert {f.name for f in creator.field_names} == set(SPECS[name].attrs)


@pytest.mark.parametrize("op,shape,attrs,precision", ENGINES, ids=[e[0] for e in ENGINES])
def test_engine_with_plugin_builds_for_cc89(library, tmp_path, op, shape, attrs, precision):
    from deployfuse.engine import build_engine

    path, profiles = _engine_model(tmp_path, op, shape, attrs)
    result = build_engine(path, tmp_path / "e.plan", precision=precision, profiles=profiles, compute_capability="8.9", builder="tensorrt-rtx")
    assert result.plugin_layers == 1 and library in result.plugin_libraries
    assert dict(result.preflight.plugin) == {f"deployfuse.{op}": 1} and not result.preflight.function
    plan = (tmp_path / "e.plan").read_bytes()
    for value in (v for v in attrs.values() if isinstance(v, str)):
        assert value.encode() in plan  # the attribute reached the engine through getFieldsToSerialize


def test_bad_attribute_fails_the_build(library, tmp_path):
    from deployfuse.engine import build_engine

    path, profiles = _engine_model(tmp_path, "GroupNormAct", (1, 4, 2, 2), {"num_groups": 2, "activation": "gelu"})
    model = onnx.load(path)
    next(a for a in model.graph.node[0].attribute if a.name == "activation").s = b"relu"  # the spec has no relu here
    onnx.save(model, path)
    with pytest.raises(UsageError, match="parser rejected"):
        build_engine(path, tmp_path / "e.plan", profiles=profiles, compute_capability="8.9", builder="tensorrt-rtx")
    assert not (tmp_path / "e.plan").exists()
