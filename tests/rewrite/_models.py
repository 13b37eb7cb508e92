"""Small hand-built blocks for forms the zoo's transformers do not write (kept tiny).

Each builder returns `(module, inputs)` like tests/zoo.py entries; `dynamic` axes are batch only.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


class HandNorms(torch.nn.Module):
    """Hand-written LayerNorm and RMSNorm (as older / research code spells them), QuickGELU,
    tanh-GELU, and Linear + ReLU / SiLU / sigmoid epilogues."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.ln_w, self.ln_b = torch.nn.Parameter(torch.randn(width)), torch.nn.Parameter(torch.randn(width))
        self.rms_w = torch.nn.Parameter(torch.randn(width))
        self.fc = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mu = x.mean(-1, keepdim=True)
        var = (x - mu).pow(2).mean(-1, keepdim=True)
        h = (x - mu) / torch.sqrt(var + 1e-6) * self.ln_w + self.ln_b
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.rms_w
        h = self.fc[0](h)
        h = h * torch.sigmoid(1.702 * h)
        h = F.gelu(self.fc[1](h), approximate="tanh")
        h = torch.relu(self.fc[2](h))
        h = F.silu(self.fc[3](h))
        return torch.sigmoid(self.fc[4](h))


class FeatureEncoder(torch.nn.Module):
    """wav2vec2-like conv feature layer: Conv1d -> LayerNorm over channels -> GELU."""

    def __init__(self, channels: int = 16) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(4, channels, 3)
        self.norm = torch.nn.LayerNorm(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x).transpose(1, 2)
        return F.gelu(self.norm(h))


class TransposedNormGelu(torch.nn.Module):
    """wav2vec2's layer-norm conv layer: Conv1d -> LayerNorm over channels in a transposed view
    -> transpose back -> GELU (the activation after the transpose)."""

    def __init__(self, channels: int = 16) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(4, channels, 3)
        self.norm = torch.nn.LayerNorm(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.conv(x).transpose(-2, -1)).transpose(-2, -1)
        return F.gelu(h)


class UNetBlock(torch.nn.Module):
    """Diffusion-style ResNet block: GroupNorm -> SiLU -> Conv, twice, plus the residual."""

    def __init__(self, channels: int = 16, groups: int = 4) -> None:
        super().__init__()
        self.norm1, self.norm2 = torch.nn.GroupNorm(groups, channels), torch.nn.GroupNorm(groups, channels)
        self.conv1 = torch.nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(channels, channels, 3, padding=1)
        for norm in (self.norm1, self.norm2):  # non-trivial affine, as trained weights have
            torch.nn.init.normal_(norm.weight)
            torch.nn.init.normal_(norm.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        return x + self.conv2(F.silu(self.norm2(h)))


BLOCKS = {
    "hand_norms": lambda: (HandNorms().eval(), {"x": torch.randn(2, 8, 32)}),
    "feature_encoder": lambda: (FeatureEncoder().eval(), {"x": torch.randn(2, 4, 20)}),
    "transposed_norm_gelu": lambda: (TransposedNormGelu().eval(), {"x": torch.randn(2, 4, 20)}),
    "unet_block": lambda: (UNetBlock().eval(), {"x": torch.randn(2, 16, 8, 8)}),
}


class UpcastNorms(torch.nn.Module):
    """fp16 norms that compute their statistics in float, as LLaMA's RMSNorm and T5-style
    LayerNorms do: x.float() -> normalise -> .to(fp16) -> · γ (+ β)."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.ln_w, self.ln_b = torch.nn.Parameter(torch.randn(width)), torch.nn.Parameter(torch.randn(width))
        self.rms_w = torch.nn.Parameter(torch.randn(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        mu = xf.mean(-1, keepdim=True)
        var = (xf - mu).pow(2).mean(-1, keepdim=True)
        h = ((xf - mu) / torch.sqrt(var + 1e-5)).to(x.dtype) * self.ln_w + self.ln_b
        hf = h.float()
        return (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * self.rms_w


BLOCKS["upcast_norms_fp16"] = lambda: (UpcastNorms().half().eval(), {"x": torch.randn(2, 8, 32).half()})


class GemmProjections(torch.nn.Module):
    """Self-attention whose Q, K, V projections run on the flattened tokens, one per projection
    as GPT-2's Conv1D does for its packed one: Reshape(3-D -> 2-D) -> Gemm(bias) -> Reshape back in
    ONNX. Q is an addmm (Gemm), K a plain mm (MatMul, no bias), V a 2-D linear (Gemm, transB)."""

    def __init__(self, width: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.weights = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(width, width) / width**0.5) for _ in range(3))
        self.q_bias, self.v_bias = torch.nn.Parameter(torch.randn(width)), torch.nn.Parameter(torch.randn(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        flat = x.reshape(-1, d)
        q = torch.addmm(self.q_bias, flat, self.weights[0]).view(b, s, d)
        k = torch.mm(flat, self.weights[1]).view(b, s, d)
        v = F.linear(flat, self.weights[2], self.v_bias).view(b, s, d)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v)
        return out.transpose(1, 2).reshape(b, s, d)


BLOCKS["gemm_projections"] = lambda: (GemmProjections().eval(), {"x": torch.randn(2, 8, 32)})


class MaskedFillAttention(torch.nn.Module):
    """nanoGPT's (and minGPT's) causal self-attention, written by hand: one packed c_attn split in three, scores
    (q @ kᵀ) / √hd masked by `masked_fill(tril == 0, fill)` on a [1, 1, T, T] buffer sliced to the sequence, softmax, @ v.
    `fill` -inf as nanoGPT writes it; a fill above -1e4 is a score, not a mask."""

    def __init__(self, width: int = 32, heads: int = 4, positions: int = 16, fill: float = float("-inf")) -> None:
        super().__init__()
        self.heads, self.fill = heads, fill
        self.c_attn, self.c_proj = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
        self.register_buffer("bias", torch.tril(torch.ones(positions, positions)).view(1, 1, positions, positions))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (h.view(b, t, self.heads, c // self.heads).transpose(1, 2) for h in self.c_attn(x).split(c, dim=2))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = F.softmax(att.masked_fill(self.bias[:, :, :t, :t] == 0, self.fill), dim=-1)
        return self.c_proj((att @ v).transpose(1, 2).contiguous().view(b, t, c))


BLOCKS["masked_fill_attention"] = lambda: (MaskedFillAttention().eval(), {"x": torch.randn(2, 8, 32)})
BLOCKS["masked_fill_score"] = lambda: (MaskedFillAttention(fill=-100.0).eval(), {"x": torch.randn(2, 8, 32)})


class GroupedEncoder(torch.nn.Module):
    """Bidirectional attention, 4 query heads sharing 2 K/V heads, K/V repeated as
    transformers' repeat_kv writes it (Unsqueeze → Expand → Reshape); no mask."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = torch.nn.Linear(32, 32), torch.nn.Linear(32, 16), torch.nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q = self.q(x).view(b, n, 4, 8).transpose(1, 2)
        k, v = (proj(x).view(b, n, 2, 8).transpose(1, 2) for proj in (self.k, self.v))
        k, v = (t[:, :, None].expand(b, 2, 2, n, 8).reshape(b, 4, n, 8) for t in (k, v))
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, 32)


