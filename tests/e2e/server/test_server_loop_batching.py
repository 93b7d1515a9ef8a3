"""Batched requests of our wire format are queued and awaited on the edge's event loop.

A DLRM-like ``.onnx`` model (its native engine's batching queue) served by an in-process
ServingApp (real uvicorn and grpc servers on 127.0.0.1): concurrent batch-1 requests over HTTP
and gRPC merge into batches, each answer equals what an unbatched Processor answers, and none
took a thread of the model's pool (``ServingRuntime.run`` is never called: no hop, no thread
parked per request); every loop's waiter ends with nothing pending (the native gRPC server, the
default where it is built, queues them natively, without a loop). Over HTTP they are the
connection's own deferred answers (no ASGI cycle): pipelined requests, lean and not, are
answered in order, and a drain waits for the batch an answer awaits. Small TF Serving REST and
KServe v2 requests to it, which run on its pool, are deferred answers too.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest

from demo import dlrm_onnx
from processor import codec
from server.settings import DeploymentConfig
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
    # HTTP's loop and the Python gRPC server's; the native one queues our Predict without a loop
    assert len(app.runtime._waiters) == (2 if app.grpc_server == "python" else 1)


def raw(body: bytes, chunked: bool = False, extra: str = "") -> bytes:
    """A POST to the model over HTTP/1.1; chunked: a body the lean path never takes (ASGI)."""
    head = f"POST /api/predict/dlrm HTTP/1.1\r\nHost: x\r\n{extra}"
    if chunked:
        chunk = f"{len(body):x}\r\n".encode() + body + b"\r\n" if body else b""
        return f"{head}Transfer-Encoding: chunked\r\n\r\n".encode() + chunk + b"0\r\n\r\n"
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


def read_response(f) -> tuple[int, dict[str, str], bytes]:
    status = int(f.readline().split()[1])
    headers = {}
    while line := f.readline().decode("latin-1").rstrip("\r\n"):
        key, value = line.split(":", 1)
        headers[key.strip().lower()] = value.strip()
    return status, headers, f.read(int(headers["content-length"]))


def spy_later(app, monkeypatch) -> list[str]:
    """The models of the requests answered as deferred lean answers from now on (every
    server's: the spy is on the class)."""
    from server.eas.rest_routes import EasPredict

    taken: list[str] = []
    real = EasPredict.later

    async def spied(self, model, body, headers):
        taken.append(model)
        return await real(self, model, body, headers)
    monkeypatch.setattr(EasPredict, "later", spied)
    return taken


def test_pipelined_requests_behind_a_deferred_answer_keep_their_order(app, model_dir, monkeypatch):
    app, hops = app
    bodies = [codec.encode_request(dlrm_onnx.inputs(1 + i, seed=10 + i)) for i in range(4)]
    reference = Processor.create("ref", json.dumps(model_config(model_dir)))
    try:
        expected = [codec.decode_response(reference.process(b)[1])["prob"] for b in bodies]
    finally:
        reference.close()
    taken = spy_later(app, monkeypatch)
    # one write: a lean request (deferred: its batch waits 50 ms), the ping over ASGI (chunked;
    # answered at once, it must still come second), two ASGI predictions, two lean-sized ones
    payload = (raw(bodies[0], extra="X-Request-ID: first\r\n") + raw(b"", chunked=True)
               + raw(bodies[1], chunked=True) + raw(bodies[2]) + raw(bodies[3], extra="X-Request-ID: last\r\n"))
    with socket.create_connection(("127.0.0.1", app.http_port), timeout=30) as sock, sock.makefile("rb") as f:
        sock.sendall(payload)
        first, ping, *answers = [read_response(f) for _ in range(5)]
        answers.insert(0, first)
        sock.sendall(raw(bodies[0]))  # the connection stays usable, and lean again
        again = read_response(f)
    assert ping[0] == 200 and ping[1]["content-type"] == "application/json" and json.loads(ping[2])
    assert [a[0] for a in answers] == [200] * 4
    for (_, _, got), want in zip(answers, expected):
        np.testing.assert_allclose(codec.decode_response(got)["prob"], want, rtol=1e-5, atol=1e-6)
    assert answers[0][1]["x-request-id"] == "first" and answers[3][1]["x-request-id"] == "last"
    assert again[0] == 200 and "connection" not in again[1]
    np.testing.assert_allclose(codec.decode_response(again[2])["prob"], expected[0], rtol=1e-5, atol=1e-6)
    assert taken[0] == "dlrm" and taken[-1] == "dlrm" and 2 <= len(taken) <= 4
    assert hops == []  # the ping (not batched: the signature) is answered on the loop, the rest were queued


def test_a_batching_models_errors_are_deferred_answers_and_its_ping_is_answered_at_once(app, monkeypatch):
    app, _ = app
    taken = spy_later(app, monkeypatch)
    with socket.create_connection(("127.0.0.1", app.http_port), timeout=30) as sock, sock.makefile("rb") as f:
        sock.sendall(raw(b"\x0a\x05junk"))  # not a PredictRequest
        bad = read_response(f)
        sock.sendall(raw(b""))  # DeepRec's introspection ping: the signature JSON
        ping = read_response(f)
    assert bad[0] == 400 and "error" in json.loads(bad[2])
    assert ping[0] == 200 and ping[1]["content-type"] == "application/json" and json.loads(ping[2])
    assert taken == ["dlrm"]  # the ping is not batched: answered on the loop, at once


def test_a_drain_waits_for_the_batch_a_deferred_answer_awaits(app):
    app, _ = app  # the batch timeout is 50 ms: the request is still queued when the drain starts
    body = codec.encode_request(dlrm_onnx.inputs(1, seed=3))
    with socket.create_connection(("127.0.0.1", app.http_port), timeout=30) as sock, sock.makefile("rb") as f:
        sock.sendall(raw(body))
        deadline = time.monotonic() + 10
        while app.runtime.gate.in_flight == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert app.runtime.gate.in_flight == 1
        app.request_stop()
        status, _, data = read_response(f)
    assert status == 200 and codec.decode_response(data)["prob"].shape == (1, 1)


def test_tf_serving_and_v2_requests_to_a_pooled_model_are_deferred_lean_answers(app, model_dir, monkeypatch):
    """A batching model's TF Serving REST and KServe v2 requests run on its pool (they are not
    queued natively): the connection awaits them itself, answered as the ASGI routes answer."""
    from server.http.predict import Later

    app, hops = app
    routes = app._asgi.predict
    kinds: list[str] = []
    real = routes.lean_admit
    monkeypatch.setattr(routes, "lean_admit", lambda url, headers: (
        lambda answer: kinds.append(type(answer).__name__) or answer)(real(url, headers)))
    feeds = dlrm_onnx.inputs(2, seed=7)
    reference = Processor.create("ref", json.dumps(model_config(model_dir)))
    try:
        want = codec.decode_response(reference.process(codec.encode_request(feeds))[1])["prob"]
    finally:
        reference.close()
    rows = [{k: v[i].tolist() for k, v in feeds.items()} for i in range(2)]
    v2 = {"inputs": [{"name": k, "shape": list(v.shape), "datatype": "FP32" if v.dtype == np.float32 else "INT64",
                      "data": v.ravel().tolist()} for k, v in feeds.items()]}
    answers = []
    for path, doc in (("/v1/models/dlrm:predict", {"instances": rows}), ("/v2/models/dlrm/infer", v2),
                      ("/v1/models/dlrm/versions/x:predict", {"instances": rows}),  # ASGI: the version is not a number
                      ("/v1/models/nope:predict", {"instances": rows})):
        req = urllib.request.Request(f"http://127.0.0.1:{app.http_port}{path}", data=json.dumps(doc).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                answers.append((resp.status, json.loads(resp.read())))
        except urllib.error.HTTPError as exc:
            answers.append((exc.code, json.loads(exc.read())))
    assert kinds == [Later.__name__, Later.__name__, "NoneType", Later.__name__]
    (tfs_status, tfs), (v2_status, v2_doc), (bad_status, bad), (missing_status, missing) = answers
    assert tfs_status == 200 and v2_status == 200
    np.testing.assert_allclose(np.asarray(tfs["predictions"], np.float32).reshape(want.shape), want,
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(v2_doc["outputs"][0]["data"], np.float32).reshape(want.shape), want,
                               rtol=1e-5, atol=1e-6)
    assert bad_status == 400 and "version" in bad["error"].lower()
    assert missing_status == 404 and "nope" in missing["error"]
    assert hops == ["dlrm", "dlrm", "nope"]  # the two on the model's pool; the unknown one has none: 404
