"""`deployfuse serve`: a local Triton endpoint for an ONNX artefact (PyTriton), until Ctrl-C."""

from __future__ import annotations

import argparse

SUMMARY = "serve an ONNX artefact with Triton Inference Server (PyTriton) until Ctrl-C"
DESCRIPTION = """\
Start Triton Inference Server (the one the nvidia-pytriton wheel bundles) serving ARTEFACT over
HTTP (--port), gRPC (--port + 1) and metrics (--port + 2), the model run by
deployfuse.InferenceSession, with dynamic batching when the model has a batch axis. Listens on
127.0.0.1 unless --host says otherwise. For a production server, write a model repository with
`deployfuse package --triton`.
"""
EPILOG = "example: deployfuse serve bert.onnx --port 8000 --max-batch-size 16; then: curl localhost:8000/v2/models/bert/ready"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("artefact", metavar="ARTEFACT", help="the ONNX model to serve")
    parser.add_argument("--port", type=int, default=8000, help="HTTP port; gRPC and metrics take the next two (default 8000)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 exposes the model to the network)")
    parser.add_argument("--name", help="the model's name on the server (default: the file stem)")
    parser.add_argument("--max-batch-size", type=int, metavar="N", help="largest batch the dynamic batcher forms (default 16 with a batch axis, else 0)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="execution provider (default: CUDA when onnxruntime has it)")
    parser.add_argument("--log-file", metavar="FILE", help="where tritonserver's own log goes (default: a file in the temp folder, printed at start)")


def run(args: argparse.Namespace) -> int:
    """Start, print the endpoints, block until Ctrl-C, stop."""
    from deployfuse.io import check_outputs
    from deployfuse.runtime import CPU, CUDA
    from deployfuse.serve.server import LocalServer

    check_outputs({"--log-file": args.log_file}, {"ARTEFACT": args.artefact})

    providers = {"auto": None, "cpu": [CPU], "cuda": [CUDA, CPU]}[args.device]
    server = LocalServer(args.artefact, name=args.name, max_batch_size=args.max_batch_size, host=args.host, port=args.port, providers=providers,
                         log_file=args.log_file)
    try:
        server.start()
        print(f"serving {args.artefact} as {server.name!r} (max batch {server.max_batch_size}, {', '.join(server.session.get_providers())})")
        print(f"  HTTP  http://{server.http_url}/v2/models/{server.name}")
        print(f"  gRPC  {server.grpc_url}")
        print(f"  log   {server.log_file}")
        print("Ctrl-C stops it.", flush=True)
        server.serve_forever()
    except KeyboardInterrupt:
        print("stopping", flush=True)
    finally:
        server.stop()
    return 0