BLOCKS["grouped_encoder"] = lambda: (GroupedEncoder().eval(), {"x": torch.randn(2, 8, 32)})


class VarargsBert(torch.nn.Module):
    """A user's `forward(self, *args)` wrapper around a tiny BERT, returning one tensor."""

    def __init__(self) -> None:
        super().__init__()
        from zoo import bert

        self.m = bert()[0]

    def forward(self, *a: torch.Tensor) -> torch.Tensor:
        return self.m(input_ids=a[0], attention_mask=a[1]).last_hidden_state


def varargs_bert() -> VarargsBert:
    """Factory form of `VarargsBert`, inputs left to `--input`."""
    return VarargsBert().eval()


def varargs_bert_with_inputs() -> tuple[VarargsBert, tuple[torch.Tensor, torch.Tensor]]:
    """Factory form with positional example inputs (named input_0, input_1); seeded, as the tests
    check names: unseeded, 1 of 9 local runs and a fresh-clone CI run drew weights that put an fp32
    output past rtol 1e-4."""
    torch.manual_seed(0)
    ids = torch.randint(0, 512, (2, 8))
    return VarargsBert().eval(), (ids, torch.ones_like(ids))


class CachedRotary(torch.nn.Module):
    """Rotary embeddings read from precomputed cos / sin tables at the position ids (GPT-NeoX and
    older LLaMA code): Unsqueeze(Gather(table, position_ids), 1)."""

    def __init__(self, heads: int = 2, head_dim: int = 8, max_positions: int = 32) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.q = torch.nn.Linear(heads * head_dim, heads * head_dim)
        inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        angles = torch.outer(torch.arange(max_positions).float(), inv)
        self.register_buffer("cos_cached", torch.cat([angles, angles], -1).cos())
        self.register_buffer("sin_cached", torch.cat([angles, angles], -1).sin())

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q = self.q(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)
        cos, sin = self.cos_cached[position_ids].unsqueeze(1), self.sin_cached[position_ids].unsqueeze(1)
        half = self.head_dim // 2
        rotated = torch.cat([-q[..., half:], q[..., :half]], dim=-1)
        return q * cos + rotated * sin


BLOCKS["cached_rotary"] = lambda: (CachedRotary().eval(), {"x": torch.randn(2, 8, 16), "position_ids": torch.arange(8)[None]})  # shared over the batch
