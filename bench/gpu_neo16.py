"""GPT-Neo-125M in fp16 on ONNX Runtime's CUDA EP: deployfuse's fused export (its float32-between-Casts attention as a
float32 MultiHeadAttention) against the plain export, interleaved. Random weights from the config; batch 8 x 128.

    python3 bench/gpu_neo16.py --ort-library plugins/build/gpu/libdeployfuse_ort.so [--batch 8] [--seq 128] [--rounds 10] [--calls 20]
"""

from __future__ import annotations

import argparse
import collections
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
import transformers

import deployfuse
from deployfuse.rewrite import fuse as fuse_families
from deployfuse.rewrite.fuser import family_names


def options(library: str | None) -> ort.SessionOptions:
    opts = ort.SessionOptions()
    if library:
        opts.register_custom_ops_library(library)
    return opts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--ort-library", help="libdeployfuse_ort.so: deployfuse nodes on their CUDA kernels (else their function bodies)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    cfg = transformers.GPTNeoConfig(hidden_size=768, num_layers=12, num_heads=12, attention_types=[[["global", "local"], 6]], use_cache=False)
    module = transformers.GPTNeoModel(cfg).eval().half()
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    with tempfile.TemporaryDirectory() as folder:
        run(args, module, inputs, Path(folder))


def run(args: argparse.Namespace, module: torch.nn.Module, inputs: dict[str, torch.Tensor], work: Path) -> None:
    """Export, fuse and time the variants in `work`."""
    sessions = {}
    for name, fuse in (("plain", False), ("deployfuse", True)):
        path = work / f"{name}.onnx"
        start = time.perf_counter()
        deployfuse.export(module, path, example_inputs=inputs, target="ort-cuda", precision="fp16", fuse=fuse, verify=False)
        model = onnx.load(str(path), load_external_data=False)
        ops = collections.Counter((n.domain + "::" if n.domain else "") + n.op_type for n in model.graph.node)
        print(f"{name}: export {time.perf_counter() - start:.0f} s, {sum(ops.values())} nodes, MHA {ops['com.microsoft::MultiHeadAttention']}, Softmax {ops['Softmax']}")
        sessions[name] = ort.InferenceSession(str(path), options(args.ort_library), providers=["CUDAExecutionProvider"])
    feed = {k: v.numpy() for k, v in inputs.items()}
    plain = onnx.load(str(work / "plain.onnx"))
    for name, families in (("attention only", ["attention"]), ("all but attention", [f for f in family_names() if f != "attention"])):
        fused, report = fuse_families(plain, "ort-cuda", [feed], families=families)
        print(f"{name}: {dict((k, v) for k, v in report.counts().items() if v)}")
        sessions[name] = ort.InferenceSession(fused.SerializeToString(), options(args.ort_library), providers=["CUDAExecutionProvider"])
    outs = {name: sess.run(None, feed)[0].astype(np.float32) for name, sess in sessions.items()}
    ref = outs["plain"]
    print(f"deployfuse vs plain on CUDA: max|diff| {np.abs(outs['deployfuse'] - ref).max():.3g} (max|plain| {np.abs(ref).max():.3g})")
    times: dict[str, list[float]] = {name: [] for name in sessions}
    for sess in sessions.values():
        for _ in range(5):
            sess.run(None, feed)
    for r in range(args.rounds):
        for name in (list(sessions) if r % 2 == 0 else list(sessions)[::-1]):
            start = time.perf_counter()
            for _ in range(args.calls):
                sessions[name].run(None, feed)
            times[name].append((time.perf_counter() - start) / args.calls * 1e3)
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"GPT-Neo-125M fp16 batch {args.batch} x {args.seq}, {args.rounds} rounds of {args.calls} calls: " +
          ", ".join(f"{n} {m:.3f} ms" for n, m in med.items()) + f"; deployfuse / plain {med['deployfuse'] / med['plain']:.3f}")


if __name__ == "__main__":
    main()
