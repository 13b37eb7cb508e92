"""Which Python values the TorchScript exporter took from tensor data: only those computed from
the inputs' values count, not shape checks, buffers or constants (deployfuse.export.data_dependence)."""

from __future__ import annotations

import torch

from deployfuse.export.exporter import to_onnx
from deployfuse.loading import load_model


class Mixed(torch.nn.Module):
    """Shape checks, a buffer and a global tensor (harmless), and three conversions of values
    computed from the input: a count of non-zeros, an int of a sum, torch.equal."""

    scale = torch.tensor(2.0)

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("enabled", torch.tensor(1.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 1 and self.enabled > 0 and self.scale > 1:  # shapes, a buffer, a constant
            x = x * 2
        if torch.nonzero(x > 0).shape[0] > 3:  # a size that depends on the values
            x = x + 1
        offset = int(x.sum())
        if torch.equal(x, x.abs()):
            x = -x
        return x + offset


def _findings(module: torch.nn.Module, x: torch.Tensor) -> list:
    loaded = load_model(module)
    _, attempts = to_onnx(loaded, {loaded.input_names[0]: x}, (), ["y"], 18, ("torchscript",))
    return attempts[-1].data_dependent


def test_only_conversions_of_input_values_are_found():
    found = _findings(Mixed().eval(), torch.randn(3, 4))
    source = open(__file__).read().splitlines()
    lines = [int(f.location.rsplit(":", 1)[1]) for f in found]
    assert [source[n - 1].strip() for n in lines] == [f.code for f in found]
    assert [f.code for f in found] == ["if torch.nonzero(x > 0).shape[0] > 3:  # a size that depends on the values",
                                       "offset = int(x.sum())", "if torch.equal(x, x.abs()):"]
    assert "Converting a tensor to a Python boolean" in found[0].warning


def test_a_model_without_data_dependence_has_no_findings():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU()).eval()
    assert _findings(model, torch.randn(2, 3, 8, 8)) == []
