"""One concurrency model for every edge: each model's work runs on its own pool, under its own
queue bound (``max_queued_requests``), whether it came over HTTP or gRPC.

A fake model ("slow") whose engine call blocks until the test lets it go, beside a fake model
("fast") that answers at once; real uvicorn and grpc servers on 127.0.0.1. While "slow" has
more calls in progress than grpcio's old shared thread pool had threads, "fast" still answers on
every edge; "slow"'s queue, filled from both edges, refuses one more request at once on either
edge (503 with ``Retry-After`` / UNAVAILABLE, naming the setting); once released, every admitted
request is answered.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from fakes import ANSWER, FakeManager, fake_models
from server.settings import DeploymentConfig
from processor.store.model_version import ModelVersion

QUEUE = 6  # "slow" may have this many requests waiting for its one thread
REQUEST = b"\x0a\x00"  # any non-empty body: the fake engine answers ANSWER


class _Held:
    """A served group whose call blocks until ``release`` is set."""

    signature = None
    version = ModelVersion(1, -1)  # the answers name it (X-Model-Version, x-model-version)
    serves_natively = False  # never in place: it runs on the model's pool

    def __init__(self) -> None:
        self.release = threading.Event()

    def serve(self, data) -> bytes:
        assert self.release.wait(30), "the test never released the slow model"
        return ANSWER


class HeldManager(FakeManager):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.group = _Held()
        self.group.signature = FakeManager(name).acquire_handle().group.signature

    def acquire_handle(self, number=None):
        manager = self

        class Handle:
            group = manager.group

            def release(self) -> None:
                pass
        return Handle()


@pytest.fixture
def app():
    from server.app import ServingApp

    deployment = DeploymentConfig.from_dict({
        "models": [{"name": "slow", "model_config": {"savedmodel_dir": "/nonexistent"},
                    "inference_threads": 1, "max_queued_requests": QUEUE},
                   {"name": "fast", "model_config": {"savedmodel_dir": "/nonexistent"}, "inference_threads": 1}],
        "host": "127.0.0.1", "http_port": 0, "grpc_port": 0, "access_log": False})
    slow = HeldManager("slow")
    app = ServingApp(deployment, models=fake_models(deployment, {"slow": slow, "fast": FakeManager("fast")}),
                     announce=lambda line: None)
    thread = threading.Thread(target=app.run, daemon=True)
    thread.start()
    assert app.started.wait(30), "server did not start"
    yield app, slow.group
    slow.group.release.set()
    app.request_stop()
    thread.join(30)


def http(app, model: str, timeout: float = 30) -> tuple[int, bytes, str | None]:
    req = urllib.request.Request(f"http://127.0.0.1:{app.http_port}/api/predict/{model}", data=REQUEST,
                                 method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read(), None
    except urllib.error.HTTPError as err:
        return err.code, err.read(), err.headers.get("Retry-After")


def grpc_call(channel, model: str, timeout: float = 30) -> tuple[grpc.StatusCode, str]:
    call = channel.unary_unary("/tensorflow.eas.ProcessorService/Predict")
    try:
        call(REQUEST, metadata=[("model-name", model)], timeout=timeout)
        return grpc.StatusCode.OK, ""
    except grpc.RpcError as err:
        return err.code(), err.details()


def wait_pending(app, model: str, count: int) -> None:
    pool = app.runtime.pool(model)
    deadline = time.monotonic() + 20
    while pool.pending < count:
        assert time.monotonic() < deadline, f"{model}: {pool.pending} of {count} requests admitted"
        time.sleep(0.01)


def test_a_slow_models_queue_holds_only_its_own_requests_on_every_edge(app):
    app, held = app
    channel = grpc.insecure_channel(f"127.0.0.1:{app.grpc_port}")
    pool = ThreadPoolExecutor(QUEUE + 1)
    try:
        # "slow": one call running, QUEUE - 1 waiting, from gRPC: more than the 4 threads the
        # old synchronous gRPC server shared among all models
        admitted = [pool.submit(grpc_call, channel, "slow") for _ in range(QUEUE)]
        wait_pending(app, "slow", QUEUE)
        admitted.append(pool.submit(http, app, "slow"))  # the last place in the queue, from HTTP
        wait_pending(app, "slow", QUEUE + 1)

        # "fast" answers at once over both edges while "slow" is full
        for _ in range(3):
            assert grpc_call(channel, "fast", timeout=5) == (grpc.StatusCode.OK, "")
            status, body, _ = http(app, "fast", timeout=5)
            assert (status, body) == (200, ANSWER)

        # "slow" refuses one more, at once, on either edge
        code, message = grpc_call(channel, "slow", timeout=5)
        assert code == grpc.StatusCode.UNAVAILABLE and "max_queued_requests" in message, message
        status, body, retry_after = http(app, "slow", timeout=5)
        assert status == 503 and b"max_queued_requests" in body and retry_after == "1", (status, body)
        assert app.runtime.pool("slow").pending == QUEUE + 1  # refusals take no place
    finally:
        held.release.set()
        results = [f.result(30) for f in admitted]
        pool.shutdown()
        channel.close()
    assert results[:QUEUE] == [(grpc.StatusCode.OK, "")] * QUEUE
    assert results[QUEUE][:2] == (200, ANSWER)
    assert app.runtime.pool("slow").pending == 0
