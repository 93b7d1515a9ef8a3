"""The HTTP connection's own answer to small requests on the native engine (issue 23).

A real ServingApp (uvicorn + our protocol, in a thread) serves the DLRM-like ``.onnx`` model on
the native ONNX Runtime engine. Small ``POST /api/predict/{model}`` requests are answered by the
connection itself (``LimitedHttpProtocol``'s lean path) once the model has run a request in
place; everything else takes the ASGI path. Over raw sockets: the lean answers equal the ASGI
path's (a chunked body, which the lean path never takes), byte for byte in the body; keep-alive,
pipelining, HTTP/1.0 and ``Connection: close``, request ids, the ping, a bad body's 400, a body
that stops arriving (408), and the metrics count every request. A large request of our wire
format takes it too (run on the model's pool), and a drain lets a lean request whose body is
still arriving finish. Small TF Serving REST and KServe v2 REST requests take it too, answered
as their ASGI routes answer (errors included); a compressed or large v2 body keeps the ASGI path.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time

import pytest

from processor.codec import decode_response, encode_request
from server.settings import DeploymentConfig

MODEL = "dlrm"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from demo import dlrm_onnx

    directory = tmp_path_factory.mktemp("lean") / "dlrm"
    dlrm_onnx.build(directory / "model.onnx", rows=500, dim=8)
    return directory


def start(model_dir, **keys):
    """(a ServingApp of the model, its thread), started and ready."""
    from server.app import ServingApp

    deployment = DeploymentConfig.from_dict({
        "models": [{"name": MODEL, "model_config": {
            "savedmodel_dir": str(model_dir), "backend": "onnxruntime", "session_num": 2,
            "use_per_session_threads": True, "intra_op_parallelism_threads": 1}}],
        "host": "127.0.0.1", "http_port": 0, "grpc_port": None, "access_log": False,
        "body_read_timeout_seconds": 1.0, **keys})
    app = ServingApp(deployment, announce=lambda line: None)
    thread = threading.Thread(target=app.run, daemon=True)
    thread.start()
    assert app.started.wait(60), "server did not start"
    app.runtime.wait_models(120)
    assert app.runtime.ready
    return app, thread


@pytest.fixture(scope="module")
def server(model_dir):
    app, thread = start(model_dir)
    yield app
    app.request_stop()
    thread.join(30)


def request(body: bytes, *, path: str = f"/api/predict/{MODEL}", extra: str = "", version: str = "1.1") -> bytes:
    return (f"POST {path} HTTP/{version}\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n").encode() + body


def chunked(body: bytes, path: str = f"/api/predict/{MODEL}", extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n{extra}\r\n"
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


def spy_lean(server, monkeypatch) -> list[str]:
    """The APIs of the requests the lean path answers from now on (``now_tracked`` spied on)."""
    taken: list[str] = []
    inline = server._asgi.predict
    real = inline.now_tracked
    monkeypatch.setattr(inline, "now_tracked", lambda model, api, work: taken.append(api) or real(model, api, work))
    return taken


def test_lean_answers_equal_the_asgi_path_and_keep_the_connection(server, monkeypatch):
    from demo import dlrm_onnx

    body = encode_request(dlrm_onnx.inputs(3, seed=4))
    (status, _, reference), = exchange(server, chunked(body))  # never the lean path
    assert status == 200
    before = requests_served(server)
    taken = spy_lean(server, monkeypatch)
    answers = exchange(server, request(body), request(body, extra="X-Request-ID: lean-abc\r\n"), request(body))
    assert server.runtime.runs_here(MODEL, len(body), True)  # the plan: in place, on the loop
    assert taken == ["predict"] * 3
    for status, headers, data in answers:
        assert status == 200 and headers["content-type"] == "application/x-protobuf"
        assert "date" in headers and "connection" not in headers
        assert data == reference  # one process, one computation: the same bytes
    assert answers[1][1]["x-request-id"] == "lean-abc"
    assert re.fullmatch(r"[0-9a-f]{16}", answers[0][1]["x-request-id"])
    assert decode_response(reference)["prob"].shape == (3, 1)
    assert requests_served(server) == before + 3


def test_a_large_request_takes_the_lean_path_on_the_models_pool(server, monkeypatch):
    from demo import dlrm_onnx

    body = encode_request(dlrm_onnx.inputs(300, seed=5))
    assert len(body) > server.deployment.inline_max_request_bytes
    (status, _, reference), = exchange(server, chunked(body))  # the ASGI path
    assert status == 200
    inline, later = spy_lean(server, monkeypatch), []
    from server.eas.rest_routes import EasPredict

    real = EasPredict.later
    monkeypatch.setattr(EasPredict, "later", lambda self, *a: later.append(len(a[1])) or real(self, *a))
    answers = exchange(server, request(body), request(encode_request(dlrm_onnx.inputs(1))), request(body))
    assert [a[0] for a in answers] == [200, 200, 200]
    assert answers[0][2] == answers[2][2] == reference
    assert later == [len(body), len(body)] and inline == ["predict"]  # the small one ran in place


def test_a_drain_answers_a_lean_request_whose_body_is_still_arriving(model_dir):
    from demo import dlrm_onnx

    app, thread = start(model_dir, drain_timeout_seconds=5)
    try:
        payload = request(encode_request(dlrm_onnx.inputs(300, seed=6)))
        with connect(app) as sock, sock.makefile("rb") as f:
            sock.sendall(payload[:-100])
            time.sleep(0.2)  # headers and most of the body in: a lean request under way
            app.request_stop()
            time.sleep(0.3)
            sock.sendall(payload[-100:])
            status, headers, data = read_response(f)
            assert status == 503 and "shutting down" in json.loads(data)["error"]  # the drain's answer
            assert headers.get("connection") == "close" and f.read() == b""
    finally:
        app.request_stop()
        thread.join(30)
    assert not thread.is_alive()


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


def other_edges() -> dict[str, tuple[str, bytes, str]]:
    """TF Serving REST and KServe v2 REST requests for the model: (path, body, extra headers)."""
    from benchmarks.v2_wire import v2_binary_request, v2_json_request
    from demo import dlrm_onnx

    feeds = dlrm_onnx.inputs(2, seed=7)
    rows = [{k: v[i].tolist() for k, v in feeds.items()} for i in range(2)]
    binary, header_length = v2_binary_request(feeds)
    return {
        "tfs": (f"/v1/models/{MODEL}:predict", json.dumps({"instances": rows}).encode(), ""),
        "tfs-columns": (f"/v1/models/{MODEL}:predict",
                        json.dumps({"inputs": {k: v.tolist() for k, v in feeds.items()}}).encode(), ""),
        "v2-binary": (f"/v2/models/{MODEL}/infer", binary, f"Inference-Header-Content-Length: {header_length}\r\n"),
        "v2-json": (f"/v2/models/{MODEL}/infer", v2_json_request(feeds), ""),
        "v2-version-unknown": (f"/v2/models/{MODEL}/versions/3/infer", v2_json_request(feeds), ""),
        "tfs-bad": (f"/v1/models/{MODEL}:predict", b'{"instances": [{"nope": 1}]}', ""),
        "v2-bad": (f"/v2/models/{MODEL}/infer", b'{"inputs": 3}', ""),
        "tfs-version-unknown": (f"/v1/models/{MODEL}/versions/99:predict", json.dumps({"instances": rows}).encode(), ""),
    }


@pytest.mark.parametrize("edge", list(other_edges()))
def test_tf_serving_and_kserve_v2_rest_take_the_lean_path_with_the_asgi_answers(server, edge, monkeypatch):
    """Small TF Serving REST and KServe v2 REST requests for a model that runs in place are
    answered by the connection itself (through ``now_tracked``, spied on here), with the ASGI
    path's status, headers that matter and body, errors too."""
    path, body, extra = other_edges()[edge]
    (want_status, want_headers, want), = exchange(server, chunked(body, path, extra))  # the ASGI path
    taken = spy_lean(server, monkeypatch)
    (status, headers, got), = exchange(server, request(body, path=path, extra=extra))
    assert taken == (["tfs_predict"] if edge.startswith("tfs") else ["v2_infer"]), "not the lean path"
    assert status == want_status
    for key in ("content-type", "inference-header-content-length"):
        assert headers.get(key) == want_headers.get(key), key
    assert got == want, (got[:200], want[:200])
    assert (status == 200) == ("bad" not in edge and "unknown" not in edge)


def test_compressed_and_large_v2_bodies_keep_the_asgi_path(server, monkeypatch):
    import gzip

    path, body, extra = other_edges()["v2-json"]
    taken = spy_lean(server, monkeypatch)
    (status, _, data), = exchange(server, request(gzip.compress(body), path=path, extra="Content-Encoding: gzip\r\n"))
    assert status == 200 and json.loads(data)["outputs"][0]["name"] == "prob"
    big = json.dumps({**json.loads(body), "id": "x" * 9000}).encode()  # over inline_max_request_bytes
    (status, _, data), = exchange(server, request(big, path=path))
    assert status == 200 and json.loads(data)["id"] == "x" * 9000
    assert taken == []
