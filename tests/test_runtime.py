"""deployfuse.InferenceSession and `deployfuse run`: the artefact's CUDA options applied, the
custom-op library registered for deployfuse.* nodes (or their function bodies run), shapes
taken from the export's record."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import deployfuse
from deployfuse import metadata
from deployfuse.backends import ort as ort_backend
from deployfuse.ops import SPECS, ort_custom_ops_library
from deployfuse.ops.models import example_inputs, single_op_model
from deployfuse.runtime import CPU, CUDA, artefact_provider_options, input_shapes, resolve_providers


@pytest.fixture(scope="module")
def library():
    return ort_custom_ops_library()


def bias_act(tmp_path, functions: bool = True):
    """A one-node deployfuse.BiasAct model saved to disk, its inputs, and the PyTorch reference."""
    xs = example_inputs("BiasAct", (4, 8), rng=np.random.default_rng(0))
    model = single_op_model("BiasAct", xs, activation="gelu")
    if not functions:
        del model.functions[:]  # only the native kernel can run the node now
    path = tmp_path / "bias_act.onnx"
    onnx.save(model, str(path))
    ref = SPECS["BiasAct"].reference(*map(torch.from_numpy, xs), activation="gelu").numpy()
    return path, {"X": xs[0], "Bias": xs[1]}, ref


def two_input_model(tmp_path, recorded=None):
    """ids [batch, seq] int64 + mask [batch, seq] -> ids * mask, with an optional recorded shape."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["ids", "mask"], ["y"])], "m",
        [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"]) for n in ("ids", "mask")],
        [helper.make_tensor_value_info("y", TensorProto.INT64, ["batch", "seq"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    if recorded:
        metadata.write(model, metadata.INPUT_SHAPES, recorded)
    metadata.write(model, metadata.CUDA_PROVIDER_OPTIONS, {"prefer_nhwc": "1", "use_tf32": "0"})
    path = tmp_path / "two.onnx"
    onnx.save(model, str(path))
    return path


def test_public_api():
    assert "InferenceSession" in deployfuse.__all__ and deployfuse.InferenceSession is deployfuse.runtime.InferenceSession
    assert ort_backend.artefact_provider_options is artefact_provider_options, "one place reads the stored CUDA options"


def test_stored_cuda_options_applied_and_the_caller_wins(tmp_path):
    path = two_input_model(tmp_path)
    model = onnx.load(str(path))
    assert resolve_providers(model, [CUDA, CPU]) == [(CUDA, {"prefer_nhwc": "1", "use_tf32": "0"}), CPU]
    assert resolve_providers(model, [(CUDA, {"use_tf32": 1}), CPU], {"device_id": "1"}) == [(CUDA, {"prefer_nhwc": "1", "use_tf32": "1", "device_id": "1"}), CPU]
    assert resolve_providers(model, [CPU]) == [CPU]
    sess = deployfuse.InferenceSession(path, providers=[CUDA, CPU], provider_options={"use_tf32": "1"})
    assert sess.providers[0] == (CUDA, {"prefer_nhwc": "1", "use_tf32": "1"})
    ids = np.arange(6, dtype=np.int64).reshape(2, 3)
    np.testing.assert_array_equal(sess.run(None, {"ids": ids, "mask": np.ones_like(ids)})[0], ids)  # CPU here: ORT falls back


def test_library_registered_for_deployfuse_nodes(tmp_path, library):
    path, feed, ref = bias_act(tmp_path, functions=False)
    sess = deployfuse.InferenceSession(path, providers=[CPU])
    assert sess.uses_deployfuse_ops and sess.native_ops and sess.custom_ops_library == library
    np.testing.assert_allclose(sess.run(None, feed)[0], ref, rtol=1e-4, atol=1e-5)
    assert "native deployfuse ops" in repr(sess)


def test_without_the_library_function_bodies_run(tmp_path, library):
    path, feed, ref = bias_act(tmp_path)
    sess = deployfuse.InferenceSession(path, providers=[CPU], custom_ops_library=False)
    assert sess.uses_deployfuse_ops and not sess.native_ops and sess.custom_ops_library is None
    np.testing.assert_allclose(sess.run(None, feed)[0], ref, rtol=1e-4, atol=1e-5)
    native = deployfuse.InferenceSession(path, providers=[CPU])
    np.testing.assert_allclose(native.run(None, feed)[0], sess.run(None, feed)[0], rtol=1e-5, atol=1e-6)


def test_plain_model_registers_nothing(tmp_path):
    sess = deployfuse.InferenceSession(two_input_model(tmp_path), providers=[CPU])
    assert not sess.uses_deployfuse_ops and sess.custom_ops_library is None


def test_bad_paths_are_usage_errors(tmp_path):
    with pytest.raises(deployfuse.UsageError, match="no such ONNX file"):
        deployfuse.InferenceSession(tmp_path / "missing.onnx")
    (tmp_path / "junk.onnx").write_bytes(b"\x00junk")
    with pytest.raises(deployfuse.UsageError, match="not a readable ONNX model"):
        deployfuse.InferenceSession(tmp_path / "junk.onnx")
    path, _, _ = bias_act(tmp_path)
    with pytest.raises(deployfuse.UsageError, match="no such custom-op library"):
        deployfuse.InferenceSession(path, custom_ops_library=tmp_path / "libnone.so")


def test_shapes_follow_the_record_and_shared_labels(tmp_path):
    model = onnx.load(str(two_input_model(tmp_path, recorded={"ids": [2, 5], "mask": [2, 5]})))
    assert input_shapes(model) == {"ids": (2, 5), "mask": (2, 5)}
    assert input_shapes(model, {"ids": (4, 7)}) == {"ids": (4, 7), "mask": (4, 7)}, "mask follows ids on batch and seq"
    with pytest.raises(deployfuse.UsageError, match="no input named 'foo'"):
        input_shapes(model, {"foo": (1,)})
    unrecorded = onnx.load(str(two_input_model(tmp_path)))
    assert input_shapes(unrecorded, {"mask": (3, 2)}) == {"ids": (3, 2), "mask": (3, 2)}
    with pytest.raises(deployfuse.UsageError, match="has dynamic axes and no recorded shape"):
        input_shapes(unrecorded)


def test_run_command(cli, tmp_path, library):
    path, _, _ = bias_act(tmp_path, functions=False)
    code, out, err = cli("run", path, "--input", "X:16x8", "--input", "Bias:8", "--iterations", "5", "--device", "cpu")
    assert code == 0, err
    assert "deployfuse  native library" in out and "X 16x8 float32" in out and "Y 16x8" in out and "latency     median" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--input", "X:16x9", "--input", "Bias:8"], "the model rejects these inputs"),
        (["--input", "nope:3"], "no input named 'nope'"),
        ([], "has dynamic axes and no recorded shape"),
        (["--input", "X:16x8", "--input", "Bias:8", "--iterations", "0"], "--iterations must be >= 1"),
    ],
)
def test_run_command_bad_input(cli, tmp_path, args, message):
    path, _, _ = bias_act(tmp_path)
    code, _, err = cli("run", path, "--device", "cpu", *args)
    assert code == 2 and message in err and err.count("\n") == 1, err


def test_a_library_that_does_not_load_is_a_usage_error(tmp_path):
    path, _, _ = bias_act(tmp_path)
    fake = tmp_path / "libfake.so"
    fake.write_bytes(b"not an ELF file")
    with pytest.raises(deployfuse.UsageError, match="cannot load the custom-op library"):
        deployfuse.InferenceSession(path, providers=[CPU], custom_ops_library=fake)
