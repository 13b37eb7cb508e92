"""FP8 on the H200 (issue 19): deployfuse's fp8 ort-cuda artefact against torchao float8 and the best fp16.

A row is (model, batch): BERT-base and GPT-2 at sequence 128, ViT-B/16 at 224, batches 8 and 64.
Variants, each the alternative at its best settings:

- `eager`, `compile`, `compile-reduce-overhead`: PyTorch fp16 (the best fp16 PyTorch).
- `torchao-fp8-{perrow,pertensor}[-reduce-overhead]`: torchao's float8 dynamic activation +
  float8 weight (`quantize_(model, Float8DynamicActivationFloat8WeightConfig(granularity))` on
  the bf16 model, torchao's documented path; GPT-2's Conv1D projections made `nn.Linear` first, as
  `quantize_` swaps only those), then torch.compile (default / reduce-overhead):
  the alternative to beat.
- `{ort-plain,ort-opt,onnxscript,deployfuse}-fp16+cudagraph`: ONNX Runtime's CUDA EP on the fp16
  ONNX files bench/gpu_models.py times (bench/anchors.py makes them), IO binding, CUDA graph;
  deployfuse's nodes (GemmAct) on its custom-op library, as a user runs them (`--ort-library`).
- `deployfuse-fusedmha-fp16+cudagraph`: deployfuse's fp16 artefact with packed_qkv skipped (FP16_FORMS): its
  self-attentions run as the fp8 artefact's do, one packed QKV GEMM and deployfuse.FusedMHA reading it in place.
- `deployfuse-fp8[+cudagraph]`: `deployfuse export --target ort-cuda --precision fp8`: an fp16
  graph whose GEMMs are deployfuse.Fp8GemmAct nodes (cuBLASLt fp8 GEMMs, quantizing their own
  activations; each MLP's two one Fp8Mlp, its hidden activation kept in float8; scales calibrated
  on random inputs, accuracy-gated against fp32), run on
  deployfuse's custom-op library (`--ort-library`, default: the built one). The row records
  `export_s` (the export's own seconds, gate included), `fp8_gemms` (fp8 GEMMs: Fp8GemmAct + 2 x Fp8Mlp),
  `kept_fp16` (GEMMs the gate kept in fp16) and `qdq_left` (Q/DQ nodes the fp8_gemm rule found no
  Fp8GemmAct form for: 0 in every row of bench/results/h200_quant.json).
  Its accuracy budget is `--fp8-budget` (FP8_BUDGET below: deployfuse's default fails random-weight BERT-base).
  By default one artefact per model serves both batches: exported with a dynamic batch axis at
  batch 8 (`--fp8-export-batch`), where its calibration and accuracy gate run on the host CPU
  (at batch 64 they take many minutes); `--fp8-export-batch 0` exports each row at its own batch.
- `deployfuse-fp8-tuned+cudagraph`: the same artefact with its Fp8GemmAct and Fp8Mlp nodes' cuBLASLt algorithms
  tuned at the row's shapes on this GPU (a copy, through `deployfuse.quantize.speed_precision.choose_precision` then
  `deployfuse.rewrite.gemm_tuning.tune`, what `--autotune` runs after the gate: no second export or gate; the CUDA
  library beside `--ort-library`),
  timed as `deployfuse-fp8+cudagraph`; its settings say how many nodes left the heuristic's choice
  (`--dry-run`: `deployfuse-fp8-tuned`, not tuned on the CPU, and its settings say so). Kernels timed at
  the row's shapes are a setting the torch rows get only from torch.compile's `max-autotune` mode, which
  the default `--compile-modes` (and bench/gpu_quant.sh) leave out: compare it with `deployfuse-fp8+cudagraph`
  unless `--compile-modes` adds `max-autotune`.
- `deployfuse-fp8-<ablation>+cudagraph`: the fp8 artefact with one of its own changes undone (`ABLATIONS`), timed in the
  same run: what that change gives.

Each variant records `median_ms` (host wall clock per call after a device synchronise,
bench/gpu_models.py's `median_ms`), `max_abs_err` of the first output against PyTorch fp32
eager (TF32 off) on the same inputs, and with --gpu-time the CUPTI kernel-time sum `gpu_ms`, the
kernels per call, the time by kernel class (`by_class_ms`, bench/kernel_profile.py: GEMMs, fp8
quantize passes, attention, norms, copies, the rest), every kernel's time and launches (`top`), and the idle time
between kernels inside a call (`gap_ms`, each kernel's share in `top` as `gap_before_ms`).
Once every variant of a model and batch is timed, all of them are timed again together, in interleaved rounds
(`--interleave-rounds`, bench/gpu_models.py's `interleaved_medians`): `interleaved_ms`, the times to take ratios from, as
the machine drifts by several % over a run. A failing variant records `error`. Rows merge into WORKDIR/h200_quant.json after every variant
(a re-run skips the variants it has) and are copied to --out.

    pip install torchao                          # the fp8 alternative (not a deployfuse dependency)
    deployfuse plugins build --cuda on           # the Fp8GemmAct CUDA kernel (or pass --ort-library)
    python bench/gpu_quant.py --out bench/results
    python bench/gpu_quant.py --dry-run          # tiny models on the CPU, fp32 instead of fp16: tests the script
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_models import deployfuse_library, first_output, interleaved_medians, key, median_ms, ort_cuda, set_tf32, short_error  # noqa: E402

from deployfuse.backends.ort import native_library  # noqa: E402

if TYPE_CHECKING:
    import torch

MODELS = ("bert", "gpt2", "vit")
BATCHES = (8, 64)
ORT_FP16_FILES = ("ort-plain", "ort-opt", "onnxscript", "deployfuse")
# Random-weight BERT-base (trained-like biases) in fp8 with per-tensor scales is at cosine 0.9974 and
# relative error 7.5e-2 against fp32 with every GEMM quantized (batch 1, this repo's 2-core CPU):
# over deployfuse's default budget (cos=0.999,rel=2e-2) even with 18 of 72 GEMMs back in fp16, where
# the gate gives up after 254 s (bench/results/h200_quant.md). torchao's float8 rows are as far off (max |error| 0.33-0.46 on the H200,
# 20-40x fp16's: bench/results/h200_quant_torchao.json, h200_quant_partial.json).
FP8_BUDGET = "cos=0.995,rel=0.1"
TORCHAO_GRANULARITIES = ("perrow", "pertensor")
SKIPPABLE = ("torch", "torchao", "fp16-onnx", "fp8", "ablations")
"""--skip's groups: PyTorch eager and torch.compile, torchao float8, the fp16 ONNX files on ORT, deployfuse fp8, and the fp8
artefact's ABLATIONS alone."""
RESULTS = "h200_quant.json"


