"""Every registered op is complete: from the registry (deployfuse/ops/specs.py) alone, the test
derives what each op needs and finds it, so an op added to the registry with a piece missing
fails here, naming the piece:

- Python (deployfuse/ops/defs/<op>.py): a torch op whose arguments and defaults are the spec's,
  an ONNX translation writing the spec's node with the spec's attributes, a function body for
  every variant, example inputs for every input;
- native (plugins/<op>/): attributes and call sizes (<op>.h), CPU kernel and run_cpu, CUDA
  launcher and run_cuda (what the generic ONNX Runtime and TensorRT adapters call), or the op's
  own adapter files; both adapters (only ONNX Runtime's when the spec says `trt_plugin=False`)
  in the registration lists generated from the registry (the
  ORT one registered for the CPU and CUDA EPs; the TensorRT creator's fields are the spec's
  attributes, from the header generated from the spec; the GPU checks' C ABI runs the TensorRT
  adapter);
- a rewrite rule that emits it, or the spec says `users_only`;
- test cases covering every variant (tests/ops/cases.py; the GPU check runs them too) and its
  name in the README's list of deployfuse ops (the one place the docs list the ops).

`test_a_new_op_without_its_pieces_is_reported` shows the check is not vacuous: an op that is
only a spec is reported missing every piece.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import re
import types
from pathlib import Path

import pytest
import torch
from onnx import helper

from deployfuse.ops.body import MIN_OPSET
from deployfuse.ops.defs import bias_act
from deployfuse.ops.functions import function_body
from deployfuse.ops.models import example_inputs
from deployfuse.ops.schema import OpSpec
from deployfuse.ops.specs import OP_MODULES, SPECS
from deployfuse.targets import BY_NAME
from tests.ops.cases import CASES, YQ_CASES

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ROOT / "plugins"
RULES = ROOT / "deployfuse" / "rewrite" / "rules"


def _generated() -> dict[str, str]:
    spec = importlib.util.spec_from_file_location("gen_op_specs", PLUGINS / "gen_op_specs.py")
    assert spec and spec.loader
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return gen.generated_files()


GENERATED = _generated()
HEADER = GENERATED["deployfuse_op_specs.h"]


def _read(path: Path) -> str:
    return path.read_text() if path.is_file() else ""


def _variants(spec: OpSpec) -> list[dict]:
    """Every variant of the op: each choice of each variant attribute, each optional input present or not."""
    axes = {k: a.choices for k, a in spec.attrs.items() if a.variant}
    axes.update({name: (False, True) for name in spec.optional})
    return [dict(zip(axes, values)) for values in itertools.product(*axes.values())]


def _case_variant(spec: OpSpec, attrs: dict) -> str:
    """A case's variant: "mask" gives the optional inputs (all, or those a string names: SkipLayerNormFp8's "skip,ids"), but
    YScale, which FusedMHA's "outputs" naming YQ gives (YQ_CASES)."""
    attrs = dict(attrs)
    given = {"YScale": "YQ" in attrs.pop("outputs", ())}
    mask = attrs.pop("mask", False)
    named = set(mask.split(",")) if isinstance(mask, str) else None
    present = [n for n in spec.inputs if n not in spec.optional or given.get(n, mask if named is None else n.lower() in named)]
    return spec.variant_key(spec.resolve(**attrs), present)


def _present(spec: OpSpec, variant: dict) -> list[str]:
    return [n for n in spec.inputs if n not in spec.optional or variant[n]]


