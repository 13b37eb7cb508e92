"""The registry of deployfuse custom ops: one module per op under `deployfuse/ops/defs/`.

Every `deployfuse.*` node a fusion rule emits or a user writes through a torch op is described
by its module's `OpSpec` (schema, reference math, ONNX function body, example inputs). The
native registrations (`plugins/ort_ops.cc`, `plugins/trt_plugins.cpp`) use the same names, and
the C++ attribute defaults are generated from these specs when the plugins build
(`plugins/gen_op_specs.py`); tests/ops/test_completeness.py ties everything together.

Adding an op: write `deployfuse/ops/defs/<op>.py` and list its module in `OP_MODULES`.
"""

from __future__ import annotations

from types import ModuleType

from deployfuse.ops.defs import bias_act, fp8_gemm_act, fp8_mlp, fused_mha, gemm_act, group_norm_act, layer_norm_gelu, skip_layer_norm_fp8
from deployfuse.ops.schema import OpSpec

OP_MODULES: tuple[ModuleType, ...] = (layer_norm_gelu, group_norm_act, bias_act, fused_mha, gemm_act, fp8_gemm_act, fp8_mlp, skip_layer_norm_fp8)
"""Each defines SPEC, torch_op (``deployfuse::<module name>``) and to_onnx (its translation);
the module name is also the op's folder under plugins/."""

SPECS: dict[str, OpSpec] = {module.SPEC.name: module.SPEC for module in OP_MODULES}


__all__ = ["OP_MODULES", "SPECS"]