def build_tiny(name: str, batch: int, seq: int = 16) -> tuple:
    """A two-layer model of the same architecture, for --dry-run."""
    import torch
    import transformers

    torch.manual_seed(0)
    if name == "bert":
        cfg = transformers.BertConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
        ids = torch.randint(0, cfg.vocab_size, (batch, seq))
        return transformers.BertModel(cfg, add_pooling_layer=False).eval(), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if name == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=512, n_embd=64, n_layer=2, n_head=4, n_positions=64, use_cache=False)
        return transformers.GPT2Model(cfg).eval(), {"input_ids": torch.randint(0, cfg.vocab_size, (batch, seq))}
    cfg = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    return transformers.ViTModel(cfg, add_pooling_layer=False).eval(), {"pixel_values": torch.randn(batch, 3, 32, 32)}


class Results:
    """Rows merged by (model, dtype, batch, variant) into WORKDIR/h200_quant.json, copied to `out` on every write."""

    def __init__(self, workdir: Path, out: Path | None):
        self.path, self.out = workdir / RESULTS, out
        self.rows = {self._key(r): r for r in (json.loads(self.path.read_text()) if self.path.exists() else [])}

    @staticmethod
    def _key(row: dict) -> tuple:
        return (row["model"], row["dtype"], row["batch"], row["variant"])

    def has(self, row: dict) -> bool:
        return self._key(row) in self.rows

    def add(self, row: dict) -> None:
        self.rows[self._key(row)] = row
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(list(self.rows.values()), indent=1))
        if self.out:
            self.out.mkdir(parents=True, exist_ok=True)
            shutil.copy(self.path, self.out / self.path.name)


