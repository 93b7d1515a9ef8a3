"""Batched requests of our wire format are queued and awaited on the edge's event loop.

A DLRM-like ``.onnx`` model (its native engine's batching queue) served by an in-process
ServingApp (real uvicorn and grpc servers on 127.0.0.1): concurrent batch-1 requests over HTTP
and gRPC merge into batches, each answer equals what an unbatched Processor answers, and none
took a thread of the model's pool (``ServingRuntime.run`` is never called: no hop, no thread
parked per request); every loop's waiter ends with nothing pending.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest

from demo import dlrm_onnx
from processor import codec
from processor.deployment import DeploymentConfig
from processor.processor import Processor

CLIENTS = 12  # per transport


def model_config(path) -> dict:
    return {"savedmodel_dir": str(path), "backend": "onnxruntime", "session_num": 2,
            "use_per_session_threads": True, "intra_op_parallelism_threads": 1}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("dlrm")
    dlrm_onnx.build(directory / "model.onnx", rows=1000, dim=8)
    return directory


@pytest.fixture
def app(model_dir, monkeypatch):
    from server.app import ServingApp

    config = {**model_config(model_dir), "batching": {
        "max_batch_size": 64, "batch_timeout_micros": 50_000, "num_batch_threads": 1, "max_enqueued_batches": 10}}
    deployment = DeploymentConfig.from_dict({
        "models": [{"name": "dlrm", "model_config": config}],
        "host": "127.0.0.1", "http_port": 0, "grpc_port": 0, "access_log": False})
    app = ServingApp(deployment, announce=lambda line: None)
    hops: list[str] = []
    real_run = app.runtime.run

    async def counted_run(name, fn, *args):
        hops.append(name)
        return await real_run(name, fn, *args)
    monkeypatch.setattr(app.runtime, "run", counted_run)
    thread = threading.Thread(target=app.run, daemon=True)
    thread.start()
    assert app.started.wait(60), "server did not start"
    app.runtime.wait_models(60)
    yield app, hops
    app.request_stop()
    thread.join(30)


def http(app, body: bytes) -> bytes:
    req = urllib.request.Request(f"http://127.0.0.1:{app.http_port}/api/predict/dlrm", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.read()


def test_batched_requests_wait_on_the_loop_not_on_a_thread(app, model_dir):
    app, hops = app
    bodies = [codec.encode_request(dlrm_onnx.inputs(1, seed=i)) for i in range(2 * CLIENTS)]
    reference = Processor.create("ref", json.dumps(model_config(model_dir)))
    try:
        expected = [codec.decode_response(reference.process(b)[1])["prob"] for b in bodies]
    finally:
        reference.close()
    channel = grpc.insecure_channel(f"127.0.0.1:{app.grpc_port}")
    predict = channel.unary_unary("/tensorflow.eas.ProcessorService/Predict")
    try:
        with ThreadPoolExecutor(2 * CLIENTS) as pool:
            futures = [pool.submit(http, app, b) for b in bodies[:CLIENTS]]
            futures += [pool.submit(predict, b, timeout=30) for b in bodies[CLIENTS:]]
            answers = [f.result(60) for f in futures]
    finally:
        channel.close()
    for got, want in zip(answers, expected):
        np.testing.assert_allclose(codec.decode_response(got)["prob"], want, rtol=1e-5, atol=1e-6)
    info = app.runtime.model("dlrm").batching_info()
    assert info["requests"] >= 2 * CLIENTS and info["batches"] < info["requests"], info  # merged
    assert hops == []  # not one request hopped to the model's pool
    assert all(waiter.pending == 0 for waiter in app.runtime._waiters.values())
    assert len(app.runtime._waiters) == 2  # HTTP's loop and gRPC's
