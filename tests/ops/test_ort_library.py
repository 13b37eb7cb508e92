"""libdeployfuse_ort on the CPU EP: it builds, its kernels run (a model stripped of its function
bodies still runs), and with or without it ORT matches the PyTorch reference; the CPU build runs
float16 nodes too, on its float32 kernels."""

from __future__ import annotations

import numpy as np
import pytest

from deployfuse.backends.ort import run, session
from deployfuse.ops import SPECS, ort_custom_ops_library
from deployfuse.ops.models import example_inputs, ort_feed, reference_output, single_op_model
from deployfuse.ops.native import build_plugins
from tests.ops.cases import CASES, case_id, draw


@pytest.fixture(scope="module")
def library():
    return ort_custom_ops_library()


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_native_cpu_kernel_matches_reference(library, case):
    op, shape, attrs = case
    attrs = dict(attrs)
    xs = draw(op, shape, **attrs)
    attrs.pop("mask", None)
    model = single_op_model(op, xs, **attrs)
    del model.functions[:]  # only the native kernel can run this node now
    got = run(session(model, optimize=True, custom_ops_library=library), ort_feed(op, xs))["Y"]
    np.testing.assert_allclose(got, reference_output(op, xs, **attrs), rtol=1e-4, atol=1e-5)


def test_without_functions_or_library_the_node_is_unknown():
    xs = example_inputs("BiasAct", (2, 3))
    model = single_op_model("BiasAct", xs, activation="relu")
    del model.functions[:]
    with pytest.raises(Exception, match="BiasAct"):
        session(model)


def test_native_kernel_rejects_bad_attribute(library):
    xs = example_inputs("GroupNormAct", (1, 6, 2, 2))
    model = single_op_model("GroupNormAct", xs, num_groups=4)  # 6 channels, 4 groups
    del model.functions[:]
    with pytest.raises(Exception, match="channels not divisible by num_groups"):
        run(session(model, custom_ops_library=library), {"X": xs[0], "Scale": xs[1], "Bias": xs[2]})


@pytest.mark.parametrize("bad,why", [("Bias", "Bias must have W's N elements"), ("Residual", r"Residual must have Y's shape")])
def test_gemm_act_names_the_input_that_does_not_fit(library, bad, why):
    """GemmAct's shape checks (GemmActAttrs::sizes, which both runtimes' adapters call) reject a Bias
    or Residual one column short instead of reading past it."""
    xs = example_inputs("GemmAct", (2, 3, 8, 5), mask=True)
    model = single_op_model("GemmAct", xs)
    del model.functions[:]
    feed = dict(zip(SPECS["GemmAct"].inputs, xs))
    feed[bad] = np.ascontiguousarray(feed[bad][..., :-1])
    with pytest.raises(Exception, match=why):
        run(session(model, custom_ops_library=library), feed)


@pytest.fixture(scope="module")
def cpu_library():
    """The build without CUDA, whatever else is built (ort_custom_ops_library prefers the CUDA one)."""
    return build_plugins(cuda=False) / "libdeployfuse_ort.so"


@pytest.mark.parametrize("case", [next(c for c in CASES if c[0] == op) for op in SPECS], ids=case_id)
def test_cpu_build_runs_a_float16_node_on_its_float32_kernel(cpu_library, case):
    """The CPU build has float32 CPU kernels only, yet registers the CUDA EP's float16 so that ORT's schema admits
    a float16 node (an fp8 ort-cuda export); ORT's CPU EP then casts around the float32 kernel: Y16 = fp16(K(fp32(X16))),
    bit for bit the float32 run on the same inputs, rounded."""
    op, shape, attrs = case
    attrs = dict(attrs)
    xs = example_inputs(op, shape, dtype=np.float16, **attrs)
    attrs.pop("mask", None)
    widened = [x.astype(np.float32) if x is not None and x.dtype == np.float16 else x for x in xs]  # fixed-type inputs stay
    half, full = single_op_model(op, xs, **attrs), single_op_model(op, widened, **attrs)
    del half.functions[:], full.functions[:]  # only the native kernels can run these nodes
    got = run(session(half, custom_ops_library=cpu_library), ort_feed(op, xs))["Y"]
    want = run(session(full, custom_ops_library=cpu_library), ort_feed(op, widened))["Y"]
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, want.astype(np.float16))