class Device:
    """Where the row runs: the GPU (fp16 baselines, CUDA-graph ORT sessions, CUPTI times), or
    for --dry-run the CPU (fp32 baselines, plain ORT CPU sessions, wall-clock times only)."""

    def __init__(self, dry_run: bool, args: argparse.Namespace):
        self.cuda = not dry_run
        self.args = args
        self.low = "fp16" if self.cuda else "fp32"  # CPU kernels for fp16 are missing in ORT and slow in PyTorch

    def place(self, module, inputs, dtype: str):
        """`module` and `inputs` on the device, floats in `dtype` (integer inputs as they are)."""
        import torch

        where, torch_dtype = "cuda" if self.cuda else "cpu", {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
        return module.to(where, torch_dtype), {k: (v.to(torch_dtype) if v.is_floating_point() else v).to(where) for k, v in inputs.items()}

    def time(self, fn: Callable[[], object]) -> float:
        if self.cuda:
            return median_ms(fn, self.args.warmup, self.args.runs)
        times = []
        for _ in range(self.args.runs):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)

    def ort(self, path: str, inputs: dict, cuda_graph: bool, library: str | None = None) -> Callable[[], object]:
        """`path` on ONNX Runtime, deployfuse nodes on `library`'s kernels (None: function bodies)."""
        if self.cuda:
            return ort_cuda(path, inputs, {"enable_cuda_graph": "1"} if cuda_graph else {}, library)
        import torch

        from deployfuse.backends.ort import run, session

        sess = session(path, custom_ops_library=library)
        feeds = {k: v.numpy() for k, v in inputs.items()}
        return lambda: torch.from_numpy(next(iter(run(sess, feeds).values())))


def conv1d_as_linear(module: torch.nn.Module) -> torch.nn.Module:
    """`module` with each transformers `Conv1D` (GPT-2's projections: y = x W + b, W [in, out]) replaced
    by the `nn.Linear` of the same math (weight W^T), in place: torchao's `quantize_` only swaps
    `nn.Linear`, so without this GPT-2 stays unquantized, which is what a torchao user fixes first."""
    import torch
    from transformers.pytorch_utils import Conv1D

    for name, child in list(module.named_modules()):
        if isinstance(child, Conv1D):
            n_in, n_out = child.weight.shape
            linear = torch.nn.Linear(n_in, n_out, device=child.weight.device, dtype=child.weight.dtype)
            with torch.no_grad():
                linear.weight.copy_(child.weight.T)
                linear.bias.copy_(child.bias)
            parent, _, attr = name.rpartition(".")
            setattr(module.get_submodule(parent) if parent else module, attr, linear)
    return module


def torchao_fp8(module, granularity: str):
    """`module` (bf16, on the GPU) with torchao's float8 dynamic activation + float8 weight linears
    (Conv1D projections first made Linear layers, so that GPT-2 is quantized too)."""
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, PerTensor, quantize_

    quantize_(conv1d_as_linear(module), Float8DynamicActivationFloat8WeightConfig(granularity=PerRow() if granularity == "perrow" else PerTensor()))
    return module


def fp8_artefact(build: Callable, model_name: str, batch: int, folder: Path, dynamic: bool, budget: str) -> tuple[Path, str, dict[str, object]]:
    """deployfuse's fp8 ort-cuda export of the fp32 model made at `batch` (calibrated and gated
    there; once per folder), what it holds (one line), and the row's fields about it: export
    seconds, Fp8GemmAct nodes, GEMMs kept in fp16, Q/DQ left. `dynamic`: the batch axis is, and
    one artefact serves every row of the model (--fp8-export-batch)."""
    import onnx

    import deployfuse
    from deployfuse.inputs import DynamicAxis

    path, report_path = folder / f"{model_name}_b{batch}_fp8.onnx", folder / f"{model_name}_b{batch}_fp8.report.json"
    if not path.exists():
        module, inputs = build(model_name, batch)
        axes = [DynamicAxis(name, 0, "batch") for name in inputs] if dynamic else []
        deployfuse.export(module, path, example_inputs=inputs, dynamic=axes, target="ort-cuda", precision="fp8", accuracy_budget=budget, report_path=report_path)
    ops = [n.op_type for n in onnx.load(path, load_external_data=False).graph.node]
    report = json.loads(report_path.read_text())
    gate = (report.get("quantization") or {}).get("gate") or {}
    fields: dict[str, object] = {"export_s": round(sum(s["seconds"] for s in report["steps"]), 1), "fp8_gemms": ops.count("Fp8GemmAct") + 2 * ops.count("Fp8Mlp"),
                                 "kept_fp16": len(gate.get("fp16_layers", [])), "qdq_left": ops.count("QuantizeLinear") + ops.count("DequantizeLinear")}
    steps = {s["name"]: s.get("detail", "") for s in report["steps"]}
    holds = (f"{fields['fp8_gemms']} fp8 GEMMs (Fp8GemmAct x{ops.count('Fp8GemmAct')}, Fp8Mlp x{ops.count('Fp8Mlp')}), GemmAct x{ops.count('GemmAct')}, "
             f"{fields['kept_fp16']} of {gate.get('quantized_layers')} GEMMs kept in fp16, "
             f"Q/DQ left x{fields['qdq_left']}; export {fields['export_s']} s; {steps.get('quantize', '')}")
    return path, holds, fields


