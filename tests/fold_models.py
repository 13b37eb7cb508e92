"""A model with every BatchNorm-folding case, foldable and not, one output per case.

Each output is named after its case, so a test can check the fold case by case. Running
statistics and affine parameters are randomised: with the defaults (mean 0, var 1, gamma 1,
beta 0) a broken fold could pass.
"""

from __future__ import annotations

import torch
from torch import nn

# BatchNorm module names expected to fold, by kind, and those that must stay (in every form
# that finds pairs from a graph of modules or aten calls).
FOLDED = {
    "conv-bn": ["bn_conv1d", "bn_conv2d", "bn_conv3d"],
    "convtranspose-bn": ["bn_convt1d", "bn_convt2d", "bn_convt3d"],
    "linear-bn": ["bn_linear"],
}
KEPT = ["bn_train", "bn_residual", "bn_linear3d", "bn_linear4d", "bn_no_stats", "bn_after_relu", "bn_shared_a", "bn_shared_b"]


class AllFoldCases(nn.Module):
    """Conv1d/2d/3d, ConvTranspose1d/2d/3d (groups) and Linear into BatchNorm, plus every exclusion."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1d = nn.Conv1d(4, 6, 3, bias=False)
        self.bn_conv1d = nn.BatchNorm1d(6)
        self.conv2d = nn.Conv2d(4, 6, 3, groups=2, dilation=2, padding=2)
        self.bn_conv2d = nn.BatchNorm2d(6)
        self.conv3d = nn.Conv3d(4, 3, 2, bias=False)
        self.bn_conv3d = nn.BatchNorm3d(3, affine=False)
        self.convt1d = nn.ConvTranspose1d(4, 5, 3, stride=2)
        self.bn_convt1d = nn.BatchNorm1d(5)
        self.convt2d = nn.ConvTranspose2d(4, 6, 3, groups=2, stride=2, bias=False, dilation=2)
        self.bn_convt2d = nn.BatchNorm2d(6)
        self.convt3d = nn.ConvTranspose3d(4, 4, 2, groups=4)
        self.bn_convt3d = nn.BatchNorm3d(4)
        self.linear = nn.Linear(4, 7)
        self.bn_linear = nn.BatchNorm1d(7)
        # exclusions
        self.conv_train = nn.Conv2d(4, 4, 1)
        self.bn_train = nn.BatchNorm2d(4)
        self.conv_residual = nn.Conv2d(4, 4, 3, padding=1)
        self.bn_residual = nn.BatchNorm2d(4)
        self.linear3d = nn.Linear(4, 6)  # [N, 6, 4] -> [N, 6, 6]: BN1d would normalise axis 1, not the features
        self.bn_linear3d = nn.BatchNorm1d(6)
        self.linear4d = nn.Linear(4, 4)  # [N, 4, H, 4]: BN2d normalises axis 1
        self.bn_linear4d = nn.BatchNorm2d(4)
        self.conv_no_stats = nn.Conv2d(4, 4, 1)
        self.bn_no_stats = nn.BatchNorm2d(4, track_running_stats=False)
        self.conv_relu = nn.Conv2d(4, 4, 1)
        self.bn_after_relu = nn.BatchNorm2d(4)
        self.conv_shared = nn.Conv2d(4, 4, 1)  # called twice: folding one BN would change the other call
        self.bn_shared_a = nn.BatchNorm2d(4)
        self.bn_shared_b = nn.BatchNorm2d(4)

    def forward(self, x1d: torch.Tensor, x2d: torch.Tensor, x3d: torch.Tensor, features: torch.Tensor, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        residual = self.conv_residual(x2d)
        return {
            "conv1d": self.bn_conv1d(self.conv1d(x1d)),
            "conv2d": self.bn_conv2d(self.conv2d(x2d)),
            "conv3d": self.bn_conv3d(self.conv3d(x3d)),
            "convt1d": self.bn_convt1d(self.convt1d(x1d)),
            "convt2d": self.bn_convt2d(self.convt2d(x2d)),
            "convt3d": self.bn_convt3d(self.convt3d(x3d)),
            "linear": self.bn_linear(self.linear(features)),
            "train": self.bn_train(self.conv_train(x2d)),
            "residual": self.bn_residual(residual) + residual,
            "linear3d": self.bn_linear3d(self.linear3d(tokens)),
            "linear4d": self.bn_linear4d(self.linear4d(x2d)),
            "no_stats": self.bn_no_stats(self.conv_no_stats(x2d)),
            "after_relu": self.bn_after_relu(torch.relu(self.conv_relu(x2d))),
            "shared": self.bn_shared_a(self.conv_shared(x2d)) + self.bn_shared_b(self.conv_shared(x2d.flip(-1))),
        }


class UntraceableByFx(nn.Module):
    """Branches on a Python value of the input's shape: torch.fx fails, torch.export specialises."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 5, 3)
        self.bn = nn.BatchNorm2d(5)
        self.conv_residual = nn.Conv2d(5, 5, 1)
        self.bn_residual = nn.BatchNorm2d(5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn(self.conv(x))
        if y.shape[-1] > 2:
            y = y[..., 1:]
        z = self.conv_residual(y)
        return self.bn_residual(z) + z


def randomise_batchnorms(module: nn.Module, seed: int = 0) -> nn.Module:
    """Give every BatchNorm non-default running statistics and affine parameters."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                c = m.num_features
                if m.running_mean is not None:
                    m.running_mean.copy_(torch.randn(c, generator=generator))
                    m.running_var.copy_(torch.rand(c, generator=generator) * 3 + 0.1)
                if m.affine:
                    m.weight.copy_(torch.randn(c, generator=generator))
                    m.bias.copy_(torch.randn(c, generator=generator))
    return module


def all_fold_cases() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """The model in eval mode (except `bn_train`), randomised, with fresh example inputs.

    The weights are the same on every call (a factory is loaded twice: once folded, once as reference).
    """
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = randomise_batchnorms(AllFoldCases()).eval()
    model.bn_train.train()
    return model, example_inputs()


def example_inputs(batch: int = 2) -> dict[str, torch.Tensor]:
    """Fresh random inputs for `AllFoldCases` ."""
    return {
        "x1d": torch.randn(batch, 4, 9),
        "x2d": torch.randn(batch, 4, 6, 4),
        "x3d": torch.randn(batch, 4, 4, 5, 3),
        "features": torch.randn(batch, 4),
        "tokens": torch.randn(batch, 6, 4),
    }


def untraceable_by_fx() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """`UntraceableByFx`, randomised, eval mode, with an example input."""
    return randomise_batchnorms(UntraceableByFx()).eval(), {"x": torch.randn(2, 3, 8, 8)}


class TransposedAndLinear(nn.Module):
    """The pairs `torch.jit.freeze` does not fold: ConvTranspose + BN, Linear + BN1d, and a
    Linear whose features a Reshape splits into BN1d channels ([N, C·L] -> [N, C, L]). Tuple output."""

    def __init__(self) -> None:
        super().__init__()
        self.convt = nn.ConvTranspose2d(4, 6, 3, stride=2, groups=2)
        self.bn_convt = nn.BatchNorm2d(6)
        self.linear = nn.Linear(8, 6)
        self.bn_linear = nn.BatchNorm1d(6)
        self.split = nn.Linear(8, 12)
        self.bn_split = nn.BatchNorm1d(6)

    def forward(self, image: torch.Tensor, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        split = self.split(features).reshape(features.shape[0], 6, 2)
        return self.bn_convt(self.convt(image)), self.bn_linear(self.linear(features)), self.bn_split(split)


def transposed_and_linear() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return randomise_batchnorms(TransposedAndLinear()).eval(), {"image": torch.randn(2, 4, 5, 5), "features": torch.randn(2, 8)}
