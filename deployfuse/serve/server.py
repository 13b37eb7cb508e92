"""A local Triton Inference Server for one ONNX artefact: PyTriton's bundled `tritonserver`,
the model run in-process by `deployfuse.InferenceSession` (the python backend calls us).

It is the quick endpoint (`deployfuse serve`) and what the tests serve for real: the same HTTP
and gRPC protocol, dynamic batcher and clients as a production Triton. It listens on 127.0.0.1
unless told otherwise, on free ports unless given some.

    with LocalServer("model.onnx", max_batch_size=16) as server:
        client = tritonclient.http.InferenceServerClient(server.http_url)
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import sysconfig
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from deployfuse.errors import UsageError
from deployfuse.serve.signature import Signature, onnx_signature
from deployfuse.serve.triton_config import check_model_name, served_dims

LOG = logging.getLogger("deployfuse.serve")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Ports:
    """HTTP, gRPC and metrics ports of one server."""

    http: int
    grpc: int
    metrics: int

    @classmethod
    def from_http(cls, http: int | None, host: str = "127.0.0.1") -> Ports:
        """`http`, `http + 1`, `http + 2` (Triton's own layout, 8000/8001/8002), or three free ports."""
        if http is None:
            return cls(free_port(host), free_port(host), free_port(host))
        if not 0 < http < 65534:
            raise UsageError(f"--port {http}: need 1-65533 (gRPC and metrics take the next two)")
        for port, what in ((http, "HTTP"), (http + 1, "gRPC"), (http + 2, "metrics")):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind((host, port))
                except OSError as exc:
                    raise UsageError(f"--port {http}: {host}:{port} ({what}) is not free ({exc.strerror}); choose another --port") from exc
        return cls(http, http + 1, http + 2)


class LocalServer:
    """PyTriton serving one ONNX artefact through `deployfuse.InferenceSession`.

    `start()` returns once the model is ready; `stop()` (or leaving the `with` block) shuts
    the server down and always runs, even after a failed start.
    """

    def __init__(
        self,
        artefact: str | os.PathLike[str],
        *,
        name: str | None = None,
        max_batch_size: int | None = None,
        max_queue_delay_us: int = 2000,
        host: str = "127.0.0.1",
        port: int | None = None,
        providers: Sequence[Any] | None = None,
        log_file: str | os.PathLike[str] | None = None,
    ) -> None:
        """Args:
            artefact: the ONNX model to serve.
            name: the model's name on the server (default: the file stem).
            max_batch_size: the largest batch the dynamic batcher forms; None: 16 when the
                model has a batch axis, 0 (no batching) otherwise.
            max_queue_delay_us: how long the batcher waits to fill a batch.
            host: the address to listen on (loopback unless you mean to expose the model).
            port: the HTTP port (gRPC and metrics take the next two); None: free ports.
            providers: ONNX Runtime execution providers (default: CUDA when available, else CPU).
            log_file: where tritonserver's own log goes (default: a file in the temp folder).
        """
        self.artefact = Path(artefact)
        if not self.artefact.is_file():
            raise UsageError(f"no such artefact: {self.artefact}")
        if self.artefact.suffix.lower() != ".onnx":
            raise UsageError(f"unknown artefact type {self.artefact.name!r}: `deployfuse serve` runs ONNX models (package engines with `deployfuse package --triton`)")
        self.name = name or self.artefact.stem
        check_model_name(self.name)
        self.signature = onnx_signature(self.artefact)
        if max_batch_size is None:
            max_batch_size = 16 if self.signature.has_batch_axis else 0
        if max_batch_size < 0:
            raise UsageError(f"--max-batch-size must be >= 0, got {max_batch_size}")
        if max_batch_size > 0 and not self.signature.has_batch_axis:
            raise UsageError("--max-batch-size needs a batch axis (axis 0 of every input and output dynamic); leave it out or pass 0")
        self.max_batch_size = max_batch_size
        self.max_queue_delay_us = max_queue_delay_us
        self.host = host
        self.ports = Ports.from_http(port, host)
        self.providers = providers
        self.log_file = Path(log_file) if log_file is not None else Path(tempfile.gettempdir()) / f"deployfuse-tritonserver-{os.getpid()}-{self.ports.http}.log"
        self._triton: Any = None
        self.session: Any = None

    @property
    def http_url(self) -> str:
        """host:port for `tritonclient.http`."""
        return f"{self.host}:{self.ports.http}"

    @property
    def grpc_url(self) -> str:
        """host:port for `tritonclient.grpc`."""
        return f"{self.host}:{self.ports.grpc}"

    @property
    def access_token(self) -> str | None:
        """The token PyTriton requires for its restricted endpoints (statistics, repository)."""
        return self._triton.get_access_token() if self._triton is not None else None

    def start(self) -> LocalServer:
        """Open the session, start tritonserver, load the model; returns when it is ready."""
        from deployfuse.runtime import InferenceSession

        try:
            from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
            from pytriton.triton import Triton, TritonConfig
        except ImportError as exc:
            raise UsageError("serving needs PyTriton: pip install 'deployfuse[serve]'") from exc
        self.session = InferenceSession(self.artefact, providers=self.providers)
        batching = self.max_batch_size > 0
        config = TritonConfig(
            http_address=self.host, http_port=self.ports.http, grpc_address=self.host, grpc_port=self.ports.grpc,
            metrics_address=self.host, metrics_port=self.ports.metrics, allow_metrics=False, exit_on_error=True,
            exit_timeout_secs=5, log_file=self.log_file,
        )
        try:
            self._triton = Triton(config=config)
            self._triton.bind(
                model_name=self.name,
                infer_func=_Infer(self.session, self.signature, batching),
                inputs=[Tensor(name=t.name, dtype=t.numpy_dtype, shape=tuple(served_dims(t, batching))) for t in self.signature.inputs],
                outputs=[Tensor(name=t.name, dtype=t.numpy_dtype, shape=tuple(served_dims(t, batching))) for t in self.signature.outputs],
                config=ModelConfig(
                    batching=batching, max_batch_size=max(self.max_batch_size, 1),
                    batcher=DynamicBatcher(max_queue_delay_microseconds=self.max_queue_delay_us),
                ),
                strict=True,
            )
            with _stub_environment():
                self._triton.run()
        except BaseException:
            self.stop()
            raise
        LOG.info("serving %s as %r on http://%s and grpc %s", self.artefact, self.name, self.http_url, self.grpc_url)
        return self

    def serve_forever(self) -> None:
        """Block until Ctrl-C (or the server dies), then stop."""
        try:
            self._triton.serve()
        finally:
            self.stop()

    def stop(self) -> None:
        """Shut tritonserver down (idempotent)."""
        triton, self._triton = self._triton, None
        if triton is not None:
            triton.stop()

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def _stub_environment() -> Iterator[None]:
    """Let the python backend's stub embed this interpreter: its libpython first on the library
    path, and this interpreter's import path as PYTHONPATH. Otherwise the stub links the
    system's libpython (pyenv, venvs) and cannot import numpy or deployfuse."""
    saved = {k: os.environ.get(k) for k in ("LD_LIBRARY_PATH", "PYTHONPATH")}
    libdir = sysconfig.get_config_var("LIBDIR") if sysconfig.get_config_var("Py_ENABLE_SHARED") else None
    if libdir:
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, saved["LD_LIBRARY_PATH"]) if p)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class _Infer:
    """The python backend's callable: Triton's batch of requests in, one output dict each out.

    Requests the batcher put together share their shapes; they are stacked on axis 0, run
    once, and split back. Without a batch axis each request runs alone.
    """

    def __init__(self, session: Any, signature: Signature, batching: bool) -> None:
        self.session = session
        self.inputs = [t.name for t in signature.inputs]
        self.outputs = [t.name for t in signature.outputs]
        self.batching = batching

    def __call__(self, requests: list[Any]) -> list[dict[str, np.ndarray]]:
        results: list[dict[str, np.ndarray]] = [{} for _ in requests]
        groups: dict[tuple, list[int]] = {}
        for index, request in enumerate(requests):
            key = tuple((n, request[n].shape[1:] if self.batching else index) for n in self.inputs)
            groups.setdefault(key, []).append(index)
        for indices in groups.values():
            feed = {n: np.concatenate([requests[i][n] for i in indices]) if len(indices) > 1 else requests[indices[0]][n] for n in self.inputs}
            outputs = self.session.run(self.outputs, feed)
            sizes = np.cumsum([requests[i][self.inputs[0]].shape[0] for i in indices])[:-1]
            for name, value in zip(self.outputs, outputs):
                for i, part in zip(indices, np.split(value, sizes) if len(indices) > 1 else [value]):
                    results[i][name] = part
        return results