def bench_row(model_name: str, batch: int, device: Device, workdir: Path, results: Results) -> None:
    import torch
    from anchors import build as build_full

    build = build_tiny if not device.cuda else build_full
    folder = workdir / key(model_name, "fp8", batch)
    folder.mkdir(parents=True, exist_ok=True)
    args = device.args
    timed: dict[str, tuple[dict, Callable[[], object]]] = {}  # variant -> its row and callable, for the interleaved rounds

    def record(variant: str, dtype: str, settings: str, make: Callable[[], Callable[[], object]], fields: dict[str, object] | None = None) -> None:
        row: dict[str, object] = {"model": model_name, "dtype": dtype, "batch": batch, "variant": variant, "settings": settings, **(fields or {})}
        if results.has(row) and device.cuda:
            print(f"{model_name} batch {batch} {variant}: already measured", flush=True)
            return
        start = time.time()
        try:
            fn = make()
            with torch.inference_mode():
                row["max_abs_err"] = float((first_output(fn()).float().cpu() - reference).abs().max())
                row["median_ms"] = round(device.time(fn), 4)
                if args.interleave_rounds:
                    timed[variant] = (row, fn)
                if device.cuda and args.gpu_time:
                    import kernel_profile

                    profiled = kernel_profile.profile(fn, iters=args.profile_iters)
                    row.update({k: profiled[k] for k in ("gpu_ms", "gap_ms", "kernels_per_call", "by_class_ms", "top")})
        except Exception as exc:  # a failing variant gets its error, not a time
            row["error"] = short_error(exc)
        row["setup_s"] = round(time.time() - start, 1)
        print(json.dumps(row), flush=True)
        results.add(row)

    if device.cuda:
        set_tf32(False)
    fp32, inputs32 = device.place(*build(model_name, batch), "fp32")
    with torch.inference_mode():
        reference = first_output(fp32(**inputs32)).float().cpu()
    del fp32
    low, inputs = device.place(*build(model_name, batch), device.low)
    if "torch" not in args.skip:
        record("eager", device.low, "PyTorch eager", lambda m=low: lambda: m(**inputs))
    for mode in args.compile_modes if "torch" not in args.skip else ():
        torch._dynamo.reset()
        compiled = torch.compile(low, mode=mode)
        record("compile" + ("" if mode == "default" else f"-{mode}"), device.low, f"torch.compile mode={mode}", lambda c=compiled: lambda: c(**inputs))
        del compiled
    for granularity in args.torchao_granularities if "torchao" not in args.skip else ():
        for mode in args.compile_modes or [None]:  # None (--dry-run): torchao without torch.compile
            def make(granularity=granularity, mode=mode):
                torch._dynamo.reset()
                module, bf16_inputs = device.place(*build(model_name, batch), "bf16")
                quantized = torchao_fp8(module, granularity)
                compiled = quantized if mode is None else torch.compile(quantized, mode=mode)
                return lambda: compiled(**bf16_inputs)

            record(f"torchao-fp8-{granularity}" + ("" if mode in ("default", None) else f"-{mode}"), "fp8",
                   f"torchao Float8DynamicActivationFloat8WeightConfig({granularity}) on bf16, " + (f"torch.compile mode={mode}" if mode else "eager"), make)
    torch._dynamo.reset()
    gc.collect()
    library = args.ort_library or native_library()
    if "fp16-onnx" not in args.skip:
        _ort_fp16_rows(model_name, low, inputs, folder, device, library, record)
    del low
    gc.collect()
    if "fp8" not in args.skip:
        _fp8_rows(model_name, batch, build, inputs32, workdir, folder, device, library, record)
    if len(timed) > 1:
        calls = max(5, args.runs // args.interleave_rounds)  # a round's first calls after a switch are the noisy ones
        with torch.inference_mode():
            medians = interleaved_medians({v: fn for v, (_, fn) in timed.items()}, args.interleave_rounds, calls, args.warmup,
                                          None if device.cuda else lambda: None)
        for variant, (row, _) in timed.items():
            row["interleaved_ms"] = round(medians[variant], 4)
            results.add(row)
        print(f"{model_name} batch {batch}: interleaved ({args.interleave_rounds} rounds of {calls} calls), ms and x alone: "
              + ", ".join(f"{v} {medians[v]:.4f} ({medians[v] / row['median_ms']:.2f})" for v, (row, _) in timed.items()), flush=True)
    timed.clear()
    if device.cuda:
        torch.cuda.empty_cache()


def _ort_fp16_rows(model_name: str, low, inputs: dict, folder: Path, device: Device, library, record: Callable) -> None:
    """The fp16 ONNX files of bench/anchors.py on ONNX Runtime's CUDA EP (ORT_FP16_FILES)."""
    import torch
    from anchors import variants

    with torch.inference_mode():
        files = variants(model_name, low, inputs, folder, "ort-cuda", device.low)
        files.update(_fp16_forms(model_name, low, inputs, folder, device.low))
    graph = "+cudagraph" if device.cuda else ""
    for name in (*ORT_FP16_FILES, *FP16_FORMS):
        made = files.get(name, "not made")

        def make_ort(made=made, name=name):
            if not Path(made).is_file():
                raise RuntimeError(made)
            own = deployfuse_library(made, library, device.cuda) if name.startswith("deployfuse") else None
            return device.ort(str(made), inputs, cuda_graph=device.cuda, library=own)

        record(f"{name}-{device.low}{graph}", device.low, "ONNX Runtime CUDA EP, IO binding" + (", CUDA graph" if device.cuda else " (CPU EP: dry run)"), make_ort)


FP16_FORMS = {"deployfuse-fusedmha": ("packed_qkv",)}
"""deployfuse's fp16 artefact with fusion families skipped, timed beside it: without packed_qkv (com.microsoft.Attention, ORT's
own QKV GEMM and attention), the self-attentions become one packed GEMM and deployfuse.FusedMHA reading it in place
(split_qkv + packed_mha), as the fp8 artefact runs them."""


def _fp16_forms(model_name: str, low, inputs: dict, folder: Path, precision: str) -> dict[str, Path | str]:
    """FP16_FORMS' files (or why one failed), exported like bench/anchors.py's deployfuse file."""
    import deployfuse

    out: dict[str, Path | str] = {}
    for name, skipped in FP16_FORMS.items():
        path = folder / f"{model_name}_{precision}_{name}.onnx"
        try:
            deployfuse.export(low, path, example_inputs=inputs, target="ort-cuda", precision=precision, verify=False, skip_fusions=skipped)
            out[name] = path
        except Exception as exc:
            out[name] = f"export failed: {short_error(exc)}"
    return out


def _fp8_rows(model_name: str, batch: int, build: Callable, inputs32: dict, workdir: Path, folder: Path, device: Device, library, record: Callable) -> None:
    """deployfuse's fp8 ort-cuda artefact, plain and in ONNX Runtime's CUDA graph."""
    args = device.args
    fields: dict[str, object] = {}
    try:
        if args.fp8_export_batch:  # one dynamic-batch artefact per model, calibrated and gated at that batch
            made = workdir / key(model_name, "fp8", 0)
            made.mkdir(parents=True, exist_ok=True)
            artefact, holds, fields = fp8_artefact(build, model_name, args.fp8_export_batch, made, True, args.fp8_budget)
            holds = f"dynamic batch, exported at batch {args.fp8_export_batch}: {holds}"
        else:
            artefact, holds, fields = fp8_artefact(build, model_name, batch, folder, False, args.fp8_budget)
    except Exception as exc:
        artefact, holds = None, f"export failed: {short_error(exc)}"
    half = {k: v.half() if v.is_floating_point() else v for k, v in inputs32.items()}  # the artefact is an fp16 graph
    runs_on = f"ONNX Runtime {'CUDA' if device.cuda else 'CPU'} EP, Fp8GemmAct on {Path(library).name if library else 'its function body (no custom-op library)'}"
    for cuda_graph in (False, True) if device.cuda else (False,):
        def make_fp8(cuda_graph=cuda_graph):
            if artefact is None:
                raise RuntimeError(holds)
            if device.cuda and library is None:  # the function bodies would time Q/DQ + fp32 MatMuls, not fp8 GEMMs
                raise RuntimeError("no libdeployfuse_ort.so with the Fp8GemmAct CUDA kernel: deployfuse plugins build --cuda on, or --ort-library PATH")
            return device.ort(str(artefact), half, cuda_graph=cuda_graph, library=library and str(library))

        record("deployfuse-fp8" + ("+cudagraph" if cuda_graph else ""), "fp8",
               f"deployfuse export --target ort-cuda --precision fp8: {holds}; {runs_on}" + (", CUDA graph" if cuda_graph else ""), make_fp8, fields)
    try:
        tuned, tuning = tuned_copy(artefact, half, library, folder) if artefact is not None else (None, holds)
    except Exception as exc:
        tuned, tuning = None, f"tuning failed: {short_error(exc)}"

    def make_tuned():
        if tuned is None:
            raise RuntimeError(tuning)
        if device.cuda and library is None:
            raise RuntimeError("no libdeployfuse_ort.so with the Fp8GemmAct CUDA kernel: deployfuse plugins build --cuda on, or --ort-library PATH")
        return device.ort(str(tuned), half, cuda_graph=device.cuda, library=library and str(library))

    record("deployfuse-fp8-tuned" + ("+cudagraph" if device.cuda else ""), "fp8",
           f"deployfuse export --target ort-cuda --precision fp8, {tuning}: {holds}; {runs_on}" + (", CUDA graph" if device.cuda else ""), make_tuned, fields)
    for ablation, (undo, what) in ABLATIONS.items() if "ablations" not in args.skip else ():  # one change undone: what it gives
        if ablation not in args.ablations:
            continue
        def make_ablated(undo=undo, ablation=ablation):
            if artefact is None:
                raise RuntimeError(holds)
            path = folder / f"{artefact.stem}_{ablation}.onnx"
            if not path.exists():
                import onnx

                from deployfuse.pipeline import save_model

                save_model(undo(onnx.load(artefact)), path)
            return device.ort(str(path), half, cuda_graph=device.cuda, library=library and str(library))

        record(f"deployfuse-fp8-{ablation}" + ("+cudagraph" if device.cuda else ""), "fp8",
               f"the deployfuse-fp8 artefact, {what}; {runs_on}" + (", CUDA graph" if device.cuda else ""), make_ablated, fields)


def split_mha(model):
    """FusedMHA(P, P, P, A, packed_qkv=1) back to Split(P) -> com.microsoft.MultiHeadAttention(q, k, v, attention_bias=A), as
    the fp8 artefact was before the packed_mha family (same attention bias, num_heads and scale, causal as unidirectional; a FusedMHA writing YQ first
    writes Y for its GEMMs again, as MultiHeadAttention has no float8 output)."""
    from onnx import helper

    model = _attention_out_unfused(model)
    nodes, wide = [], {}  # wide: each Mask back at [B, 1, S, S] (mask_broadcast undone: MultiHeadAttention's bias needs the query axis), once
    for node in model.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type != "FusedMHA" or not attrs.get("packed_qkv"):
            nodes.append(node)
            continue
        parts = [f"{node.name}_{p}" for p in "qkv"]
        nodes.append(helper.make_node("Split", [node.input[0]], parts, name=f"{node.name}_split", axis=-1, num_outputs=3))
        mask = node.input[3] if len(node.input) > 3 else ""
        if mask and mask not in wide:
            wide[mask] = f"{mask}_over_queries"
            shape = [f"{wide[mask]}_{p}" for p in ("bh", "s", "l", "shape")]
            nodes += [helper.make_node("Shape", [mask], [shape[0]], end=2), helper.make_node("Shape", [node.input[0]], [shape[1]], start=1, end=2),
                      helper.make_node("Shape", [mask], [shape[2]], start=-1), helper.make_node("Concat", shape[:3], [shape[3]], axis=0),
                      helper.make_node("Expand", [mask, shape[3]], [wide[mask]])]
        mask = wide.get(mask, "")
        nodes.append(helper.make_node("MultiHeadAttention", [*parts, "", "", mask] if mask else parts, list(node.output), name=node.name, domain="com.microsoft",
                                      num_heads=attrs["num_heads"], scale=float(attrs.get("scale", 0.0)), unidirectional=int(attrs.get("causal", 0))))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model


def _norm_unfused(model):
    from deployfuse.rewrite.rules.fp8_norm import without_fp8_x

    return without_fp8_x(model)


def _attention_out_unfused(model):
    from deployfuse.rewrite.rules.fp8_attention_out import without_fp8_x

    return without_fp8_x(model)


def zero_biases(model):
    """Each empty bias of an Fp8GemmAct (Bias) or Fp8Mlp (B1, B2) back to N zeros, as the fp8 artefacts were before an empty
    bias meant none: cuBLASLt then runs its bias epilogue on zeros."""
    import numpy as np
    from onnx import helper, numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    biases = {"Fp8GemmAct": ((4, 2),), "Fp8Mlp": ((4, 2), (8, 6))}  # (bias input, the weight input whose rows are N)
    for node in model.graph.node:
        for bias, weight in biases.get(node.op_type, ()) if node.domain == "deployfuse" else ():
            empty = inits.get(node.input[bias])
            if empty is not None and not any(empty.dims[:1]) and node.input[weight] in inits:
                zeros = np.zeros(inits[node.input[weight]].dims[0], helper.tensor_dtype_to_np_dtype(empty.data_type))
                name = f"{node.input[bias]}_{node.name}_zeros"
                model.graph.initializer.append(numpy_helper.from_array(zeros, name))
                node.input[bias] = name
    return model


def scales_not_pow2(model):
    """Every float8 activation scale (Fp8GemmAct's and Fp8Mlp's XScale, Fp8Mlp's HScale, SkipLayerNormFp8's and FusedMHA's YScale)
    times 1 + 2^-10: no longer a power of two, so the YQ writers divide instead of multiplying (common/e4m3_divisor.cuh) and cuBLASLt
    gets inexact reciprocals, on the same artefact otherwise."""
    from onnx import numpy_helper

    scale_inputs = {"Fp8GemmAct": (1,), "Fp8Mlp": (1, 5), "SkipLayerNormFp8": (4,), "FusedMHA": (4,)}
    names = {n.input[i] for n in model.graph.node if n.domain == "deployfuse" for i in scale_inputs.get(n.op_type, ()) if i < len(n.input)}
    for t in model.graph.initializer:
        if t.name in names:
            value = numpy_helper.to_array(t)
            t.CopyFrom(numpy_helper.from_array((value * (1 + 2.0**-10)).astype(value.dtype), t.name))
    return model


ABLATIONS = {"split-mha": (split_mha, "packed_mha undone: Split + com.microsoft.MultiHeadAttention"),
             "norm-unfused": (_norm_unfused, "fp8_norm undone: the GEMMs quantize each SkipLayerNormFp8's Y themselves"),
             "attn-out-unfused": (_attention_out_unfused, "fp8_attention_out undone: the output projections quantize FusedMHA's Y themselves"),
             "zero-bias": (zero_biases, "each empty bias back to zeros: the GEMMs whose bias a norm took run cuBLASLt's bias epilogue"),
             "scales-not-pow2": (scales_not_pow2, "activation scales off powers of two: the float8 copies divide instead of multiplying")}
"""--fp8 rows of the artefact with one change of its own undone: what packed_mha, fp8_norm, fp8_attention_out, the empty
biases and the power-of-two activation scales each give, timed in the same run (--ablations picks them)."""


def tuned_copy(artefact: Path, inputs: dict, library: str | None, folder: Path) -> tuple[Path, str]:
    """A copy of the fp8 `artefact` in `folder` with its Fp8GemmAct and Fp8Mlp nodes' algorithms tuned at `inputs`' shapes on this GPU
    (`gemm_tuning.tune`, as `--autotune` does, after `speed_precision.choose_precision` turned the Fp8GemmAct nodes slower than
    their fp16 GemmAct into it; libdeployfuse_ops_cuda.so beside `library`, else the built one), and what
    the settings say: how many nodes left the heuristic's choice, or why nothing was tuned (a copy of the artefact as it is)."""
    import onnx

    from deployfuse.ops.native import BUILD
    from deployfuse.pipeline import save_model
    from deployfuse.quantize.speed_precision import choose_precision
    from deployfuse.rewrite.gemm_tuning import not_tunable, tune

    model = onnx.load(artefact)
    ops_library = Path(library).with_name("libdeployfuse_ops_cuda.so") if library else BUILD / "cuda" / "libdeployfuse_ops_cuda.so"
    why = not_tunable(ops_library)
    feed = {k: v.cpu().numpy() for k, v in inputs.items()}
    line = ""
    if why is None:  # fp8 where it is faster (Fp8GemmAct nodes slower than their fp16 GemmAct become it), then the algorithms, as --autotune
        model, speed = choose_precision(model, feed, ops_library)
        line = "; ".join(x for x in (speed.line, tune(model, feed, ops_library)) if x)
    nodes = [n for n in model.graph.node if n.op_type in ("Fp8GemmAct", "Fp8Mlp")]
    moved = sum(any(a.name in ("algo", "algo1", "algo2") and a.i >= 0 for a in n.attribute) for n in nodes)
    path = folder / f"{artefact.stem}_tuned_b{next(iter(inputs.values())).shape[0]}.onnx"
    save_model(model, path)
    return path, f"NOT tuned ({why})" if why else f"tuned: {moved} of {len(nodes)} Fp8GemmAct / Fp8Mlp nodes off the heuristic's choice ({line})"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    parser.add_argument("--compile-modes", default="default,reduce-overhead", help="torch.compile modes for PyTorch fp16 and torchao")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--interleave-rounds", type=int, default=10,
                        help="time every variant of a model and batch again together, in this many interleaved rounds of RUNS/N calls, at least 5 (0: not)")
    parser.add_argument("--torchao-granularities", default=",".join(TORCHAO_GRANULARITIES),
                        help="torchao float8 scale granularities to time (each a torch.compile of about a minute)")
    parser.add_argument("--gpu-time", action="store_true", help="also record the CUPTI kernel-time sum, kernel count and time by class (bench/kernel_profile.py)")
    parser.add_argument("--profile-iters", type=int, default=10)
    parser.add_argument("--workdir", default="/tmp/deployfuse_bench_quant", help="ONNX files and the merged results")
    parser.add_argument("--out", default=None, help=f"folder to copy {RESULTS} to after every variant")
    parser.add_argument("--fp8-export-batch", type=int, default=8,
                        help="export the fp8 artefact once per model at this batch, with a dynamic batch axis (calibration and gate at that batch: "
                        "BERT-base's gate at batch 64 runs many minutes on the host CPU); 0: a static export per row, at its batch")
    parser.add_argument("--skip", default="", help=f"comma-separated groups of variants not to run: {', '.join(SKIPPABLE)}")
    parser.add_argument("--ablations", default=",".join(ABLATIONS), help=f"the fp8 artefact's ablations to time: {', '.join(ABLATIONS)} (--skip ablations: none)")
    parser.add_argument("--fp8-budget", default=FP8_BUDGET, help=f"the fp8 export's --accuracy-budget (default {FP8_BUDGET}; see above)")
    parser.add_argument("--ort-library", default=None, help="libdeployfuse_ort.so for the deployfuse artefacts' nodes (fp16 GemmAct, fp8 Fp8GemmAct; default: the built one)")
    parser.add_argument("--dry-run", action="store_true", help="tiny models on the CPU in fp32, 3 runs, no torch.compile: checks the script, times nothing real")
    args = parser.parse_args(argv)
    models, batches = args.models.split(","), [int(b) for b in args.batches.split(",")]
    bad = [m for m in models if m not in MODELS]
    if bad:
        parser.exit(2, f"gpu_quant.py: unknown model {', '.join(bad)} (models: {', '.join(MODELS)})\n")
    args.compile_modes = [] if args.dry_run else [m for m in args.compile_modes.split(",") if m]
    args.skip = {g for g in args.skip.split(",") if g}
    args.ablations = [a for a in args.ablations.split(",") if a]
    if set(args.ablations) - set(ABLATIONS):
        parser.exit(2, f"gpu_quant.py: --ablations takes {', '.join(ABLATIONS)}\n")
    args.torchao_granularities = [g for g in args.torchao_granularities.split(",") if g]
    if set(args.torchao_granularities) - set(TORCHAO_GRANULARITIES):
        parser.exit(2, f"gpu_quant.py: --torchao-granularities takes {', '.join(TORCHAO_GRANULARITIES)}\n")
    if args.skip - set(SKIPPABLE):
        parser.exit(2, f"gpu_quant.py: --skip takes {', '.join(SKIPPABLE)}, not {', '.join(sorted(args.skip - set(SKIPPABLE)))}\n")
    if args.interleave_rounds < 0:
        parser.exit(2, "gpu_quant.py: --interleave-rounds takes 0 (not) or more\n")
    if args.dry_run:
        args.runs, batches, args.fp8_export_batch = 3, [2], min(args.fp8_export_batch, 2)
    workdir = Path(args.workdir)
    results = Results(workdir, Path(args.out) if args.out else None)
    device = Device(args.dry_run, args)
    for model in models:
        for batch in batches:
            start = time.time()
            try:
                bench_row(model, batch, device, workdir, results)
            except Exception as exc:  # one broken row must not cost the others
                print(f"{model} batch {batch}: failed: {short_error(exc)}", flush=True)
            print(f"{model} batch {batch}: {time.time() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
