"""Architectures the tests do not hold, on the CPU: deployfuse's ort-cpu artefact against the plain export of the same model.

Each model is built from its transformers config at one size (`--size medium`: hidden 384, 6 layers, 6 heads, FFN 1536;
`base`: 768, 12, 12, 3072, BERT-base's; text at batch 1 x 128 tokens, images at 224 x 224) with trained-like random weights, exported twice by `deployfuse.export`
(target ort-cpu, fp32): with the fusions and with `fuse=False`. Both run with ONNX Runtime's default optimisations and 2
threads; runs are interleaved (the order alternating). Two sessions of one model differ by up to ±5 % on this project's
2-core machines (where their memory landed), so each pair of sessions is made `--repeats` times afresh (the order of
making them alternating) and timed for `--rounds` rounds: the ratio is the median of the repeats' ratios of medians, with
their range. Also printed: how many layers got a fused attention, and the artefact's largest op counts.

    python bench/cpu_generalise.py --out bench/results/cpu_generalise.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "rewrite")]

SIZES = {"medium": (384, 6, 6, 1536), "base": (768, 12, 12, 3072)}  # hidden, layers, heads, FFN
_FUSED_ATTENTION = ("com.microsoft.Attention", "com.microsoft.MultiHeadAttention", "com.microsoft.GroupQueryAttention")


def _models(size: str) -> dict[str, Callable[[], object]]:
    import transformers as t

    hidden, layers, heads, ffn = SIZES[size]

    text = {"vocab_size": 1000}
    return {
        "bert": lambda: t.BertModel(t.BertConfig(**text, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=ffn)),
        "roberta": lambda: t.RobertaModel(t.RobertaConfig(**text, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=ffn)),
        "distilbert": lambda: t.DistilBertModel(t.DistilBertConfig(**text, dim=hidden, n_layers=layers, n_heads=heads, hidden_dim=ffn)),
        "albert": lambda: t.AlbertModel(t.AlbertConfig(**text, embedding_size=128, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                                                       intermediate_size=ffn)),
        "deberta_v2": lambda: t.DebertaV2Model(t.DebertaV2Config(**text, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=ffn)),
        "opt": lambda: t.OPTModel(t.OPTConfig(**text, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, ffn_dim=ffn, word_embed_proj_dim=hidden,
                                              use_cache=False)),
        "gpt2": lambda: t.GPT2Model(t.GPT2Config(**text, n_embd=hidden, n_layer=layers, n_head=heads, use_cache=False)),
        "gpt_neo": lambda: t.GPTNeoModel(t.GPTNeoConfig(**text, hidden_size=hidden, num_layers=layers, num_heads=heads, attention_types=[[["global"], layers]],
                                                        use_cache=False)),
        "llama": lambda: t.LlamaModel(t.LlamaConfig(**text, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=2,
                                                    intermediate_size=ffn, use_cache=False)),
        "qwen2": lambda: t.Qwen2Model(t.Qwen2Config(**text, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=2,
                                                    intermediate_size=ffn, use_cache=False)),
        "phi": lambda: t.PhiModel(t.PhiConfig(**text, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=ffn, use_cache=False)),
        "bloom": lambda: t.BloomModel(t.BloomConfig(**text, hidden_size=hidden, n_layer=layers, n_head=heads, use_cache=False)),
        "falcon": lambda: t.FalconModel(t.FalconConfig(**text, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, use_cache=False)),
        "t5_encoder": lambda: t.T5EncoderModel(t.T5Config(**text, d_model=hidden, num_layers=layers, num_heads=heads, d_ff=ffn, d_kv=64)),
        "vit": lambda: t.ViTModel(t.ViTConfig(image_size=224, patch_size=16, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=ffn)),
        "clip_vision": lambda: t.CLIPVisionModel(t.CLIPVisionConfig(image_size=224, patch_size=16, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                                                                    intermediate_size=ffn)),
    }


def _inputs(name: str) -> dict:
    import torch

    if name in ("vit", "clip_vision"):
        return {"pixel_values": torch.randn(1, 3, 224, 224)}
    ids = torch.randint(0, 1000, (1, 128))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def main() -> None:
    import onnxruntime as ort
    import torch
    from _export import _trained_like

    import deployfuse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=SIZES, default="medium")
    parser.add_argument("--models", help="comma-separated (default: all), of: " + ",".join(_models("medium")))
    parser.add_argument("--rounds", type=int, default=20, help="interleaved rounds per pair of sessions")
    parser.add_argument("--repeats", type=int, default=3, help="pairs of sessions made afresh")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    models = _models(args.size)
    layers = SIZES[args.size][1]
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    rows = []
    for name in (args.models or ",".join(models)).split(","):
        torch.manual_seed(0)
        module = models[name]().eval()
        _trained_like(module)
        example = _inputs(name)
        with tempfile.TemporaryDirectory() as folder:
            paths, histogram = {}, {}
            for kind, fuse in (("plain", False), ("deployfuse", True)):
                result = deployfuse.export(module, Path(folder) / f"{kind}.onnx", example_inputs=example, target="ort-cpu", fuse=fuse, seed=0, verify_draws=1)
                paths[kind] = str(result.onnx_path)
                histogram = result.report.op_histogram
            ratios, medians = [], {kind: [] for kind in paths}
            for repeat in range(args.repeats):
                sessions = {kind: ort.InferenceSession(paths[kind], options, providers=["CPUExecutionProvider"])
                            for kind in (list(paths) if repeat % 2 == 0 else list(paths)[::-1])}
                feed = {i.name: example[i.name].numpy() for i in sessions["plain"].get_inputs()}
                times: dict[str, list[float]] = {kind: [] for kind in sessions}
                for round_ in range(args.rounds + 1):  # the first round warms up
                    for kind in list(sessions)[:: 1 if round_ % 2 else -1]:
                        start = time.perf_counter()
                        sessions[kind].run(None, feed)
                        if round_:
                            times[kind].append(time.perf_counter() - start)
                for kind in times:
                    medians[kind].append(statistics.median(times[kind]) * 1e3)
                ratios.append(medians["deployfuse"][-1] / medians["plain"][-1])
                del sessions
        plain, fused, ratio = statistics.median(medians["plain"]), statistics.median(medians["deployfuse"]), statistics.median(ratios)
        attention = sum(histogram.get(op, 0) for op in _FUSED_ATTENTION) + histogram.get("deployfuse.FusedMHA", 0)
        top = dict(sorted(histogram.items(), key=lambda item: -item[1])[:6])
        rows.append({"model": name, "plain_ms": plain, "deployfuse_ms": fused, "ratio": ratio, "ratio_range": [min(ratios), max(ratios)],
                     "fused_attention": attention, "layers": layers, "top_ops": top})
        print(f"{name:12s} plain {plain:7.2f} ms  deployfuse {fused:7.2f} ms  x{ratio:.3f} ({min(ratios):.3f}-{max(ratios):.3f})  "
              f"attention fused {attention}/{layers}  {top}", flush=True)
    if args.out:
        setup = {"size": args.size, "threads": args.threads, "rounds": args.rounds, "repeats": args.repeats, "ort": ort.__version__}
        args.out.write_text(json.dumps({**setup, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
