"""FusedMHA packed_qkv=1 as an export writes it: one [B, S, 3D] tensor laid out [Q | K | V] named
three times. Through the CPU custom-op library (function bodies removed) and through the function
body (ORT graph optimisations off) it gives what the unpacked op gives on the three thirds and what
PyTorch's scaled_dot_product_attention gives, on fresh random inputs, with and without a padding
mask, causal or not. The TensorRT plugin (the C ABI over its adapters) refuses packed_qkv=1,
saying why, before any CUDA call."""

from __future__ import annotations

import ctypes
import shutil

import numpy as np
import pytest
import torch
from onnx import helper

from deployfuse.backends.ort import run, session
from deployfuse.ops import ort_custom_ops_library
from deployfuse.ops.models import single_op_model

# (batch, seq, heads, head_dim, padding mask, causal)
SHAPES = [(2, 9, 3, 8, False, 0), (2, 11, 2, 16, True, 0), (1, 12, 4, 4, False, 1), (3, 7, 2, 12, True, 1)]


@pytest.fixture(scope="module")
def library():
    return ort_custom_ops_library()


def _packed_model(qkv: np.ndarray, mask: np.ndarray | None, **attrs):
    """single_op_model's FusedMHA with its Q, K and V inputs replaced by one graph input QKV."""
    model = single_op_model("FusedMHA", [qkv, qkv, qkv, mask], packed_qkv=1, **attrs)
    graph = model.graph
    kept = [vi for vi in graph.input if vi.name not in ("Q", "K", "V")]
    del graph.input[:]
    graph.input.extend([helper.make_tensor_value_info("QKV", 1, ["b", "s", "w"]), *kept])
    graph.node[0].input[:3] = ["QKV"] * 3
    return model


def _sdpa(qkv: np.ndarray, mask: np.ndarray | None, heads: int, causal: int) -> np.ndarray:
    """PyTorch's attention on the thirds of qkv, in float64."""
    b, s, _ = qkv.shape
    q, k, v = (t.reshape(b, s, heads, -1).transpose(1, 2) for t in torch.from_numpy(qkv).double().chunk(3, dim=-1))
    bias = None if mask is None else torch.from_numpy(mask).double()
    if causal:
        tril = torch.ones(s, s, dtype=torch.bool).tril()
        bias = torch.zeros(s, s, dtype=torch.float64).masked_fill(~tril, float("-inf")) + (0 if bias is None else bias)
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    return y.transpose(1, 2).reshape(b, s, -1).numpy()


@pytest.mark.parametrize("native", [True, False], ids=["library", "function_body"])
@pytest.mark.parametrize(("batch", "seq", "heads", "head_dim", "padded", "causal"), SHAPES)
def test_packed_matches_unpacked_and_sdpa(library, native, batch, seq, heads, head_dim, padded, causal):
    rng = np.random.default_rng(seq * 100 + heads)
    hidden = heads * head_dim
    qkv = rng.standard_normal((batch, seq, 3 * hidden), dtype=np.float32)
    mask = None
    if padded:
        mask = np.zeros((batch, 1, 1, seq), np.float32)
        mask[-1, ..., seq - 3 :] = -10000.0  # the last sample's last 3 tokens are padding
    attrs = {"num_heads": heads, "causal": causal}
    packed = _packed_model(qkv, mask, **attrs)
    q, k, v = (np.ascontiguousarray(t) for t in np.split(qkv, 3, axis=-1))
    unpacked = single_op_model("FusedMHA", [q, k, v, mask], **attrs)
    extra = {} if mask is None else {"Mask": mask}
    if native:
        del packed.functions[:], unpacked.functions[:]  # only the library's kernel can run them now
    lib = library if native else None
    got = run(session(packed, optimize=False, custom_ops_library=lib), {"QKV": qkv, **extra})["Y"]
    want = run(session(unpacked, optimize=False, custom_ops_library=lib), {"Q": q, "K": k, "V": v, **extra})["Y"]
    assert got.shape == (batch, seq, hidden)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, _sdpa(qkv, mask, heads, causal), rtol=1e-4, atol=1e-5)


def test_packed_rejects_a_width_not_three_hiddens(library):
    qkv = np.zeros((1, 4, 3 * 8), np.float32)
    model = _packed_model(qkv, None, num_heads=2)
    del model.functions[:]
    with pytest.raises(Exception, match="packed_qkv: the last dim of Q, K, V is not 3\\*hidden"):
        run(session(model, custom_ops_library=library), {"QKV": np.zeros((1, 4, 25), np.float32)})


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no CUDA toolkit (nvcc): the C ABI library cannot compile")
def test_tensorrt_plugin_refuses_packed_qkv():
    from deployfuse.ops.native import build_plugins
    from deployfuse.ops.specs import SPECS

    lib = ctypes.CDLL(str(build_plugins(cuda=True, tensorrt=True) / "libdeployfuse_ops_cuda.so"))
    lib.df_last_error.restype = ctypes.c_char_p
    dims = [(ctypes.c_int64 * 3)(1, 4, 24) for _ in range(3)]
    dim_ptrs = (ctypes.POINTER(ctypes.c_int64) * 3)(*[ctypes.cast(d, ctypes.POINTER(ctypes.c_int64)) for d in dims])
    numbers = [{"num_heads": 2.0, "packed_qkv": 1.0}.get(name, 0.0) for name in SPECS["FusedMHA"].attrs]
    args = (3, (ctypes.c_void_p * 3)(), dim_ptrs, (ctypes.c_int * 3)(3, 3, 3), None, (ctypes.c_double * len(numbers))(*numbers))
    rc = lib.df_run(b"FusedMHA", 0, None, *args, (ctypes.c_char_p * len(numbers))())
    assert rc == -2 and "packed_qkv=1 has no TensorRT plugin" in lib.df_last_error().decode()
