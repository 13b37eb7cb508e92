"""`deployfuse package`: a Triton Inference Server model repository from an artefact."""

from __future__ import annotations

import argparse

from deployfuse.cli._args import argument_type

SUMMARY = "write a Triton model repository for an ONNX artefact or a TensorRT engine"
DESCRIPTION = """\
Write a Triton Inference Server model repository serving ARTEFACT: config.pbtxt
(onnxruntime_onnx for ONNX, tensorrt_plan for engines; checked against Triton's ModelConfig
schema), the model, deployfuse's library when the graph has deployfuse.* nodes, and a README
with the tritonserver command. The artefact's CUDA options go to the onnxruntime backend's
'cuda' accelerator; the README names any it cannot carry.
"""
EPILOG = "example: deployfuse package bert.onnx --triton models --name bert --max-batch-size 16 --dynamic-batching --instances 2"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from deployfuse.engine.profiles import ShapeProfile

    parser.add_argument("artefact", metavar="ARTEFACT", help="an ONNX model (.onnx) or a TensorRT engine (.plan/.engine)")
    parser.add_argument("--triton", required=True, metavar="REPO", help="the model repository folder to create")
    parser.add_argument("--name", help="the model's name in Triton (default: the artefact's file stem)")
    parser.add_argument("--max-batch-size", type=int, default=0, metavar="N",
                        help="let Triton batch along axis 0 up to N (needs a dynamic batch axis; default 0: no batching)")
    parser.add_argument("--instances", type=int, default=1, metavar="N", help="model instances per device (default 1)")
    parser.add_argument("--device", choices=("gpu", "cpu"), default="gpu", help="instance group kind (default gpu)")
    parser.add_argument("--dynamic-batching", action="store_true", help="stack concurrent requests into one batch (needs --max-batch-size)")
    parser.add_argument("--force", action="store_true", help="replace REPO when it exists and is not empty")
    parser.add_argument("--served-from", metavar="DIR", help="the path the server sees REPO at, e.g. /models in a container (default: REPO's absolute path)")
    engine = parser.add_argument_group("TensorRT engines that cannot be opened here (no GPU)")
    engine.add_argument("--onnx", metavar="MODEL.onnx", help="the ONNX model the engine was built from (its dims stand for the engine's)")
    engine.add_argument("--profile", action="append", default=[], type=argument_type(ShapeProfile.parse), metavar="NAME:MIN:OPT:MAX",
                        help="the profiles given to `deployfuse build` (default: the ones it derives)")


def run(args: argparse.Namespace) -> int:
    """Write the repository and print what is in it."""
    from deployfuse.io import check_outputs
    from deployfuse.serve import package_triton

    check_outputs({"--triton": args.triton}, {"ARTEFACT": args.artefact, "--onnx": args.onnx}, folders={"--triton"})
    result = package_triton(
        args.artefact, args.triton, name=args.name, max_batch_size=args.max_batch_size, instances=args.instances,
        device=args.device, dynamic_batching=args.dynamic_batching, force=args.force, source_onnx=args.onnx,
        profiles=args.profile, served_from=args.served_from,
    )
    print(result.summary())
    return 0
