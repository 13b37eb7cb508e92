"""The arithmetic of folding an eval-mode BatchNorm into the layer that feeds it.

In eval mode BatchNorm is a per-channel affine map of its input `y`:

    BN(y) = (y - mean) / sqrt(var + eps) * gamma + beta = y * s + (beta - mean * s),
    s = gamma / sqrt(var + eps)

and a convolution or linear layer is linear in its weight, `y = W * x + b`. So

    W' = W * s   (each output channel's slice of W scaled by that channel's s)
    b' = (b - mean) * s + beta

gives `W' * x + b' = BN(W * x + b)` exactly in real numbers. Everything is computed in
float64 and cast back once, so the folded layer is exact to the rounding of its own dtype.
"""

from __future__ import annotations

import torch


def batchnorm_scale_shift(
    running_mean: torch.Tensor,
    running_var: torch.Tensor,
    eps: float,
    gamma: torch.Tensor | None,
    beta: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return `(s, t)` in float64 with `BN(y) = y * s + t` per channel.

    `s = gamma / sqrt(var + eps)`, `t = beta - mean * s`; a BN without affine parameters
    (`affine=False`) has `gamma = 1`, `beta = 0`.
    """
    mean = running_mean.detach().double()
    scale = torch.rsqrt(running_var.detach().double() + eps)
    if gamma is not None:
        scale = scale * gamma.detach().double()
    shift = -mean * scale
    if beta is not None:
        shift = shift + beta.detach().double()
    return scale, shift


def fold_weights(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    scale: torch.Tensor,
    shift: torch.Tensor,
    transposed: bool = False,
    groups: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold `y * scale + shift` into a conv / conv-transpose / linear layer's weight and bias.

    Returns `(W', b')` in `weight`'s dtype: `W' = W * scale` along the output-channel axis,
    `b' = b * scale + shift` (`b = 0` when the layer has no bias), i.e.
    `b' = (b - mean) * s + beta`.

    The output-channel axis is axis 0 of a Conv / Linear weight (`[out, in/groups, *k]`,
    `[out, in]`). A ConvTranspose weight is `[in, out/groups, *k]`: output channel
    `g * out/groups + j` is column `j` of row block `g`, so the weight is viewed as
    `[groups, in/groups, out/groups, *k]` and scaled by `scale` viewed as `[groups, 1, out/groups]`.
    """
    w = weight.detach().double()
    if transposed:
        blocks = w.reshape(groups, w.shape[0] // groups, w.shape[1], *w.shape[2:])
        per_channel = scale.reshape(groups, 1, w.shape[1], *([1] * (w.dim() - 2)))
        folded = (blocks * per_channel).reshape(w.shape)
    else:
        folded = w * scale.reshape(-1, *([1] * (w.dim() - 1)))
    b = bias.detach().double() if bias is not None else torch.zeros_like(shift)
    return folded.to(weight.dtype), (b * scale + shift).to(weight.dtype)


def output_channels(weight: torch.Tensor, transposed: bool = False, groups: int = 1) -> int:
    """Number of output channels of a layer with this weight (see `fold_weights` for layouts)."""
    return weight.shape[1] * groups if transposed else weight.shape[0]
