"""Writes the C++ view of the Python op registry for the plugins' build, so no native file
lists the ops by hand.

CMake runs it at configure time (and again whenever a spec module changes):

    python3 gen_op_specs.py OUT_DIR

It writes into OUT_DIR (each file only when its text changes: no needless rebuild)

- deployfuse_op_specs.h: per op `spec::<Op>`, its name, input counts, each input's element type
  (`kInputTypes`: T, or the type `OpSpec.input_types` fixes), whether it is a TensorRT plugin,
  attribute indices and the `AttrSpec` table (defaults, required, allowed values) both runtime
  adapters read attributes with; the list of ops the registration lists check themselves against;
- deployfuse_ort_ops.h: every op's ONNX Runtime adapter, `ort::Adapter<<Op>Attrs>` (generic, over
  the op's <op>.h and <op>.cuh) or the op's own `ort::<Op>` when it has `<op>/<op>_ort.h`,
  listed as `ort::Registered`, which ort_ops.cc registers;
- deployfuse_trt_ops.h: the same for TensorRT (`trt::Adapter<<Op>Attrs>` or `<op>/<op>_trt.h`'s
  `trt::<Op>Op`), listed as `trt::Registered`, which trt_plugins.cpp and the C ABI (ops_capi.cu) use;
  an op whose spec says `trt_plugin=False` is left out;

and prints two lines for CMake: the ops' folder names (= their defs module names) and the Python
files the specs came from.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
# A checkout has plugins/ beside deployfuse/; an installed wheel carries it as deployfuse/_plugins.
# Elsewhere (plugins/ copied alone) the importable deployfuse is used.
for root in (HERE.parent, HERE.parent.parent):
    if (root / "deployfuse" / "ops" / "specs.py").is_file():
        sys.path.insert(0, str(root))
        break

from deployfuse.ops.schema import Attr, OpSpec  # noqa: E402
from deployfuse.ops.specs import OP_MODULES  # noqa: E402

_EACH_ONCE = """// True when Specs are every op of kOps (tensorrt: every one with a TensorRT plugin), each once: a
// registration list checks itself with it.
template <typename... Specs>
constexpr bool each_op_once(bool tensorrt = false) {
  const char* names[] = {Specs::kName...};
  const bool plugins[] = {Specs::kTrtPlugin...};
  if (sizeof...(Specs) != static_cast<size_t>(tensorrt ? kTrtOpCount : kOpCount)) return false;
  for (size_t i = 0; i < sizeof...(Specs); ++i)
    if (tensorrt && !plugins[i]) return false;
  for (size_t i = 0; i < sizeof...(Specs); ++i)
    for (size_t j = i + 1; j < sizeof...(Specs); ++j) {
      size_t n = 0;
      while (names[i][n] != '\\0' && names[i][n] == names[j][n]) ++n;
      if (names[i][n] == names[j][n]) return false;
    }
  return true;
}
"""
_OP_LIST = """// A list of op types (adapters), as a value: the generated registration lists are OpLists.
template <typename... Ops>
struct OpList {};
"""
_KINDS = {"int": "AttrKind::kInt", "float": "AttrKind::kFloat", "string": "AttrKind::kString"}
_INPUT_TYPES = {"T": "InputType::kT", "float": "InputType::kFloat", "float8e4m3fn": "InputType::kFloat8E4M3FN", "int64": "InputType::kInt64"}
"""OpSpec.input_types' names (ONNX's) -> common/op_inputs.h `InputType`."""


def _cpp_string(value: object) -> str:
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _attr_row(name: str, attr: Attr) -> str:
    number = repr(float(attr.default)) if attr.kind != "string" and attr.default is not None else "0.0"
    text = _cpp_string(attr.default) if attr.kind == "string" and attr.default is not None else "nullptr"
    choices = _cpp_string("|".join(str(c) for c in attr.choices)) if attr.choices else "nullptr"
    required = "true" if attr.default is None else "false"
    return f"{{{_cpp_string(name)}, {_KINDS[attr.kind]}, {number}, {text}, {required}, {choices}}}"


def _enum_name(attr: str) -> str:
    return "k" + "".join(part.capitalize() for part in attr.split("_"))


def _input_types(spec: OpSpec) -> str:
    types = [spec.input_type(name) for name in spec.inputs]
    unknown = sorted(set(types) - set(_INPUT_TYPES))
    if unknown:
        raise ValueError(f"{spec.name}: input element types {unknown} have no native InputType (plugins/common/op_inputs.h); known: {sorted(_INPUT_TYPES)}")
    return ", ".join(_INPUT_TYPES[t] for t in types)


def op_block(spec: OpSpec) -> str:
    """`struct <Op>` of one spec."""
    rows = ",\n      ".join(_attr_row(name, attr) for name, attr in spec.attrs.items())
    enum = ", ".join(_enum_name(name) for name in spec.attrs)
    return (
        f"// {spec.doc}\n"
        f"struct {spec.name} {{\n"
        f"  static constexpr const char* kName = {_cpp_string(spec.name)};\n"
        f"  static constexpr int kInputs = {len(spec.inputs)}, kRequiredInputs = {len(spec.inputs) - len(spec.optional)};\n"
        f"  static constexpr InputType kInputTypes[] = {{{_input_types(spec)}}};  // kT: the op's float type (also Y's)\n"
        f"  static constexpr bool kTrtPlugin = {'true' if spec.trt_plugin else 'false'};\n"
        f"  enum : int {{ {enum} }};  // attribute indices into kAttrs\n"
        f"  static constexpr AttrSpec kAttrs[] = {{\n      {rows}}};\n"
        f"}};\n"
    )


def header() -> str:
    specs = [m.SPEC for m in OP_MODULES]
    names = ", ".join(_cpp_string(s.name) for s in specs)
    return (
        "// Generated from the Python op specs (deployfuse/ops/defs/*.py) by plugins/gen_op_specs.py\n"
        "// when the plugins build. Do not edit: change the spec.\n"
        "#pragma once\n#include \"common/attrs.h\"\n#include \"common/op_inputs.h\"\n\nnamespace deployfuse {\nnamespace spec {\n\n"
        + "\n".join(op_block(s) for s in specs)
        + f"\n// Every registered op, in the registry's order.\nconstexpr const char* kOps[] = {{{names}}};\n"
        f"constexpr int kOpCount = {len(specs)}, kTrtOpCount = {sum(s.trt_plugin for s in specs)};\n\n{_EACH_ONCE}\n}}  // namespace spec\n\n"
        f"{_OP_LIST}\n}}  // namespace deployfuse\n"
    )


def _folder(module: ModuleType) -> str:
    return module.__name__.rsplit(".", 1)[-1]


def own_adapter(module: ModuleType, runtime: str) -> Path | None:
    """plugins/<op>/<op>_<runtime>.h when the op writes its own adapter for `runtime`, else None
    (the generic `<runtime>::Adapter<<Op>Attrs>` over its sizes, run_cpu and run_cuda)."""
    path = HERE / _folder(module) / f"{_folder(module)}_{runtime}.h"
    return path if path.is_file() else None


def adapter_list(runtime: str) -> str:
    """deployfuse_<runtime>_ops.h: every op's adapter for `runtime` ("ort" or "trt"), its headers
    included and the adapters listed in the registry's order as `<runtime>::Registered`."""
    includes, cuda_includes, names = set(), set(), []
    for m in OP_MODULES:
        folder, name = _folder(m), m.SPEC.name
        if runtime == "trt" and not m.SPEC.trt_plugin:
            continue
        if own_adapter(m, runtime):
            includes.add(f"{folder}/{folder}_{runtime}.h")
            names.append(name if runtime == "ort" else f"{name}Op")
            continue
        includes.add(f"{folder}/{folder}.h")
        (cuda_includes if runtime == "ort" else includes).add(f"{folder}/{folder}.cuh")
        names.append(f"Adapter<{name}Attrs>")
    framework = "common/ort_adapter.h" if runtime == "ort" else "common/trt_plugin.h"
    text = "".join(f'#include "{h}"\n' for h in sorted(includes | {framework}))
    if cuda_includes:
        text += "#ifdef DEPLOYFUSE_WITH_CUDA\n" + "".join(f'#include "{h}"\n' for h in sorted(cuda_includes)) + "#endif\n"
    return (
        "// Generated from the op registry (deployfuse/ops/specs.py) by plugins/gen_op_specs.py when the\n"
        f"// plugins build. Do not edit: register the op there. Every op's {'ONNX Runtime' if runtime == 'ort' else 'TensorRT'} adapter.\n"
        f"#pragma once\n{text}\nnamespace deployfuse {{\nnamespace {runtime} {{\n\n"
        f"using Registered = OpList<{', '.join(names)}>;\n\n}}  // namespace {runtime}\n}}  // namespace deployfuse\n"
    )


def generated_files() -> dict[str, str]:
    """File name -> text of everything this script writes."""
    return {"deployfuse_op_specs.h": header(), "deployfuse_ort_ops.h": adapter_list("ort"), "deployfuse_trt_ops.h": adapter_list("trt")}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[0], "\nusage: python3 gen_op_specs.py OUT_DIR", file=sys.stderr)
        return 2
    for name, text in generated_files().items():
        out = Path(argv[0]) / name
        if not out.is_file() or out.read_text() != text:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text)
    import deployfuse.ops.schema as schema
    import deployfuse.ops.specs as registry

    sources = [Path(m.__file__) for m in (*OP_MODULES, schema, registry)]
    print(",".join(_folder(m) for m in OP_MODULES))
    print(",".join(p.as_posix() for p in sources))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
