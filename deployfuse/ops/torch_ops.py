"""The deployfuse ops as `torch.library` custom ops, so users can call the fused math in their
own models and `torch.onnx.export(dynamo=True)` writes each call as one deployfuse node.

    y = torch.ops.deployfuse.bias_act(x, bias, "gelu")
    program = torch.onnx.export(model, args, dynamo=True, custom_translation_table=translation_table())
    attach_functions(program.model_proto)   # store the function bodies

Each op's module (`deployfuse/ops/defs/<op>.py`) defines its torch op, registered as
``deployfuse::<module name>`` when the registry imports it; eager execution runs the spec's
PyTorch reference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from deployfuse.ops.specs import OP_MODULES


def translation_table() -> dict[Any, Callable[..., Any]]:
    """`custom_translation_table` for `torch.onnx.export(dynamo=True)`: each deployfuse torch op
    becomes one deployfuse node (call `attach_functions` on the result)."""
    return {getattr(torch.ops.deployfuse, m.__name__.rsplit(".", 1)[-1]).default: m.to_onnx for m in OP_MODULES}
