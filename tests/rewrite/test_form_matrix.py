"""The form matrix: every zoo model, exported in every form it supports, gets the same fusions.

Forms (tests/rewrite/_forms.py): static or dynamic shapes, fp32 / fp16 / bf16, the dynamo or the
TorchScript exporter, the module itself or wrapped in a `forward(self, *args)` module. For each
target, each form must have at least the fused ops of each kind the reference form (dynamic
shapes, fp32, dynamo, the module itself) has — a form may only gain fusions — no rolled-back
family, and outputs equal to PyTorch's on fresh inputs at every shape the pipeline verifies.

A kind is excused only for a reason the test states: the target has no kernel for it on the
form's dtype (the profile says so), the op it is made from has none (GroupQueryAttention is
made from MultiHeadAttention), or the model itself computes something else in that form
(`MODEL_EXCEPTIONS`). CI runs the fp32 forms; fp16, bf16 and TorchScript `*args` are `slow`
(`pytest -m slow`). Print the counts with `python tests/rewrite/form_counts.py`.
"""

from __future__ import annotations

import pytest
from _forms import BASE, FP32_FORMS, SLOW_FORMS, UNSUPPORTED, Form, covered, exported, fused, fused_ops, supported, verify
from zoo import ZOO

from deployfuse.backends import ort as ort_backend
from deployfuse.rewrite import TARGETS
from deployfuse.targets import get_target

OPSET = 20
DTYPES = {"fp32": "float", "fp16": "float16", "bf16": "bfloat16"}
MADE_FROM = {"com.microsoft::GroupQueryAttention": "com.microsoft::MultiHeadAttention"}
MODEL_EXCEPTIONS = {
    ("whisper_encoder", "fp16", "com.microsoft::SkipLayerNormalization"):
        "in fp16 the model clamps the hidden states (Clip) between the residual add and the next LayerNorm",
}


def _emits(target: str, kind: str, dtype: str) -> bool:
    domain, _, op = kind.rpartition("::")
    return get_target(target).emits(domain, op, OPSET, dtype)


def excused(model: str, form: Form, target: str, kind: str) -> str | None:
    """Why `kind` may be missing from `form`, or None."""
    dtype = DTYPES[form.precision]
    if not _emits(target, kind, dtype):
        return f"{target} has no {kind} kernel on {dtype}"
    if kind in MADE_FROM and not _emits(target, MADE_FROM[kind], dtype):
        return f"{kind} is made from {MADE_FROM[kind]}, which {target} cannot run on {dtype}"
    return MODEL_EXCEPTIONS.get((model, form.precision, kind))


def lost_fusions(model: str, form: Form, target: str) -> dict[str, tuple[int, int]]:
    """Kinds `form` has fewer of than the reference form, unexcused: kind -> (reference, form)."""
    want, have = covered(fused_ops(model, BASE, target)), covered(fused_ops(model, form, target))
    return {k: (n, have.get(k, 0)) for k, n in want.items() if have.get(k, 0) < n and not excused(model, form, target, k)}


def check_form(model: str, form: Form) -> None:
    for target in TARGETS:
        assert not fused(model, form, target)[1], (target, fused(model, form, target)[1])
        assert not lost_fusions(model, form, target), (target, lost_fusions(model, form, target), fused_ops(model, form, target))
        assert not verify(model, form, target), (target, verify(model, form, target))


def _cases(forms: tuple[Form, ...]) -> list:
    return [pytest.param(m, f, id=f"{m}-{f.name}") for m in ZOO for f in forms if supported(m, f)]


@pytest.mark.parametrize(("model", "form"), _cases(FP32_FORMS))
def test_fp32_form(model: str, form: Form) -> None:
    check_form(model, form)


def _ort_cpu_refuses(model: str, form: Form) -> str | None:
    """ONNX Runtime CPU's refusal of the unfused export (no kernel for its dtype), or None when it runs."""
    try:
        ort_backend.session(exported(model, form).model, optimize=False)
    except Exception as exc:  # ORT raises its own exception types
        return str(exc)
    return None


@pytest.mark.slow
@pytest.mark.parametrize(("model", "form"), _cases(SLOW_FORMS))
def test_slow_form(model: str, form: Form) -> None:
    if form.precision == "bf16":
        refusal = _ort_cpu_refuses(model, form)
        if refusal is not None:  # the model does not allow bf16 here: nothing can verify it, not even unfused
            assert "NOT_IMPLEMENTED" in refusal or "tensor(bfloat16)" in refusal, refusal
            return
    check_form(model, form)


def test_reference_form_fuses_each_model() -> None:
    """The reference form is not empty: the comparison above means something. (ResNet on GPU
    targets is the exception, and the upsampler's: TensorRT and ORT's CUDA EP fuse Conv + ReLU themselves.)"""
    for model in ZOO:
        for target in TARGETS:
            assert fused_ops(model, BASE, target) or (model in ("resnet18", "upsampler") and target != "ort-cpu"), (model, target)


def test_unsupported_forms_are_few() -> None:
    assert set(UNSUPPORTED) == {("gpt2", "torchscript"), ("llama", "torchscript")}