def _python_pieces(module: types.ModuleType, folder: str) -> list[str]:
    spec: OpSpec = module.SPEC
    missing = []
    packet = getattr(torch.ops.deployfuse, folder, None) if hasattr(torch.ops.deployfuse, folder) else None
    if packet is None or getattr(module, "torch_op", None) is None:
        missing.append(f"torch op deployfuse::{folder} (defs/{folder}.py torch_op)")
    else:
        args = packet.default._schema.arguments
        names = [a.name for a in args[len(spec.inputs):]]
        defaults = {a.name: a.default_value for a in args if a.has_default_value()}
        if names != list(spec.attrs) or any(defaults.get(k) != a.default for k, a in spec.attrs.items() if a.default is not None):
            missing.append(f"torch op arguments = the spec's attributes with its defaults (got {names}, {defaults})")
    translation = getattr(module, "to_onnx", None)
    if translation is None:
        missing.append(f"ONNX translation (defs/{folder}.py to_onnx)")
    else:
        proto = translation.to_function_proto()
        nodes = [(n.domain, n.op_type) for n in proto.node]
        defaults = {a.name: helper.get_attribute_value(a) for a in proto.attribute_proto}
        defaults = {k: v.decode() if isinstance(v, bytes) else v for k, v in defaults.items()}
        if (spec.domain, spec.name) not in nodes or set(proto.attribute) | set(defaults) != set(spec.attrs):
            missing.append(f"ONNX translation writing {spec.domain}.{spec.name} with the spec's attributes")
        elif any(defaults.get(k) != pytest.approx(a.default) for k, a in spec.attrs.items() if a.default is not None):
            missing.append(f"ONNX translation defaults = the spec's (got {defaults})")
    for variant in _variants(spec):
        try:
            function_body(spec, max(MIN_OPSET, spec.min_opset, 19 if variant.get("YScale") else 0), variant)  # FusedMHA's float8 YQ: opset 19
        except Exception as exc:  # noqa: BLE001 (the piece is what is reported)
            missing.append(f"function body for {variant}: {exc}")
    cases = [c for c in CASES + YQ_CASES if c[0] == spec.name]
    if not cases:
        missing.append("a test case in tests/ops/cases.py")
    else:
        covered = {_case_variant(spec, attrs) for _, _, attrs in cases}
        wanted = {spec.variant_key(v, _present(spec, v)) for v in _variants(spec)}
        if wanted - covered:
            missing.append(f"test cases for the variants {sorted(wanted - covered)}")
        op, shape, attrs = cases[0]
        try:
            if len(example_inputs(op, shape, **dict(attrs))) != len(spec.inputs):
                missing.append("example inputs: one per spec input")
        except Exception as exc:  # noqa: BLE001
            missing.append(f"example inputs: {exc}")
    return missing


def _native_pieces(spec: OpSpec, folder: str) -> list[str]:
    missing = []
    needles = [
        (f"{folder}/{folder}.h", f"struct {spec.name}Attrs {{\n  using Spec = spec::{spec.name};"),
        (f"{folder}/{folder}.h", f"void {folder}_cpu("),
        (f"{folder}/{folder}_cpu.cc", f"void {folder}_cpu("),
        (f"{folder}/{folder}.cuh", f"launch_{folder}("),
        (f"{folder}/{folder}.cu", f"launch_{folder}("),
    ]
    # Each runtime: the generic Adapter<<Op>Attrs> over the op's sizes and run_cpu / run_cuda, or
    # the op's own adapter file (an op whose output is not shaped like X, or with a workspace).
    # An op with trt_plugin=False has no TensorRT one.
    adapters = {}
    for runtime in ("ort", "trt") if spec.trt_plugin else ("ort",):
        own = f"{folder}/{folder}_{runtime}.h"
        if (PLUGINS / own).is_file():
            adapters[runtime] = spec.name if runtime == "ort" else f"{spec.name}Op"
            # on the attributes, or (TensorRT: a refusal on top of the generic plugin) on the generic adapter
            base = f"{spec.name}Attrs" if runtime == "ort" or f"Adapter<{spec.name}Attrs>" not in _read(PLUGINS / own) else f"Adapter<{spec.name}Attrs>"
            needles.append((own, f"struct {adapters[runtime]} : {base} {{"))
            needles += [(own, f"launch_{folder}<")] if runtime == "ort" else []  # its CUDA EP path: the op's own launcher
        else:
            adapters[runtime] = f"Adapter<{spec.name}Attrs>"
            if runtime == "ort":
                needles += [(f"{folder}/{folder}.h", "Sizes sizes(const Inputs& in) const"), (f"{folder}/{folder}.h", f"run_cpu(const {spec.name}Attrs&")]
            else:
                needles.append((f"{folder}/{folder}.cuh", f"run_cuda(const {spec.name}Attrs&"))
    for rel, needle in needles:
        if needle not in _read(PLUGINS / rel):
            missing.append(f"plugins/{rel} with `{needle.splitlines()[0]}`")
    for runtime, adapter in adapters.items():
        listed = re.search(r"using Registered = OpList<(.*)>;", GENERATED[f"deployfuse_{runtime}_ops.h"])
        if not listed or adapter not in listed[1].split(", "):
            missing.append(f"{'ONNX Runtime' if runtime == 'ort' else 'TensorRT'} registration: {runtime}::{adapter} in the generated deployfuse_{runtime}_ops.h")
    block = re.search(rf"struct {spec.name} \{{.*?kAttrs\[\] = \{{(.*?)\}};\n\}};", HEADER, flags=re.S)
    if not block or re.findall(r'\{"(\w+)", AttrKind', block[1]) != list(spec.attrs):
        missing.append("generated spec::<Op> whose attributes (the TensorRT fields) are the spec's")
    return missing


