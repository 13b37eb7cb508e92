"""A real Triton Inference Server (PyTriton's tritonserver) serving a deployfuse artefact through
deployfuse.InferenceSession on 127.0.0.1: HTTP and gRPC answers equal ONNX Runtime's, a bounded
load run loses nothing, and `deployfuse serve` stops cleanly on Ctrl-C."""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from deployfuse.backends.ort import run, session
from deployfuse.runtime import CPU
from deployfuse.serve.load import load_run
from deployfuse.serve.server import LocalServer, free_port


@pytest.fixture(scope="module")
def server(mlp_onnx, tmp_path_factory):
    """The artefact served on loopback with dynamic batching; always stopped."""
    log = tmp_path_factory.mktemp("triton") / "tritonserver.log"
    local = LocalServer(mlp_onnx, name="mlp", max_batch_size=8, providers=[CPU], log_file=log)
    try:
        yield local.start()
    finally:
        local.stop()


@functools.cache
def _ort_session(model):
    from deployfuse.ops import ort_custom_ops_library

    return session(model, custom_ops_library=ort_custom_ops_library())


def ort_outputs(model, x: np.ndarray) -> np.ndarray:
    """What `deployfuse compare`'s ONNX Runtime CPU runner computes (its session, with the custom-op library; made once)."""
    outputs = run(_ort_session(model), {"input": x})
    return next(iter(outputs.values()))


def test_http_and_grpc_answers_equal_onnx_runtime(server, mlp_onnx):
    assert server.host == "127.0.0.1" and server.session.native_ops, "deployfuse.* nodes run through the library"
    for batch in (1, 3, 8):
        x = np.random.default_rng(batch).standard_normal((batch, 16)).astype(np.float32)
        want = ort_outputs(mlp_onnx, x)
        output = server.session.get_outputs()[0].name
        for module, url in ((httpclient, server.http_url), (grpcclient, server.grpc_url)):
            client = module.InferenceServerClient(url)
            try:
                tensor = module.InferInput("input", list(x.shape), "FP32")
                tensor.set_data_from_numpy(x)
                got = client.infer("mlp", [tensor]).as_numpy(output)
            finally:
                client.close()
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"{module.__name__} batch {batch}")


def test_served_config_batches_dynamically(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        config = client.get_model_config("mlp").config
    finally:
        client.close()
    assert config.max_batch_size == 8 and config.HasField("dynamic_batching")
    assert [list(i.dims) for i in config.input] == [[16]]


def test_bounded_load_run_loses_nothing(server, mlp_onnx):
    rng = np.random.default_rng(0)
    feeds = [{"input": rng.standard_normal((1 + i % 3, 16)).astype(np.float32)} for i in range(16)]
    output = server.session.get_outputs()[0].name
    expected = [{output: ort_outputs(mlp_onnx, f["input"])} for f in feeds]
    result = load_run(server.grpc_url, "mlp", feeds, expected, requests=200, clients=8, time_limit_s=60, access_token=server.access_token)
    print(result.summary())
    assert (result.completed, result.lost, result.wrong) == (200, 0, 0), result.first_error
    assert result.server_inferences == sum(feeds[i % 16]["input"].shape[0] for i in range(200))
    assert 0 < result.server_executions <= 200


def _free_triplet() -> int:
    """A port P with P, P+1 and P+2 free (`deployfuse serve --port P` takes all three)."""
    for _ in range(50):
        port = free_port()
        try:
            for p in (port, port + 1, port + 2):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue
    raise RuntimeError("no three consecutive free ports")


def test_serve_command_answers_and_stops_on_ctrl_c(mlp_onnx, tmp_path):
    port = _free_triplet()
    log = tmp_path / "tritonserver.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "deployfuse", "serve", str(mlp_onnx), "--port", str(port), "--device", "cpu", "--name", "mlp", "--log-file", str(log)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        lines = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "Ctrl-C stops it." in line:
                break
        assert any("Ctrl-C stops it." in line for line in lines), "".join(lines)
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            assert client.is_model_ready("mlp")
        finally:
            client.close()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0, proc.stdout.read()
        assert f"Started HTTPService at 127.0.0.1:{port}" in log.read_text(), "loopback only"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # the HTTP port is free again: the server is gone


def test_serve_refuses_batching_without_a_batch_axis(cli, tmp_path):
    from tests.serve.test_package import matmul_model

    code, _, err = cli("serve", matmul_model(tmp_path / "static.onnx", {}, batch=2), "--max-batch-size", "4")
    assert code == 2 and "--max-batch-size needs a batch axis" in err and err.count("\n") == 1


def test_serve_refuses_a_port_in_use(cli, mlp_onnx):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, _, err = cli("serve", mlp_onnx, "--port", port)
    assert code == 2 and f"127.0.0.1:{port} (HTTP) is not free" in err and err.count("\n") == 1
