"""The CUDA sources compile (sm_80 and sm_90, and the Hopper FusedMHA as sm_90a) into the CUDA
flavour of the ORT library, and the CLI builds the plugins."""

from __future__ import annotations

import shutil

import pytest

from deployfuse.cli import main


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no CUDA toolkit (nvcc) on this machine")
def test_cuda_library_builds_for_sm80_and_sm90():
    from deployfuse.ops.native import build_plugins

    out = build_plugins(cuda=True)
    assert (out / "libdeployfuse_ort.so").is_file() and (out / "libdeployfuse_ops_cuda.so").is_file()
    assert (out / "libdeployfuse_cuda_sm90a.a").is_file(), "the sm_90a FusedMHA target was not built (sm_90 among the architectures?)"


def test_cli_builds_cpu_plugins(capsys):
    assert main(["plugins", "build", "--cuda", "off"]) == 0
    assert "libdeployfuse_ort.so" in capsys.readouterr().out
