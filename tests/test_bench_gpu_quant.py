"""bench/gpu_quant.py's fairness to torchao: GPT-2's Conv1D projections become the `nn.Linear`
layers torchao's `quantize_` swaps, with the model's math unchanged."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import transformers
from transformers.pytorch_utils import Conv1D

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from gpu_quant import conv1d_as_linear  # noqa: E402


def test_gpt2_conv1d_as_linear_keeps_the_outputs():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=32, vocab_size=97)
    model = transformers.GPT2Model(config).eval()
    with torch.no_grad():  # non-zero biases, so a dropped or misplaced bias shows
        for module in model.modules():
            if isinstance(module, Conv1D):
                module.bias.normal_()
    ids = torch.randint(0, config.vocab_size, (3, 11))
    with torch.no_grad():
        before = model(input_ids=ids).last_hidden_state
        swapped = conv1d_as_linear(model)
        after = swapped(input_ids=ids).last_hidden_state
    assert swapped is model
    assert not any(isinstance(m, Conv1D) for m in model.modules())
    assert sum(isinstance(m, torch.nn.Linear) for m in model.modules()) == 4 * config.n_layer  # c_attn, c_proj, c_fc, mlp.c_proj
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)
