"""A small BERT (random weights, built from its config): the model the README exports.

Two ways in, with the same weights:

    python -m deployfuse.examples.tiny_bert tiny-bert      # a save_pretrained folder (BertForMaskedLM)
    deployfuse export tiny-bert -o bert.onnx --task fill-mask

    deployfuse export deployfuse.examples.tiny_bert:build -o bert.onnx   # the BertModel and example inputs
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import transformers


def config() -> transformers.BertConfig:
    """2 layers, hidden size 128, 4 heads, a 1000-token vocabulary."""
    return transformers.BertConfig(
        vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=512, max_position_embeddings=256,
    )


def build() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The BertModel and example inputs for batch 2, sequence 32.

    Seeded, so every call builds the same weights (tests rebuild it to check the export).
    """
    torch.manual_seed(0)
    model = transformers.BertModel(config()).eval()
    input_ids = torch.randint(0, model.config.vocab_size, (2, 32))
    return model, {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}


def save_pretrained(folder: str | Path) -> Path:
    """Save a seeded BertForMaskedLM with this config to `folder` (config.json + weights)."""
    torch.manual_seed(0)
    transformers.BertForMaskedLM(config()).save_pretrained(folder)
    return Path(folder)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m deployfuse.examples.tiny_bert FOLDER")
    transformers.utils.logging.disable_progress_bar()
    print(f"saved {save_pretrained(sys.argv[1])}")
