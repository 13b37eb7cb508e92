"""The torch.library ops: eager math is the spec's reference, and the dynamo exporter writes each
call as one deployfuse node that ONNX Runtime runs (through the function bodies) to the same
numbers."""

from __future__ import annotations

import numpy as np
import onnx
import torch

from deployfuse.backends.ort import run, session
from deployfuse.ops import attach_functions
from deployfuse.ops.torch_ops import translation_table


class _UsesEveryOp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.gn = torch.nn.GroupNorm(4, 8)

    def forward(self, x: torch.Tensor, img: torch.Tensor, mask: torch.Tensor):
        h = torch.ops.deployfuse.bias_act(x @ self.proj.weight.T, self.proj.bias, "silu")
        h = torch.ops.deployfuse.layer_norm_gelu(h, self.norm.weight, self.norm.bias, -1, 1e-5, "tanh")
        a = torch.ops.deployfuse.fused_mha(h, h, h, mask, num_heads=2, scale=0.0, causal=1)
        b = torch.ops.deployfuse.fused_mha(h, h, h, None, num_heads=4)
        g = torch.ops.deployfuse.group_norm_act(self.conv(img), self.gn.weight, self.gn.bias, 4)
        return a + b, g


def test_eager_ops_match_torch_modules():
    x, bias = torch.randn(3, 7, 10), torch.randn(10)
    torch.testing.assert_close(torch.ops.deployfuse.bias_act(x, bias, "gelu_tanh"), torch.nn.functional.gelu(x + bias, approximate="tanh"))
    gn = torch.nn.GroupNorm(2, 6).eval()
    torch.nn.init.normal_(gn.weight)
    img = torch.randn(2, 6, 5, 5)
    torch.testing.assert_close(torch.ops.deployfuse.group_norm_act(img, gn.weight, gn.bias, 2, 1e-5, "silu"), torch.nn.functional.silu(gn(img)))
    q, k, v = (torch.randn(2, 6, 32) for _ in range(3))
    want = torch.nn.functional.scaled_dot_product_attention(*(t.view(2, 6, 4, 8).transpose(1, 2) for t in (q, k, v)), is_causal=True)
    got = torch.ops.deployfuse.fused_mha(q, k, v, None, num_heads=4, causal=1)
    torch.testing.assert_close(got, want.transpose(1, 2).reshape(2, 6, 32))


def test_export_writes_one_node_per_op_and_runs_in_ort():
    model = _UsesEveryOp().eval()
    args = (torch.randn(2, 5, 16), torch.randn(2, 3, 9, 9), torch.randn(2, 1, 1, 5))
    program = torch.onnx.export(model, args, dynamo=True, custom_translation_table=translation_table(), input_names=["x", "img", "mask"], verbose=False)
    proto = program.model_proto
    ops = sorted(n.op_type for n in proto.graph.node if n.domain == "deployfuse")
    assert ops == ["BiasAct", "FusedMHA", "FusedMHA", "GroupNormAct", "LayerNormGelu"]
    attach_functions(proto)
    onnx.checker.check_model(proto, full_check=True)
    fresh = (torch.randn(2, 5, 16), torch.randn(2, 3, 9, 9), torch.randn(2, 1, 1, 5))
    got = run(session(proto, optimize=False), {n: t.numpy() for n, t in zip(("x", "img", "mask"), fresh)})
    for out, ref in zip(got.values(), model(*fresh)):
        np.testing.assert_allclose(out, ref.detach().numpy(), rtol=1e-4, atol=1e-5)
