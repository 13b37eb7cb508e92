"""transformers' fp16 overflow clamp (`if not isfinite(x).all(): x = clamp(x)`) exports as a
`where` that computes the branch for every input, through both exporters; a branch on the same
tests whose body is no clamp is still refused (deployfuse.export.overflow_clamp)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

from deployfuse.backends.ort import run, session
from deployfuse.export.exporter import to_onnx
from deployfuse.loading import load_model


class OverflowClamp(torch.nn.Module):
    """BART's layer end: a sum that overflowed fp16 upstream (inf in `x`), its clamp, a use after it.

    The overflow comes in with `x`: ONNX Runtime's CPU EP computes fp16 arithmetic in fp32 and
    drops the round trip through fp16 between two ops, so an op's own overflow reaches its
    successor as a large finite number there (on CUDA it is inf, as in PyTorch)."""

    def __init__(self, test: str) -> None:
        super().__init__()
        self.test = test

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * 2.0
        clamp_value = torch.finfo(h.dtype).max - 1000
        if self.test == "isfinite":
            if h.dtype == torch.float16 and not torch.isfinite(h).all():
                h = torch.clamp(h, min=-clamp_value, max=clamp_value)
        elif torch.isinf(h).any():  # T5's older form
            h = h.clamp(min=-clamp_value, max=clamp_value)
        return h - 1.0


class RaisesOnNan(torch.nn.Module):
    """A branch on an overflow test that is no clamp: the export must not pretend it was taken."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * 2
        if torch.isnan(h).any():
            raise ValueError("nan in the input")
        return h


def _export(module: torch.nn.Module, x: torch.Tensor, exporter: str):
    loaded = load_model(module)
    return to_onnx(loaded, {loaded.input_names[0]: x}, (), ["y"], 18, (exporter,))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("test", ["isfinite", "isinf"])
def test_the_clamp_follows_each_input_as_in_pytorch(exporter, test):
    module = OverflowClamp(test).eval()
    rng = np.random.default_rng(zlib.crc32(f"{exporter}-{test}".encode()))
    example = torch.from_numpy(rng.standard_normal((4, 8))).half()
    model, attempts = _export(module, example, exporter)
    assert attempts[-1].error is None and attempts[-1].data_dependent == [], attempts
    onnx_session = session(model)
    for overflow in (False, True):  # the example's side, then the clamp's
        x = rng.standard_normal((4, 8))
        if overflow:
            x.flat[rng.choice(x.size, 3, replace=False)] = [np.inf, -np.inf, np.inf]
        want = module(torch.from_numpy(x).half()).numpy()
        got = run(onnx_session, {"x": x.astype(np.float16)})["y"]
        assert (np.abs(want) > 6e4).sum() == 3 * overflow and np.isfinite(want).all()
        np.testing.assert_allclose(got, want, rtol=1e-3)


def test_a_branch_that_is_no_clamp_stays_refused():
    x = torch.randn(4, 8)
    with pytest.raises(Exception, match="no exporter"):
        _export(RaisesOnNan().eval(), x, "dynamo")
    _, attempts = _export(RaisesOnNan().eval(), x, "torchscript")
    assert [d.code for d in attempts[-1].data_dependent] == ["if torch.isnan(h).any():"]
