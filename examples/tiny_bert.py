"""A small BERT (random weights, built from its config): the model the README exports.

`deployfuse export examples.tiny_bert:build -o bert.onnx` calls `build()`, which returns the
module and example inputs, so no `--input` is needed.
"""

from __future__ import annotations

import torch
import transformers


def build() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """A 2-layer BERT with hidden size 128 and example inputs for batch 2, sequence 32.

    Seeded, so every call builds the same weights (tests rebuild it to check the export).
    """
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=512, max_position_embeddings=256,
    )
    model = transformers.BertModel(config).eval()
    input_ids = torch.randint(0, config.vocab_size, (2, 32))
    return model, {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
