"""The HTTP connection's own answer to small requests on the native engine (issue 23).

A real ServingApp (uvicorn + our protocol, in a thread) serves the DLRM-like ``.onnx`` model on
the native ONNX Runtime engine. Small ``POST /api/predict/{model}`` requests are answered by the
connection itself (``LimitedHttpProtocol``'s lean path) once the model has run a request in
place; everything else takes the ASGI path. Over raw sockets: the lean answers equal the ASGI
path's (a chunked body, which the lean path never takes), byte for byte in the body; keep-alive,
pipelining, HTTP/1.0 and ``Connection: close``, request ids, the ping, a bad body's 400, a body
that stops arriving (408), and the metrics count every request.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time

import pytest

from processor.codec import decode_response, encode_request
from processor.deployment import DeploymentConfig

MODEL = "dlrm"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from demo import dlrm_onnx
    from server.app import ServingApp

    model_dir = tmp_path_factory.mktemp("lean") / "dlrm"
    dlrm_onnx.build(model_dir / "model.onnx", rows=500, dim=8)
    deployment = DeploymentConfig.from_dict({
        "models": [{"name": MODEL, "model_config": {
            "savedmodel_dir": str(model_dir), "backend": "onnxruntime", "session_num": 2,
            "use_per_session_threads": True, "intra_op_parallelism_threads": 1}}],
        "host": "127.0.0.1", "http_port": 0, "grpc_port": None, "access_log": False,
        "body_read_timeout_seconds": 1.0})
    app = ServingApp(deployment, announce=lambda line: None)
    thread = threading.Thread(target=app.run, daemon=True)
    thread.start()
    assert app.started.wait(60), "server did not start"
    app.runtime.wait_models(120)
    assert app.runtime.ready
    yield app
    app.request_stop()
    thread.join(30)


def request(body: bytes, *, path: str = f"/api/predict/{MODEL}", extra: str = "", version: str = "1.1") -> bytes:
    return (f"POST {path} HTTP/{version}\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n").encode() + body


def chunked(body: bytes) -> bytes:
    return (f"POST /api/predict/{MODEL} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            f"{len(body):x}\r\n").encode() + body + b"\r\n0\r\n\r\n"


def read_response(f) -> tuple[int, dict[str, str], bytes]:
    status = int(f.readline().split()[1])
    headers = {}
    while True:
        line = f.readline().decode("latin-1").rstrip("\r\n")
        if not line:
            break
        key, value = line.split(":", 1)
        headers[key.strip().lower()] = value.strip()
    return status, headers, f.read(int(headers["content-length"]))


def connect(app) -> socket.socket:
    return socket.create_connection(("127.0.0.1", app.http_port), timeout=10)


def exchange(app, *payloads: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """Send ``payloads`` on one connection, one after another's answer."""
    with connect(app) as sock, sock.makefile("rb") as f:
        out = []
        for payload in payloads:
            sock.sendall(payload)
            out.append(read_response(f))
        return out


def requests_served(app) -> float:
    text = app.runtime.metrics.render().decode()
    m = re.search(r'sp_requests_total\{api="predict",code="OK",model="dlrm",protocol="http",[^}]*\} ([0-9.e+]+)', text)
    return float(m.group(1)) if m else 0.0


def test_lean_answers_equal_the_asgi_path_and_keep_the_connection(server):
    from demo import dlrm_onnx

    body = encode_request(dlrm_onnx.inputs(3, seed=4))
    (status, _, reference), = exchange(server, chunked(body))  # never the lean path
    assert status == 200
    before = requests_served(server)
    answers = exchange(server, request(body), request(body, extra="X-Request-ID: lean-abc\r\n"), request(body))
    assert server.runtime.dataplane.inline_hint(MODEL)
    for status, headers, data in answers:
        assert status == 200 and headers["content-type"] == "application/x-protobuf"
        assert "date" in headers and "connection" not in headers
        assert data == reference  # one process, one computation: the same bytes
    assert answers[1][1]["x-request-id"] == "lean-abc"
    assert re.fullmatch(r"[0-9a-f]{16}", answers[0][1]["x-request-id"])
    assert decode_response(reference)["prob"].shape == (3, 1)
    assert requests_served(server) == before + 3


def test_pipelined_requests_are_answered_in_order(server):
    from demo import dlrm_onnx

    bodies = [encode_request(dlrm_onnx.inputs(1, seed=s)) for s in (1, 2, 3)]
    want = [exchange(server, chunked(b))[0][2] for b in bodies]
    with connect(server) as sock, sock.makefile("rb") as f:
        sock.sendall(b"".join(request(b) for b in bodies))  # one write: three requests
        got = [read_response(f) for _ in bodies]
    assert [g[0] for g in got] == [200, 200, 200]
    assert [g[2] for g in got] == want


@pytest.mark.parametrize("how", ["http/1.0", "connection: close"])
def test_a_connection_that_ends_after_its_answer_is_closed(server, how):
    from demo import dlrm_onnx

    body = encode_request(dlrm_onnx.inputs(1))
    exchange(server, request(body))  # the model runs in place: the lean path is open
    payload = request(body, version="1.0") if how == "http/1.0" else request(body, extra="Connection: close\r\n")
    with connect(server) as sock, sock.makefile("rb") as f:
        sock.sendall(payload)
        status, headers, _ = read_response(f)
        assert status == 200 and headers.get("connection") == "close"
        assert f.read() == b""  # closed by the server


def test_ping_bad_body_and_slow_body(server):
    from demo import dlrm_onnx

    good = encode_request(dlrm_onnx.inputs(1))
    ping, bad, after = exchange(server, request(good), request(b""), request(b"\xff\x00garbage"), request(good))[1:]
    assert ping[0] == 200 and ping[1]["content-type"] == "application/json"
    assert json.loads(ping[2])["signature_name"] == "serving_default"
    assert bad[0] == 400 and "PredictRequest" in json.loads(bad[2])["error"]
    assert after[0] == 200

    with connect(server) as sock, sock.makefile("rb") as f:  # the body in two parts, a pause between
        payload = request(good)
        sock.sendall(payload[:-5])
        time.sleep(0.2)
        sock.sendall(payload[-5:])
        assert read_response(f)[0] == 200
        sock.sendall(payload[:-5])  # the rest never comes: 408 after body_read_timeout_seconds
        status, headers, data = read_response(f)
        assert status == 408 and "body_read_timeout_seconds" in json.loads(data)["error"]
