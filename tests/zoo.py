"""The model zoo the tests use: real architectures from transformers / torchvision configs,
small enough for a 2-core CPU, with random weights (nothing is downloaded).

Each entry builds `(module, example_inputs)`; example inputs are named like the forward's
parameters. `dynamic` lists the axes that may vary, as `--dynamic` would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from deployfuse.inputs import DynamicAxis, Inputs


@dataclass(frozen=True)
class ZooModel:
    name: str
    build: Callable[[], tuple[torch.nn.Module, Inputs]]
    dynamic: tuple[DynamicAxis, ...] = field(default=())
    layers: int = 0  # transformer layers, for expected fusion counts


def _ids(batch: int, seq: int, vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq))


def _text_dynamic(*names: str) -> tuple[DynamicAxis, ...]:
    return tuple(DynamicAxis(n, a, lbl) for n in names for a, lbl in ((0, "batch"), (1, "seq")))


def bert() -> tuple[torch.nn.Module, Inputs]:
    import transformers

    cfg = transformers.BertConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, max_position_embeddings=128)
    ids = _ids(2, 16, cfg.vocab_size)
    return transformers.BertModel(cfg).eval(), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def gpt2() -> tuple[torch.nn.Module, Inputs]:
    import transformers

    cfg = transformers.GPT2Config(vocab_size=512, n_embd=64, n_layer=2, n_head=4, n_positions=128, use_cache=False, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2Model(cfg).eval(), {"input_ids": _ids(2, 16, cfg.vocab_size)}


def vit() -> tuple[torch.nn.Module, Inputs]:
    import transformers

    cfg = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    return transformers.ViTModel(cfg, add_pooling_layer=False).eval(), {"pixel_values": torch.randn(2, 3, 32, 32)}


def llama() -> tuple[torch.nn.Module, Inputs]:
    """LLaMA-like: RMSNorm, rotary embeddings, grouped-query attention (4 query heads, 2 KV heads)."""
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=128, use_cache=False)
    return transformers.LlamaModel(cfg).eval(), {"input_ids": _ids(2, 16, cfg.vocab_size)}


def whisper_encoder() -> tuple[torch.nn.Module, Inputs]:
    import transformers
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    cfg = transformers.WhisperConfig(d_model=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128, num_mel_bins=16, max_source_positions=32)
    encoder = WhisperEncoder(cfg).eval()
    return encoder, {"input_features": torch.randn(2, 16, 64)}


def resnet18() -> tuple[torch.nn.Module, Inputs]:
    import torchvision

    return torchvision.models.resnet18(num_classes=10).eval(), {"x": torch.randn(2, 3, 64, 64)}


def convnext() -> tuple[torch.nn.Module, Inputs]:
    """ConvNeXt: depthwise conv, channels-last LayerNorm, GELU MLP."""
    import torchvision

    block = torchvision.models.convnext.CNBlockConfig
    model = torchvision.models.ConvNeXt([block(16, 32, 1), block(32, None, 1)], num_classes=10)
    return model.eval(), {"x": torch.randn(2, 3, 32, 32)}


class _Upsampler(torch.nn.Module):
    """A small decoder: Conv2d + BN + ReLU, ConvTranspose2d + BN + ReLU, a Conv1d over the
    flattened rows and a Linear + BatchNorm1d head (the pairs a BN fold must handle in every form)."""

    def __init__(self) -> None:
        super().__init__()
        nn = torch.nn
        self.down = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.up = nn.Sequential(nn.ConvTranspose2d(8, 4, 2, stride=2), nn.BatchNorm2d(4), nn.ReLU())
        self.rows = nn.Conv1d(4, 4, 3, padding=1)
        self.head = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.rows(self.up(self.down(x)).flatten(2))
        return h, self.head(h.mean(-1))


def upsampler() -> tuple[torch.nn.Module, Inputs]:
    return _Upsampler().eval(), {"x": torch.randn(2, 3, 8, 8)}


ZOO: dict[str, ZooModel] = {
    z.name: z
    for z in (
        ZooModel("bert", bert, _text_dynamic("input_ids", "attention_mask"), layers=2),
        ZooModel("gpt2", gpt2, _text_dynamic("input_ids"), layers=2),
        ZooModel("vit", vit, (DynamicAxis("pixel_values", 0, "batch"),), layers=2),
        ZooModel("llama", llama, _text_dynamic("input_ids"), layers=2),
        ZooModel("whisper_encoder", whisper_encoder, (DynamicAxis("input_features", 0, "batch"),), layers=2),
        ZooModel("resnet18", resnet18, (DynamicAxis("x", 0, "batch"),)),
        ZooModel("convnext", convnext, (DynamicAxis("x", 0, "batch"),)),
        ZooModel("upsampler", upsampler, (DynamicAxis("x", 0, "batch"),)),
    )
}
