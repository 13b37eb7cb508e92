"""patch_embed: a patchify Conv read as tokens becomes a Reshape/Transpose of the image and one
MatMul (+ bias), with the numbers of the graph before the rule (ORT optimisations off) on fresh
inputs: the zoo's ViT (fp32 and fp16 through the product's export path, dynamic batch run at 1
and 3, and TorchScript's Shape-based Reshape), transformers' CLIP vision tower (a Conv without
bias) and torchvision's VisionTransformer (reshape + permute). Convs that are no patchify Conv
(padding, stride != kernel, groups, H not a multiple of the kernel, an NCHW reader) stay Convs,
each with its reason."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
import torch
from _export import _trained_like, exported as exported_by, op_counts
from _forms import Form, exported

from deployfuse.backends.ort import run, session
from deployfuse.export import clean
from deployfuse.rewrite import RULE_TAG, fuse
from deployfuse.rewrite.report import FamilyResult

TOLERANCE = {np.float32: 1e-4, np.float16: 1e-2}  # x the output's largest magnitude


def _images(model: onnx.ModelProto, batch: int, seed: int) -> dict[str, np.ndarray]:
    (pixels,) = model.graph.input
    shape = [batch, *(d.dim_value for d in pixels.type.tensor_type.shape.dim[1:])]
    dtype = onnx.helper.tensor_dtype_to_np_dtype(pixels.type.tensor_type.elem_type)
    return {pixels.name: np.random.default_rng(seed).standard_normal(shape).astype(dtype)}


def _patch_embed(model: onnx.ModelProto, target: str = "ort-cuda") -> tuple[onnx.ModelProto, FamilyResult]:
    """`model` with the patch_embed family alone applied (guarded on a batch of 2), and its result."""
    out, report = fuse(model, target, [_images(model, 2, seed=0)], debug=True, families=["patch_embed"])
    (family,) = report.families
    assert not family.rolled_back, family.reason
    return out, family


def _assert_same(original: onnx.ModelProto, rewritten: onnx.ModelProto, batches: tuple[int, ...] = (1, 3)) -> None:
    """Both graphs on fresh random images at each batch, ORT graph optimisations off."""
    want_session, got_session = session(original, optimize=False, threads=1), session(rewritten, optimize=False, threads=1)
    for batch in batches:
        feed = _images(original, batch, seed=100 + batch)
        want, got = run(want_session, feed), run(got_session, feed)
        for name, ref in want.items():
            assert got[name].shape == ref.shape
            scale = float(np.abs(ref.astype(np.float64)).max())
            error = float(np.abs(got[name].astype(np.float64) - ref).max())
            assert error <= TOLERANCE[ref.dtype.type] * scale, f"batch {batch}, {name}: max abs error {error:.3e} (scale {scale:.3e})"


def _dynamo(module: torch.nn.Module, pixels: torch.Tensor) -> onnx.ModelProto:
    """`module` (its constant-initialised tensors made random: torchvision's head starts at zero)
    exported by the dynamo exporter with a dynamic batch, cleaned as the pipeline does."""
    _trained_like(module)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(module, (pixels,), dynamo=True, dynamic_shapes=({0: torch.export.Dim.AUTO},), opset_version=18, optimize=True, verbose=False)
    assert program is not None
    return clean(program.model_proto)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_vit_patch_conv_becomes_one_gemm(precision: str) -> None:
    """The zoo's ViT, exported as `deployfuse export` does (dynamic batch): its one Conv goes, one
    Reshape, one MatMul and one bias Add come, the Transposes stay as many (the 6-D one in, the
    tokens' (0, 2, 1) out: no pair back to NCHW), and batches 1 and 3 compute the same."""
    model = exported("vit", Form(precision=precision)).model
    out, family = _patch_embed(model)
    assert family.matches == {"patch_embed": 1}, family
    had, have = op_counts(model), op_counts(out)
    assert {op: have.get(op, 0) - had.get(op, 0) for op in ("Conv", "Reshape", "Transpose", "MatMul", "Add")} == {
        "Conv": -1, "Reshape": 1, "Transpose": 0, "MatMul": 1, "Add": 1}, (had, have)
    new = [n for n in out.graph.node if {p.key: p.value for p in n.metadata_props}.get(RULE_TAG) == "patch_embed"]
    assert sorted(n.op_type for n in new) == ["Add", "MatMul", "Reshape", "Reshape", "Transpose"], new
    (gemm,) = [n for n in new if n.op_type == "MatMul"]
    assert onnx.numpy_helper.to_array(next(t for t in out.graph.initializer if t.name == gemm.input[1])).shape == (3 * 8 * 8, 64)
    _assert_same(model, out)


def test_torchscript_shape_of_the_conv_form() -> None:
    """TorchScript's flatten(2): Reshape(conv, Concat(Shape(conv)[0:2], [-1])), Shape nodes and all replaced."""
    model = exported_by("vit", "torchscript")
    out, family = _patch_embed(model)
    assert family.matches == {"patch_embed": 1} and "Conv" not in op_counts(out), family
    _assert_same(model, out)


def _clip_vision() -> tuple[torch.nn.Module, torch.Tensor]:
    import transformers

    config = transformers.CLIPVisionConfig(image_size=32, patch_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    return transformers.CLIPVisionModel(config).eval(), torch.randn(2, 3, 32, 32)


def _torchvision_vit() -> tuple[torch.nn.Module, torch.Tensor]:
    import torchvision

    return torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=1, num_heads=2, hidden_dim=32, mlp_dim=64).eval(), torch.randn(2, 3, 32, 32)


@pytest.mark.parametrize("build", [_clip_vision, _torchvision_vit], ids=["clip_vision_no_bias", "torchvision_vit"])
def test_models_the_zoo_lacks(build) -> None:
    """CLIP's vision tower (patch Conv without bias: no Add) and torchvision's ViT (x.reshape(n, D, L).permute(0, 2, 1))."""
    torch.manual_seed(0)
    module, pixels = build()
    model = _dynamo(module, pixels)
    out, family = _patch_embed(model)
    assert family.matches == {"patch_embed": 1} and "Conv" not in op_counts(out), family
    _assert_same(model, out)


class _NotPatchify(torch.nn.Module):
    """Convs read as tokens that are no patchify Conv, and a patchify Conv whose NCHW output a ReLU reads."""

    def __init__(self) -> None:
        super().__init__()
        nn = torch.nn
        self.padded = nn.Conv2d(3, 8, 4, stride=4, padding=1)
        self.overlapping = nn.Conv2d(3, 8, 4, stride=2)
        self.grouped = nn.Conv2d(3, 6, 4, stride=4, groups=3)
        self.nchw = nn.Conv2d(3, 8, 4, stride=4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        tokens = tuple(conv(x).flatten(2).transpose(1, 2) for conv in (self.padded, self.overlapping, self.grouped))
        return (*tokens, torch.relu(self.nchw(x)))


class _Ragged(torch.nn.Module):
    """A patchify Conv on 18 x 18 (not a multiple of its kernel 4: the Conv drops the last rows)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 4, stride=4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x).flatten(2).transpose(1, 2)


@pytest.mark.parametrize(("build", "convs", "reasons"), [
    (lambda: (_NotPatchify(), torch.randn(2, 3, 16, 16)), 4, {"the Conv pads its input", "strides [2, 2] != kernel [4, 4]", "the Conv is grouped"}),
    (lambda: (_Ragged(), torch.randn(2, 3, 18, 18)), 1, {"H, W (18, 18) are not static multiples of the kernel [4, 4]"}),
], ids=["padding_stride_groups_nchw", "ragged"])
def test_other_convs_stay_convs(build, convs: int, reasons: set[str]) -> None:
    torch.manual_seed(0)
    module, pixels = build()
    model = _dynamo(module, pixels)
    out, family = _patch_embed(model)
    assert family.matches == {"patch_embed": 0} and op_counts(out)["Conv"] == convs, family
    assert reasons <= set(family.near_misses["patch_embed"]), family.near_misses


@pytest.mark.parametrize("target", ["ort-cuda", "ort-cpu", "tensorrt"])
def test_which_targets_get_it(target: str) -> None:
    """ort-cuda only: on ORT CPU the GEMM form was measured slower than MLAS's Conv, TensorRT runs the Conv well itself."""
    model = exported("vit", Form()).model
    out, report = fuse(model, target, [_images(model, 2, seed=0)], families=["patch_embed"])
    assert ("Conv" in op_counts(out)) == (target != "ort-cuda"), op_counts(out)
    assert [f.family for f in report.families if f.family == "patch_embed"] == (["patch_embed"] if target == "ort-cuda" else [])


def test_fp8_export_quantizes_the_patch_gemm() -> None:
    """An fp8 ort-cuda export (the fused fp16 graph, float8 Q/DQ, then fp8_gemm's lowering): the
    patch GEMM is one more float8 GEMM, an Fp8GemmAct reading the patch rows (its bias in the epilogue)."""
    from test_fp8_gemm import _lower, _qdq_model

    float_model, qdq, _, _ = _qdq_model("vit", False)
    tagged = {o for n in float_model.graph.node if {p.key: p.value for p in n.metadata_props}.get(RULE_TAG) == "patch_embed" for o in n.output}
    lowered = _lower(qdq)
    producers = {o: n for n in lowered.graph.node for o in n.output}
    patch = [n for n in lowered.graph.node if n.op_type == "Fp8GemmAct" and n.input[0] in tagged]
    assert len(patch) == 1 and producers[patch[0].input[0]].op_type == "Reshape", [n.op_type for n in lowered.graph.node]
    assert "Conv" not in op_counts(lowered) and not {"MatMul", "QuantizeLinear"} & set(op_counts(lowered))
