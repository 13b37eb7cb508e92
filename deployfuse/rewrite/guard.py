"""The guard: a family's rewrite is kept only if the graph stays valid and computes the same.

Checks, in order: `onnx.checker` (full), strict shape inference, an ONNX Runtime session with
ORT's own graph optimisations OFF (so ORT cannot hide or cause a difference), and the outputs
against the model from before the family on the caller's feeds:

    |after - before| <= rtol * (|before| + max|before|)   elementwise, NaN/Inf where before has none fails

For ort-cuda / tensorrt the CPU session is a proxy (CUDA is used when this ORT has it).
Given deployfuse's custom-op library, the sessions run deployfuse nodes on its native kernels,
so the check covers the kernels a user's session runs, not only the function bodies.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from deployfuse.backends import ort as ort_backend
from deployfuse.errors import first_line
from deployfuse.io import default_opset
from deployfuse.targets import CUDA_PROVIDER, Target, ort_private

_ORT_PRIVATE = "deployfuse.ort_onnx_domain"
RTOL = {np.dtype(np.float32): 1e-3, np.dtype(np.float64): 1e-6, np.dtype(np.float16): 2e-2}


class GuardFailure(Exception):
    """The rewrite broke the graph; the message is the one-line reason."""


def providers_for(target: Target) -> list[str]:
    """Execution providers the guard runs `target` on: the real one when present, else CPU."""
    import onnxruntime as ort

    if target.cuda and CUDA_PROVIDER in ort.get_available_providers():
        return list(target.providers)
    return ["CPUExecutionProvider"]


def run_outputs(model: onnx.ModelProto, feeds: Sequence[Mapping[str, np.ndarray]], providers: Sequence[str],
                custom_ops_library: str | os.PathLike[str] | None = None) -> list[dict[str, np.ndarray]]:
    """Outputs of `model` on every feed, ORT graph optimisations off; deployfuse nodes on
    `custom_ops_library`'s kernels when given, else as their function bodies. ORT's own thread count, as the
    verification's and the gate's sessions (with one thread a 4-layer BERT's fuse step at batch 8 took 17.3 s
    instead of 15.1 on a 2-core host; the guard's share grows with the cores it left idle)."""
    sess = ort_backend.session(model, providers=providers, optimize=False, custom_ops_library=custom_ops_library)
    return [ort_backend.run(sess, feed) for feed in feeds]


def check_model(model: onnx.ModelProto) -> None:
    """onnx.checker (full) and strict shape inference, GuardFailure with the reason.

    ORT's schema-less ONNX-domain contrib ops (SimplifiedLayerNormalization, LayerNormalization
    before opset 17) are checked as
    custom-domain nodes: use this, not a bare onnx.checker, on a model fused for ONNX Runtime.
    """
    schema_view = _without_ort_onnx_domain_ops(model)
    try:
        onnx.checker.check_model(schema_view, full_check=True)
    except Exception as exc:  # the checker raises several types
        raise GuardFailure(f"onnx.checker: {first_line(exc)}") from None
    try:
        onnx.shape_inference.infer_shapes(schema_view, check_type=True, strict_mode=True, data_prop=True)
    except Exception as exc:
        raise GuardFailure(f"shape inference: {first_line(exc)}") from None


def check(model: onnx.ModelProto, reference: list[dict[str, np.ndarray]], feeds: Sequence[Mapping[str, np.ndarray]], providers: Sequence[str],
          custom_ops_library: str | os.PathLike[str] | None = None) -> list[dict[str, np.ndarray]]:
    """The outputs of `model` on `feeds`; GuardFailure with the reason when `model` is invalid
    or its outputs differ from `reference`.

    Args:
        model: the rewritten model.
        reference: outputs of the model before the rewrite, one dict per feed.
        feeds: the inputs `reference` was computed on.
        providers: execution providers for the session.
        custom_ops_library: deployfuse's custom-op library (`backends.ort.native_library`), or
            None to run deployfuse nodes as their function bodies.
    """
    check_model(model)
    try:
        got = run_outputs(model, feeds, providers, custom_ops_library)
    except Exception as exc:
        raise GuardFailure(f"onnxruntime: {first_line(exc)}") from None
    for i, (want, have) in enumerate(zip(reference, got)):
        for name, ref in want.items():
            if name not in have:
                raise GuardFailure(f"output {name!r} disappeared")
            _compare(name, i, ref, have[name])
    return got


def _without_ort_onnx_domain_ops(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model`, with ORT's schema-less ONNX-domain contrib ops (at the model's opset) moved to a
    private domain so that onnx.checker and shape inference check everything else instead of
    stopping at them."""
    opset = default_opset(model) or 0

    def private(node: onnx.NodeProto) -> bool:
        return node.domain in ("", "ai.onnx") and ort_private(node.op_type, opset)

    if not any(private(n) for n in model.graph.node):
        return model
    view = onnx.ModelProto()
    view.CopyFrom(model)
    for node in view.graph.node:
        if private(node):
            node.domain = _ORT_PRIVATE
    view.opset_import.append(onnx.helper.make_opsetid(_ORT_PRIVATE, 1))
    return view


def _compare(name: str, feed: int, ref: np.ndarray, out: np.ndarray) -> None:
    if ref.shape != out.shape or ref.dtype != out.dtype:
        raise GuardFailure(f"output {name!r}: {out.dtype}{list(out.shape)} instead of {ref.dtype}{list(ref.shape)}")
    if not np.issubdtype(ref.dtype, np.floating):
        if not np.array_equal(ref, out):
            raise GuardFailure(f"output {name!r} (feed {feed}) changed")
        return
    ref64, out64 = ref.astype(np.float64), out.astype(np.float64)
    finite = np.isfinite(ref64)
    if not np.array_equal(finite, np.isfinite(out64)):
        raise GuardFailure(f"output {name!r} (feed {feed}): non-finite values differ")
    if not finite.any():
        return
    rtol = RTOL.get(ref.dtype, 2e-2)
    err = np.abs(out64 - ref64)[finite]
    bound = rtol * (np.abs(ref64)[finite] + np.abs(ref64[finite]).max())
    if (err > bound).any():
        worst = float((err / np.maximum(bound, 1e-30)).max())
        raise GuardFailure(f"output {name!r} (feed {feed}): max abs error {err.max():.3e}, {worst:.1f}x the tolerance")