def readme_ops() -> list[str]:
    """The ops the README's "deployfuse ops" section lists: `A`, `B` and `C` (domain `deployfuse`, ..."""
    listed = re.search(r"^((?:`\w+`(?:, | and ))*`\w+`) \(domain `deployfuse`", _read(ROOT / "README.md"), flags=re.M)
    return re.findall(r"`(\w+)`", listed[1]) if listed else []


def _elsewhere_pieces(spec: OpSpec) -> list[str]:
    missing = []
    emits = re.compile(rf"[\"']{spec.name}[\"']|\bop\.{spec.name}\(")
    lowered = {(lowering.domain, lowering.op_type) for target in BY_NAME.values() for choices in target.lowerings.values() for lowering in choices}
    if not spec.users_only and (spec.domain, spec.name) not in lowered and not any("DEPLOYFUSE" in s and emits.search(s) for s in (p.read_text() for p in RULES.glob("*.py"))):
        missing.append("a target lowering to it (deployfuse/targets.py) or a rewrite rule emitting it (deployfuse/rewrite/rules/), or users_only=True in its spec")
    if spec.name not in readme_ops():
        missing.append("the op in the README's list of deployfuse ops (section 'deployfuse ops')")
    return missing


def missing_pieces(module: types.ModuleType) -> list[str]:
    """What the op of a defs module lacks; [] when it is complete."""
    folder = module.__name__.rsplit(".", 1)[-1]
    return _python_pieces(module, folder) + _native_pieces(module.SPEC, folder) + _elsewhere_pieces(module.SPEC)


@pytest.mark.parametrize("module", OP_MODULES, ids=[m.SPEC.name for m in OP_MODULES])
def test_registered_op_is_complete(module):
    assert missing_pieces(module) == []


def test_registry_and_generated_header_name_the_same_ops():
    assert list(SPECS) == [m.SPEC.name for m in OP_MODULES] and len(set(SPECS)) == len(OP_MODULES)
    assert re.search(r"kOps\[\] = \{(.*?)\};", HEADER)[1] == ", ".join(f'"{name}"' for name in SPECS)
    assert sorted(readme_ops()) == sorted(SPECS), "the README lists the registered ops, no others"
    folders = {p.name for p in PLUGINS.iterdir() if p.is_dir() and p.name not in ("common", "build", "tests")}
    assert folders == {m.__name__.rsplit(".", 1)[-1] for m in OP_MODULES}, "one plugins/<op>/ folder per registered op"


def test_native_lists_come_from_the_registry():
    """The registration lists and the C ABI take the generated lists, so adding an op edits none of them."""
    ort, trt, capi = (_read(PLUGINS / name) for name in ("ort_ops.cc", "trt_plugins.cpp", "ops_capi.cu"))
    assert '#include "deployfuse_ort_ops.h"' in ort and "add_ops(Registered{}, ops, ep, type)" in ort
    assert re.search(r"add_all\(ops, kCpu,", ort) and re.search(r"add_all\(ops, kCuda, t\)", ort), "both the CPU and the CUDA EP"
    assert '#include "deployfuse_trt_ops.h"' in trt and "creators(deployfuse::trt::Registered{}" in trt
    assert '#include "deployfuse_trt_ops.h"' in capi and "run_named(trt::Registered{}" in capi
    for text in (ort, trt):  # (ops_capi.cu may add op-specific entries beside the generic df_run)
        assert not any(f"{m.__name__.rsplit('.', 1)[-1]}_" in text for m in OP_MODULES), "an op named by hand in a native list"


def test_a_new_op_without_its_pieces_is_reported():
    spec = dataclasses.replace(bias_act.SPEC, name="RMSNormAct")
    stub = types.ModuleType("deployfuse.ops.defs.rms_norm_act")
    stub.SPEC = spec
    missing = "\n".join(missing_pieces(stub))
    for piece in ("torch op", "ONNX translation (", "a test case", "rms_norm_act.h", "rms_norm_act_cpu.cc", "rms_norm_act.cu", "Sizes sizes(",
                  "run_cpu(const RMSNormActAttrs&", "run_cuda(const RMSNormActAttrs&", "ONNX Runtime registration", "TensorRT registration", "generated spec::<Op>",
                  "a rewrite rule", "README's list"):
        assert piece in missing, piece
    assert "a rewrite rule" not in "\n".join(missing_pieces(types.SimpleNamespace(__name__=stub.__name__, SPEC=dataclasses.replace(spec, users_only=True))))
