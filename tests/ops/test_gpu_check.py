"""The GPU check (bench/ops_gpu.py) without a GPU: its dry run builds every check case of every
registered op from the registry and tests/ops/cases.py alone, and the generic C ABI it drives
(df_run in libdeployfuse_ops_cuda.so) finds ops by name and reads their attributes through the
spec, rejecting what the spec rejects. The launches themselves run on the H200 (bench/gpu_ops.sh)."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from deployfuse.ops.specs import SPECS
from tests.ops.cases import CASES, GPU_CASES

ROOT = Path(__file__).resolve().parents[2]


def _ops_gpu(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "bench" / "ops_gpu.py"), *args], capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_dry_run_builds_every_case_of_every_op():
    done = _ops_gpu("--dry-run")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = re.findall(r"^dry-run (\w+) ", done.stdout, flags=re.M)
    behind_df_run = {op for op, spec in SPECS.items() if spec.trt_plugin}  # the others have their own GPU check (bench/fp8_gemm_gpu.sh)
    assert set(rows) == behind_df_run, "every registered op with a TensorRT adapter is checked on the GPU"
    assert len(rows) == 3 * sum(op in behind_df_run for op, _, _ in CASES + GPU_CASES), "each case in fp32, fp16 and bf16"
    assert set(re.findall(r"^skip (\w+):", done.stdout, flags=re.M)) == set(SPECS) - behind_df_run, "the others are named as skipped"
    done = _ops_gpu("--dry-run", "--only", "NoSuchOp")
    assert done.returncode == 2 and "NoSuchOp" in done.stderr


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no CUDA toolkit (nvcc): the C ABI library cannot compile")
def test_c_abi_dispatches_by_name_and_checks_attributes():
    from deployfuse.ops.native import build_plugins

    lib = ctypes.CDLL(str(build_plugins(cuda=True, tensorrt=True) / "libdeployfuse_ops_cuda.so"))
    lib.df_last_error.restype = ctypes.c_char_p
    dims = (ctypes.c_int64 * 2)(4, 8), (ctypes.c_int64 * 1)(8)
    dim_ptrs = (ctypes.POINTER(ctypes.c_int64) * 2)(*[ctypes.cast(d, ctypes.POINTER(ctypes.c_int64)) for d in dims])
    ranks = (ctypes.c_int * 2)(2, 1)
    inputs = (ctypes.c_void_p * 2)(None, None)

    def run(op: str, activation: bytes, n_inputs: int = 2) -> tuple[int, str]:
        rc = lib.df_run(op.encode(), 0, None, n_inputs, inputs, dim_ptrs, ranks, None, (ctypes.c_double * 1)(0.0), (ctypes.c_char_p * 1)(activation))
        return rc, lib.df_last_error().decode()

    assert run("NoSuchOp", b"gelu") == (-1, "no registered op named NoSuchOp")
    rc, why = run("BiasAct", b"tanh")
    assert rc == -2 and "activation='tanh' is not one of relu|gelu|gelu_tanh|silu|sigmoid" in why
    rc, why = run("BiasAct", b"gelu", n_inputs=1)
    assert rc == -2 and "wrong number of inputs" in why
