"""The README written into a Triton model repository: how to start the server, and what the
generated config could not carry (so nothing the artefact asked for is dropped silently)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from deployfuse.serve.signature import Signature
from deployfuse.serve.triton_config import ONNX_PLATFORM, ServingOptions


def repository_readme(
    name: str, platform: str, served_root: str, signature: Signature, options: ServingOptions,
    library: Path | None, unsupported: Mapping[str, str],
) -> str:
    """Markdown for REPO/README.md."""
    command = f"tritonserver --model-repository={served_root}"
    if library is not None and platform != ONNX_PLATFORM:
        command += f" --backend-config=tensorrt,plugins={served_root}/{name}/{library.name}"
    lines = [
        f"# Triton model repository: `{name}`",
        "",
        "Written by `deployfuse package`. Start Triton Inference Server on it:",
        "",
        "```bash",
        command,
        "```",
        "",
        f"then check `curl -s localhost:8000/v2/models/{name}/ready` (HTTP 200 when loaded).",
        "",
        f"- platform: `{platform}`, instances: {options.instances} x {options.device.upper()}, "
        f"max_batch_size: {options.max_batch_size}, dynamic batching: {'on' if options.dynamic_batching else 'off'}",
        "- inputs: " + ", ".join(f"`{t.name}` {t.triton_type} {list(t.dims)}" for t in signature.inputs),
        "- outputs: " + ", ".join(f"`{t.name}` {t.triton_type} {list(t.dims)}" for t in signature.outputs),
    ]
    if library is not None and platform == ONNX_PLATFORM:
        lines += [
            f"- `{name}/{library.name}` runs the `deployfuse.*` nodes; config.pbtxt loads it from "
            f"`{served_root}/{name}/{library.name}` (ONNX Runtime opens that path as written: mount the repository "
            "there, or re-run `deployfuse package --served-from DIR`). It needs ONNX Runtime >= 1.21 and, for its CUDA "
            "kernels, the CUDA runtime it was built with.",
        ]
    elif library is not None:
        lines += [
            f"- `{name}/{library.name}` holds the TensorRT plugins for the `deployfuse.*` layers. Triton's TensorRT "
            "backend loads it with `--backend-config=tensorrt,plugins=PATH` (above); `LD_PRELOAD=PATH tritonserver ...` "
            "works too. Build it against the TensorRT version of your Triton release.",
        ]
    if unsupported:
        lines += ["", "## Not carried into config.pbtxt", ""]
        lines += [f"- `{key}`: {why}" for key, why in unsupported.items()]
    return "\n".join(lines) + "\n"
