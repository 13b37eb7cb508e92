"""FusedMHA's Bias input (tests/ops/cases.py BIAS_CASES; the YQ cases with a Bias run in test_fused_mha_yq.py): through the
function bodies (ONNX Runtime optimisations off) and the CPU custom-op library, on fresh random inputs, Y matches the
PyTorch reference of Q + b_Q, K + b_K and V + b_V, which differs from the attention without the bias (so the test would see
a node ignoring it). The CUDA kernels' form (b_K left out, b_V added to Y) is checked on a GPU: bench/ops_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest

from deployfuse.backends.ort import run, session
from deployfuse.ops import ort_custom_ops_library
from deployfuse.ops.models import example_inputs, ort_feed, reference_output, single_op_model
from tests.ops.cases import BIAS_CASES, case_id

OP = "FusedMHA"


@pytest.fixture(scope="module")
def library():
    return ort_custom_ops_library()


@pytest.mark.parametrize("native", [False, True], ids=["function_body", "cpu_library"])
@pytest.mark.parametrize("case", BIAS_CASES, ids=case_id)
def test_bias_is_added_to_q_k_and_v(library, case, native):
    _, shape, attrs = case
    attrs = dict(attrs)
    xs = example_inputs(OP, shape, **attrs)
    attrs.pop("mask", None)
    attrs.pop("bias")
    model = single_op_model(OP, xs, **attrs)
    if native:
        del model.functions[:]  # only the native kernel can run the node now
    got = run(session(model, optimize=False, custom_ops_library=library if native else None), ort_feed(OP, xs))["Y"]
    want = reference_output(OP, xs, **attrs)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert np.abs(want - reference_output(OP, xs[:5], **attrs)).max() > 0.1, "the bias moves Y"
