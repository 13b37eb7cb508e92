"""deployfuse's ONNX Runtime sessions: optimisation switch and the options artefacts carry."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from deployfuse import metadata
from deployfuse.backends.ort import artefact_provider_options, run, session


def _relu_model() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def test_cuda_request_with_stored_options_still_runs_where_only_cpu_exists():
    model = _relu_model()
    metadata.write(model, metadata.CUDA_PROVIDER_OPTIONS, {"prefer_nhwc": "1"})
    assert artefact_provider_options(model) == {"prefer_nhwc": "1"}
    sess = session(model, providers=("CUDAExecutionProvider", "CPUExecutionProvider"), optimize=False, cuda_options={"use_tf32": "0"})
    x = np.random.randn(2, 3).astype(np.float32)
    np.testing.assert_array_equal(run(sess, {"x": x, "unused": x})["y"], np.maximum(x, 0))
