"""A bounded load run on a real Triton Inference Server serving a deployfuse artefact.

Exports deployfuse/examples/tiny_bert.py (2-layer BERT, random weights, dynamic batch and sequence) with
`deployfuse export` unless --model is given, serves it with PyTriton on 127.0.0.1 (the model
run by deployfuse.InferenceSession on CPU, dynamic batching on), sends --requests requests from
--clients concurrent tritonclient clients per protocol, checks every answer against
deployfuse.InferenceSession run directly on the same inputs, and writes the numbers:

    python bench/triton_load.py                      # 2,000 requests x 32 clients, gRPC then HTTP
    python bench/triton_load.py --requests 200 --clients 8 --out /tmp/load.json

Exit 1 when a request is lost or wrong, or a run exceeds --time-limit.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def export_tiny_bert(out: Path) -> Path:
    """The README's tiny BERT, dynamic batch and sequence axes."""
    import deployfuse
    from deployfuse.inputs import DynamicAxis

    dynamic = [DynamicAxis(n, axis, label) for n in ("input_ids", "attention_mask") for axis, label in ((0, "batch"), (1, "seq"))]
    deployfuse.export("deployfuse.examples.tiny_bert:build", out, dynamic=dynamic)
    return out


def make_feeds(model_path: Path, count: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """`count` random requests of batch 1-4 at the export's other dims."""
    import onnx

    from deployfuse.runtime import input_shapes, random_feed

    model = onnx.load(str(model_path), load_external_data=False)
    base = input_shapes(model)
    feeds = []
    for i in range(count):
        batch = 1 + i % 4
        feeds.append(random_feed(model, {n: (batch, *s[1:]) for n, s in base.items()}, seed=seed + i))
    return feeds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="an ONNX artefact with a batch axis (default: export tiny_bert)")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--protocols", default="grpc,http")
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per protocol")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "triton_load.json")
    args = parser.parse_args(argv)

    from deployfuse.runtime import CPU, InferenceSession
    from deployfuse.serve.load import load_run
    from deployfuse.serve.server import LocalServer

    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or export_tiny_bert(Path(tmp) / "tiny_bert.onnx")
        feeds = make_feeds(model, 64)
        reference = InferenceSession(model, providers=[CPU])
        names = [o.name for o in reference.get_outputs()]
        expected = [dict(zip(names, reference.run(names, feed))) for feed in feeds]
        runs = []
        with LocalServer(model, name="model", max_batch_size=args.max_batch_size, providers=[CPU]) as server:
            for protocol in args.protocols.split(","):
                url = server.grpc_url if protocol == "grpc" else server.http_url
                result = load_run(url, "model", feeds, expected, requests=args.requests, clients=args.clients, protocol=protocol,
                                  time_limit_s=args.time_limit, access_token=server.access_token)
                print(result.summary(), flush=True)
                runs.append(result.as_dict())
    import onnxruntime
    import pytriton
    import tritonclient

    record = {
        "what": "bounded load run on Triton Inference Server (PyTriton's tritonserver, python backend) serving a deployfuse "
                "artefact through deployfuse.InferenceSession on CPU, dynamic batching on; every answer checked against "
                "the same InferenceSession run directly (rtol 1e-4, atol 1e-5)",
        "model": "deployfuse/examples/tiny_bert.py (2-layer BERT, hidden 128), requests of batch 1-4 x seq 32" if args.model is None else str(args.model),
        "max_batch_size": args.max_batch_size,
        "runs": runs,
        "environment": {
            "cpu": _cpu_model(), "cores": os.cpu_count(), "load_average_1min_after": round(os.getloadavg()[0], 2),
            "python": platform.python_version(),
            "onnxruntime": onnxruntime.__version__, "nvidia-pytriton": getattr(pytriton, "__version__", _version("nvidia-pytriton")),
            "tritonclient": getattr(tritonclient, "__version__", _version("tritonclient")),
        },
        "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]) if argv is None else "triton_load.main(" + repr(argv) + ")",
        "utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    bad = any(r["lost"] or r["wrong"] or r["seconds"] > args.time_limit for r in runs)
    return 1 if bad else 0


def _cpu_model() -> str:
    """The CPU's model name (machine-wide: other work on it shows in the load average)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


if __name__ == "__main__":
    sys.exit(main())
