"""Drive libdeployfuse_trt.so through TensorRT's IPluginV3 life cycle with plugins/tests/trt_driver
and compare every enqueue output with the op's PyTorch reference.

Writes each case's inputs as raw files and a manifest, runs the driver, reads its JSON lines and
the raw outputs (the first enqueue's and the re-created plugin's), and checks them against the
spec's reference computed in float64 on the same (rounded) inputs: ||out - ref|| / ||ref|| under
the dtype's tolerance, no NaN left of the poison. Without a GPU the driver runs every step but
enqueue, and only the steps are checked.

    python plugins/tests/trt_driver_check.py DRIVER LIB [--cases ci|gpu] [--dtypes float,half,bf16] [--only OPS] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from deployfuse.ops.models import example_inputs  # noqa: E402
from deployfuse.ops.schema import TF32_TOLERANCE  # noqa: E402
from deployfuse.ops.specs import SPECS  # noqa: E402
from tests.ops.cases import CASES as OP_CASES  # noqa: E402

# An op with trt_plugin=False has no plugin to drive; FusedMHA's plugin refuses packed_qkv=1 at
# createPlugin (ort-cuda only; tests/ops/test_fused_mha_packed.py checks the refusal).
CASES = [case for case in OP_CASES if SPECS[case[0]].trt_plugin and not case[2].get("packed_qkv")]
DTYPES = {"float": torch.float32, "half": torch.float16, "bf16": torch.bfloat16}
TOL = {"float": 1e-5, "half": 2e-3, "bf16": 1.6e-2}  # as bench/ops_gpu.py: relative L2 error

# Larger shapes for the GPU run: the tensor-core and Hopper FusedMHA kernels (head_dim 64/128,
# fp16/bf16), long rows and many groups.
GPU_CASES: list[tuple[str, tuple[int, ...], dict[str, Any]]] = [
    ("LayerNormGelu", (16, 4096), {}),
    ("GroupNormAct", (2, 64, 16, 17), {"num_groups": 32, "activation": "silu"}),
    ("BiasAct", (8, 3001), {"activation": "gelu_tanh"}),
    ("FusedMHA", (2, 128, 128, 512), {"num_heads": 8}),
    ("FusedMHA", (1, 70, 200, 256), {"num_heads": 2, "mask": True}),
    ("FusedMHA", (2, 64, 64, 1024), {"num_heads": 8, "causal": 1}),
]


@dataclass
class Case:
    id: str
    op: str
    dtype: str
    attrs: dict[str, Any]
    inputs: list[torch.Tensor]  # rounded to dtype, on the CPU
    out: Path
    out_shape: tuple[int, ...] = ()
    steps: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] | None = None


def _raw(t: torch.Tensor) -> bytes:
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.contiguous().numpy().tobytes()


def _from_raw(data: bytes, dtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    if dtype == "bf16":
        return torch.from_numpy(np.frombuffer(data, dtype=np.int16).copy()).view(torch.bfloat16).reshape(shape)
    np_type = np.float32 if dtype == "float" else np.float16
    return torch.from_numpy(np.frombuffer(data, dtype=np_type).copy()).reshape(shape)


def _attr_line(name: str, value: Any) -> str:
    if isinstance(value, str):
        return f"attr {name} s {value}"
    if isinstance(value, (bool, int)):
        return f"attr {name} i {int(value)}"
    return f"attr {name} f {float(value)!r}"


def make_cases(which: str, dtypes: list[str], work: Path, only: set[str] | None, seed: int = 0) -> list[Case]:
    """Inputs on disk for each (op case, dtype) and the Case records that name them."""
    rng = np.random.default_rng(seed)
    chosen = CASES + (GPU_CASES if which == "gpu" else [])
    cases = []
    for n, (op, shape, attrs) in enumerate(chosen):
        if only and op not in only:
            continue
        for dtype in dtypes:
            cid = f"{n:02d}-{op}-{'x'.join(map(str, shape))}-{dtype}"
            xs = [x for x in example_inputs(op, shape, rng=rng, **attrs) if x is not None]
            inputs = [torch.from_numpy(x).to(DTYPES[dtype]) for x in xs]
            for i, t in enumerate(inputs):
                (work / f"{cid}.in{i}").write_bytes(_raw(t))
            op_attrs = {k: v for k, v in attrs.items() if k != "mask"}  # mask=True means "give the optional input"
            out_shape = tuple(SPECS[op].reference(*(t.to("meta") for t in inputs), **op_attrs).shape)  # shapes only
            cases.append(Case(cid, op, dtype, op_attrs, inputs, work / f"{cid}.out", out_shape))
    return cases


def write_manifest(cases: list[Case], path: Path) -> None:
    lines = []
    for c in cases:
        lines.append(f"case {c.id} {c.op} {c.dtype}")
        lines += [_attr_line(k, v) for k, v in c.attrs.items()]
        for i, t in enumerate(c.inputs):
            lines.append(f"in {t.dim()} {' '.join(map(str, t.shape))} {path.parent / f'{c.id}.in{i}'}")
        if c.out_shape != tuple(c.inputs[0].shape):
            lines.append(f"outdims {len(c.out_shape)} {' '.join(map(str, c.out_shape))}")
        lines += [f"out {c.out}", "end"]
    path.write_text("\n".join(lines) + "\n")


def run_driver(driver: Path, lib: Path, manifest: Path, cases: list[Case], timeout: float = 600) -> tuple[int, dict[str, Any], str]:
    """Runs the driver; attaches its step lines to the cases. Returns (exit code, device line, stderr)."""
    proc = subprocess.run([str(driver), str(lib), str(manifest)], capture_output=True, text=True, timeout=timeout)
    by_id = {c.id: c for c in cases}
    device: dict[str, Any] = {}
    for line in proc.stdout.splitlines():
        rec = json.loads(line)
        if rec.get("step") == "device":
            device = rec
        elif rec["case"] in by_id:
            if rec.get("summary"):
                by_id[rec["case"]].summary = rec
            else:
                by_id[rec["case"]].steps.append(rec)
        elif not rec["ok"]:
            raise RuntimeError(f"driver failed loading the library: {rec}")
    return proc.returncode, device, proc.stderr


def compare(case: Case) -> list[dict[str, Any]]:
    """The enqueue outputs (plugin and re-created plugin) against the float64 reference."""
    spec = SPECS[case.op]
    args = [t.double() for t in case.inputs]
    ref = spec.reference(*args, **case.attrs)
    tol = TF32_TOLERANCE if case.dtype == "float" and spec.tf32 else TOL[case.dtype]
    results = []
    for suffix in ("", ".again"):
        path = Path(str(case.out) + suffix)
        if not path.exists():
            results.append({"output": path.name, "ok": False, "why": "no output written"})
            continue
        got = _from_raw(path.read_bytes(), case.dtype, tuple(ref.shape)).double()
        nan = int(torch.isnan(got).sum())
        err = float(torch.linalg.vector_norm(got - ref) / max(float(torch.linalg.vector_norm(ref)), 1e-30))
        ok = nan == 0 and math.isfinite(err) and err <= tol
        results.append({"output": path.name, "ok": ok, "rel_l2": err, "nan": nan, "tol": tol})
    return results


def check(driver: Path, lib: Path, which: str = "ci", dtypes: list[str] | None = None, only: set[str] | None = None, work: Path | None = None) -> dict[str, Any]:
    """Everything above, as one report: {"device", "enqueue", "cases": [{id, op, dtype, steps, failed, outputs}], "ok"}."""
    dtypes = dtypes or list(DTYPES)
    with tempfile.TemporaryDirectory() as tmp:
        folder = work or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        cases = make_cases(which, dtypes, folder, only)
        manifest = folder / "manifest.txt"
        write_manifest(cases, manifest)
        rc, device, stderr = run_driver(driver, lib, manifest, cases)
        enqueue = bool(device.get("enqueue"))
        report = {"device": device.get("detail", ""), "enqueue": enqueue, "driver_rc": rc, "stderr": stderr[-2000:], "cases": []}
        all_ok = True
        for c in cases:
            failed = list(c.summary["failed"]) if c.summary else ["no summary (driver stopped)"]
            outputs = compare(c) if enqueue and not failed else []
            ok = not failed and all(o["ok"] for o in outputs)
            all_ok &= ok
            report["cases"].append({"id": c.id, "op": c.op, "dtype": c.dtype, "ok": ok, "failed": failed, "steps": [s["step"] for s in c.steps], "outputs": outputs})
        report["ok"] = all_ok and (rc == 0) == all_ok
        return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("driver", type=Path, help="the trt_driver executable (built with libdeployfuse_trt.so)")
    ap.add_argument("lib", type=Path, help="libdeployfuse_trt.so")
    ap.add_argument("--cases", choices=("ci", "gpu"), default="ci", help="ci: tests/ops/cases.py; gpu: those plus larger shapes for the tensor-core kernels")
    ap.add_argument("--dtypes", default="float,half,bf16", help="comma-separated: float, half, bf16")
    ap.add_argument("--only", help="comma-separated op names")
    ap.add_argument("--json", type=Path, help="write the whole report here")
    ap.add_argument("--work", type=Path, help="keep the inputs, manifest and outputs here (e.g. to rerun the driver under compute-sanitizer)")
    args = ap.parse_args()
    report = check(args.driver, args.lib, args.cases, args.dtypes.split(","), set(args.only.split(",")) if args.only else None, args.work)
    print(f"device: {report['device']}; enqueue {'run' if report['enqueue'] else 'skipped'}")
    for c in report["cases"]:
        errs = " ".join(f"{'again' if o['output'].endswith('.again') else 'out'}={o.get('rel_l2', float('nan')):.2e}" for o in c["outputs"])
        why = "" if c["ok"] else f" failed: {','.join(c['failed'])} {json.dumps([o for o in c['outputs'] if not o['ok']])}"
        print(f"{'ok  ' if c['ok'] else 'FAIL'} {c['id']:<48} {len(c['steps'])} steps {errs}{why}")
    n_ok = sum(c["ok"] for c in report["cases"])
    print(f"{n_ok}/{len(report['cases'])} cases passed every step" + (" and matched the reference" if report["enqueue"] else " (enqueue skipped: no GPU)"))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
