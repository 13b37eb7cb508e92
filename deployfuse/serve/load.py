"""A bounded load run against a Triton endpoint: N requests from C concurrent clients, each
answer checked against the expected outputs, latency percentiles and throughput measured.

A request that errors or never comes back within the time limit is *lost*; one that comes
back with outputs off the expected ones beyond tolerance is *wrong*. bench/triton_load.py and
the serving tests both run it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

Feed = Mapping[str, np.ndarray]


@dataclass
class LoadResult:
    """What a load run measured."""

    protocol: str
    requests: int
    clients: int
    completed: int
    lost: int
    wrong: int
    seconds: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    requests_per_s: float
    samples_per_s: float
    max_abs_error: float
    server_inferences: int = 0  # samples Triton ran, by its own statistics
    server_executions: int = 0  # model executions: fewer than requests when the batcher stacked them
    first_error: str | None = None

    def as_dict(self) -> dict[str, object]:
        """JSON-ready fields."""
        return asdict(self)

    def summary(self) -> str:
        """One line for the terminal."""
        return (f"{self.protocol}: {self.completed}/{self.requests} requests from {self.clients} clients in {self.seconds:.1f} s, "
                f"lost {self.lost}, wrong {self.wrong}; p50 {self.p50_ms:.2f} ms, p90 {self.p90_ms:.2f} ms, p99 {self.p99_ms:.2f} ms; "
                f"{self.requests_per_s:.0f} requests/s ({self.samples_per_s:.0f} samples/s); "
                f"Triton ran {self.server_inferences} samples in {self.server_executions} executions")


def load_run(
    url: str,
    model: str,
    feeds: Sequence[Feed],
    expected: Sequence[Mapping[str, np.ndarray]],
    *,
    requests: int = 2000,
    clients: int = 32,
    protocol: str = "grpc",
    time_limit_s: float = 60.0,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    access_token: str | None = None,
) -> LoadResult:
    """Send `requests` requests (request i carries feeds[i % len(feeds)]) from `clients` threads,
    each with its own tritonclient, and check every answer against `expected` (same indexing).

    Errors are counted as lost, never raised: the result says what happened. `access_token`
    opens Triton's statistics where the server restricts them (PyTriton does).
    """
    if protocol not in ("grpc", "http"):
        raise ValueError(f"protocol must be grpc or http, got {protocol!r}")
    outputs = list(expected[0])
    latencies: list[float] = []
    counts = {"next": 0, "wrong": 0, "samples": 0}
    worst = [0.0]
    first_error: list[str] = []
    lock = threading.Lock()
    deadline = time.perf_counter() + time_limit_s

    def worker() -> None:
        client, module = _client(protocol, url)
        try:
            while True:
                with lock:
                    index = counts["next"]
                    if index >= requests:
                        return
                    counts["next"] += 1
                feed, want = feeds[index % len(feeds)], expected[index % len(expected)]
                if time.perf_counter() > deadline:
                    return
                inputs = []
                for name, value in feed.items():
                    tensor = module.InferInput(name, list(value.shape), _triton_dtype(value.dtype))
                    tensor.set_data_from_numpy(value)
                    inputs.append(tensor)
                start = time.perf_counter()
                try:
                    answer = client.infer(model, inputs, outputs=[module.InferRequestedOutput(n) for n in outputs])
                    got = {n: answer.as_numpy(n) for n in outputs}
                except Exception as exc:  # tritonclient raises InferenceServerException and socket errors
                    with lock:
                        first_error[:] = first_error or [f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"]
                    continue
                elapsed = (time.perf_counter() - start) * 1e3
                error = max(float(np.max(np.abs(got[n].astype(np.float64) - want[n]))) if got[n] is not None and got[n].shape == want[n].shape else np.inf for n in outputs)
                ok = all(got[n] is not None and got[n].shape == want[n].shape and np.allclose(got[n], want[n], rtol=rtol, atol=atol) for n in outputs)
                with lock:
                    latencies.append(elapsed)
                    counts["samples"] += next(iter(feed.values())).shape[0] if feed else 1
                    worst[0] = max(worst[0], error)
                    if not ok:
                        counts["wrong"] += 1
        finally:
            client.close()

    before = _statistics(protocol, url, model, access_token)
    start = time.perf_counter()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.perf_counter()) + 5.0)
    seconds = time.perf_counter() - start
    after = _statistics(protocol, url, model, access_token)
    with lock:
        done = list(latencies)
        lost = requests - len(done)  # errored, past the time limit, or still in flight
    ms = np.array(done) if done else np.array([np.nan])
    return LoadResult(
        protocol=protocol, requests=requests, clients=clients, completed=len(done), lost=lost, wrong=counts["wrong"],
        seconds=seconds, p50_ms=float(np.percentile(ms, 50)), p90_ms=float(np.percentile(ms, 90)), p99_ms=float(np.percentile(ms, 99)),
        max_ms=float(np.max(ms)), requests_per_s=len(done) / seconds, samples_per_s=counts["samples"] / seconds,
        max_abs_error=worst[0], server_inferences=after[0] - before[0], server_executions=after[1] - before[1], first_error=first_error[0] if first_error else None,
    )


def _client(protocol: str, url: str):  # -> (client, tritonclient module)
    if protocol == "grpc":
        import tritonclient.grpc as module
    else:
        import tritonclient.http as module
    return module.InferenceServerClient(url), module


def _statistics(protocol: str, url: str, model: str, access_token: str | None) -> tuple[int, int]:
    """(inference_count, execution_count) of the model so far, from Triton's statistics."""
    client, _ = _client(protocol, url)
    header = "triton-grpc-protocol-triton-access-token" if protocol == "grpc" else "triton-access-token"
    headers = {header: access_token} if access_token else None
    try:
        if protocol == "grpc":
            stats = client.get_inference_statistics(model, headers=headers, as_json=True)
        else:
            stats = client.get_inference_statistics(model, headers=headers)
    finally:
        client.close()
    entry = stats["model_stats"][0]
    return int(entry.get("inference_count", 0)), int(entry.get("execution_count", 0))


def _triton_dtype(dtype: np.dtype) -> str:
    from tritonclient.utils import np_to_triton_dtype

    return np_to_triton_dtype(dtype)
