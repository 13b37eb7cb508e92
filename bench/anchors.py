"""The graphs deployfuse is measured against, made from one export of one model.

`build` makes the benchmark models (real architectures from their library configs, random
weights with a trained model's kind of biases and norm statistics, see `trained_like`); `variants` writes the ONNX files a user could pick instead of deployfuse: the plain
dynamo export, the ORT transformers optimizer's output, onnxscript's `optimize_for_ort`
output, and deployfuse's own export for a target. A variant that cannot be made maps to its
error message instead of a path.

onnxscript's file is repaired where ORT would refuse it (`flatten_attention_into_gemm`: GPT-2's
attention output projection); such a file is named `*_onnxscript_flattened.onnx`, so a result
row's file says it is the repaired form, with every fusion onnxscript made kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    import onnx_ir as ir

# name -> (ORT transformers optimizer model type, heads, hidden size)
ORT_OPT_TYPES = {"bert": ("bert", 12, 768), "vit": ("vit", 12, 768), "gpt2": ("gpt2", 12, 768), "gpt2-lm": ("gpt2", 12, 768)}


def build(name: str, batch: int, seq: int = 128) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """BERT-base, ViT-B/16 (224), GPT-2 (124M) or ResNet-50, with inputs of the given batch.

    The weights come from seed 0 and the inputs from seed 1, so a model built at one batch has
    the weights of the same model built at another: an artefact exported at batch 8 is checked
    at batch 64 against the same model (the inputs drawn first once made the weights depend on the batch)."""
    torch.manual_seed(0)
    module = trained_like(_model(name))
    torch.manual_seed(1)
    return module, _inputs(name, module, batch, seq)


@torch.no_grad()
def trained_like(module: torch.nn.Module) -> torch.nn.Module:
    """Non-zero biases, norm scales and BatchNorm statistics, as every trained model has.

    A config-built model starts with zero biases (HF Linear/Conv1D, torchvision BatchNorm shift),
    unit norm scales and BatchNorm statistics of 0 and 1. Exporters drop a zero Gemm bias, so a
    fusion that needs one (GemmAct on GPT-2's Conv1D) found nothing to fuse in the H200 run of
    2026-12-01 (bench/results/gpu_session_h200.md), while a trained GPT-2 has it. Every variant of
    a row is exported from this same module, so the comparison stays like with like.
    """
    for name, tensor in list(module.named_parameters()) + list(module.named_buffers()):
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "bias":
            tensor.normal_(0.0, 0.02)
        elif leaf == "weight" and tensor.dim() == 1:  # LayerNorm / BatchNorm scale
            tensor.normal_(1.0, 0.05)
        elif leaf == "running_mean":
            tensor.normal_(0.0, 0.1)
        elif leaf == "running_var":
            tensor.uniform_(0.5, 1.5)
    return module


def _model(name: str) -> torch.nn.Module:
    if name == "resnet50":
        import torchvision

        return torchvision.models.resnet50().eval()
    import transformers

    if name == "bert":
        return transformers.BertModel(transformers.BertConfig(), add_pooling_layer=False).eval()
    if name == "vit":
        return transformers.ViTModel(transformers.ViTConfig(), add_pooling_layer=False).eval()
    if name == "gpt2":
        return transformers.GPT2Model(transformers.GPT2Config(use_cache=False)).eval()
    if name == "gpt2-lm":  # with its LM head, tied to the token embedding (the largest GEMM: vocab 50257 x 768)
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(use_cache=False)).eval()
    raise ValueError(f"unknown model {name}")


def _inputs(name: str, module: torch.nn.Module, batch: int, seq: int) -> dict[str, torch.Tensor]:
    if name in ("resnet50", "vit"):
        return {"x" if name == "resnet50" else "pixel_values": torch.randn(batch, 3, 224, 224)}
    ids = torch.randint(0, module.config.vocab_size, (batch, seq))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)} if name == "bert" else {"input_ids": ids}


def _error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def variants(name: str, module: torch.nn.Module, inputs: dict[str, torch.Tensor], workdir: Path, target: str, precision: str) -> dict[str, Path | str]:
    """ONNX files for ort-plain, ort-opt, onnxscript and deployfuse (or why each failed).

    `module` and `inputs` are already in the benchmark's dtype and device.
    """
    out: dict[str, Path | str] = {}
    plain = workdir / f"{name}_{precision}_plain.onnx"
    try:
        torch.onnx.export(module, (), str(plain), kwargs=inputs, dynamo=True, opset_version=20, optimize=True)
        out["ort-plain"] = plain
    except Exception as exc:
        return dict.fromkeys(("ort-plain", "ort-opt", "onnxscript", "deployfuse"), f"export failed: {_error(exc)}")

    if name in ORT_OPT_TYPES:
        try:
            from onnxruntime.transformers.optimizer import optimize_model

            model_type, heads, hidden = ORT_OPT_TYPES[name]
            optimized = optimize_model(str(plain), model_type=model_type, num_heads=heads, hidden_size=hidden, opt_level=0, use_gpu=target != "ort-cpu")
            path = workdir / f"{name}_{precision}_ortopt.onnx"
            optimized.save_model_to_file(str(path))
            out["ort-opt"] = path
        except Exception as exc:
            out["ort-opt"] = _error(exc)
    else:
        out["ort-opt"] = "the ORT transformers optimizer has no model type for this architecture"

    try:
        out["onnxscript"] = onnxscript_file(plain, workdir / f"{name}_{precision}_onnxscript")
    except Exception as exc:
        out["onnxscript"] = _error(exc)

    try:
        import deployfuse

        path = workdir / f"{name}_{precision}_deployfuse.onnx"
        deployfuse.export(module, path, example_inputs=inputs, target=target, precision=precision, verify=False)
        out["deployfuse"] = path
    except Exception as exc:
        out["deployfuse"] = _error(exc)
    return out


ATTENTION_OPS = {"MultiHeadAttention", "Attention", "GroupQueryAttention"}
"""com.microsoft ops whose output is (B, S, D) whatever the value they replaced was."""


def onnxscript_file(plain: Path, stem: Path) -> Path:
    """onnxscript's `optimize_for_ort` of the `plain` export, saved as `stem`.onnx, or as
    `stem`_flattened.onnx where `flatten_attention_into_gemm` had to repair it."""
    import onnx_ir as ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    model = ir.load(str(plain))
    optimize_for_ort(model)
    repaired = flatten_attention_into_gemm(model)
    path = stem.with_name(stem.name + ("_flattened" if repaired else "") + ".onnx")
    if repaired:
        print(f"{path.name}: {repaired} Gemm(s) after a fused attention given their 2-D input back (onnxscript's MHA rule drops it)", flush=True)
    ir.save(model, str(path))
    return path


def flatten_attention_into_gemm(model: ir.Model) -> int:
    """Put back the reshape to (B*S, D) that onnxscript's MHA fusion drops before a Gemm; returns how many.

    onnxscript's MHA rule (`ort_fusions/mha.py`, run as `fuse_mha2`) replaces
    Reshape(Transpose(SDPA), shape) with com.microsoft.MultiHeadAttention, whose output is
    (B, S, D), without checking `shape` (its own TODO: "verify Reshapes"). GPT-2's Conv1D exports
    as Reshape(x, [B*S, D]) -> Gemm, and the export folds that Reshape into the attention's
    (B, S, H, Dh) -> (B, S, D) one, so after the fusion the output projection's Gemm reads a
    rank-3 tensor, which ORT refuses at session creation ("Input 0 expected to have rank 2").
    Flatten(axis=-1): (B, S, D) -> (B*S, D) is that Reshape, so the graph computes the export's
    values again; the attention output's stale (B*S, D) annotation moves to the Flatten.
    """
    import onnx_ir as ir

    repaired = 0
    for gemm in [n for n in model.graph if n.op_type == "Gemm" and n.domain == ""]:
        attention_out = gemm.inputs[0]
        producer = attention_out.producer() if attention_out is not None else None
        if attention_out is None or producer is None or producer.domain != "com.microsoft" or producer.op_type not in ATTENTION_OPS:
            continue
        flatten = ir.node("Flatten", [attention_out], {"axis": -1}, name=f"{gemm.name}_flatten_attention")
        flat = flatten.outputs[0]
        flat.name, flat.shape, flat.type = f"{attention_out.name}_2d", attention_out.shape, attention_out.type
        attention_out.shape = None
        model.graph.insert_before(gemm, flatten)
        gemm.replace_input_with(0, flat)
        repaired += 1
    return repaired
