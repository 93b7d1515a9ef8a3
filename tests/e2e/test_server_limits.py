"""Server limits and admin exposure over real sockets (issue 16).

Real uvicorn and gRPC servers on 127.0.0.1 (``ServingApp`` in a thread) over a fake model
(``tests/fakes.py``): oversized header blocks get 431, a body or header block that stops
arriving gets 408 within the configured timeout, connections beyond the cap get 503 (gRPC: not
accepted), oversized gRPC metadata is refused; after each, the next good request works. A 405
carries ``Allow``; the OpenAPI document lists the error responses. The admin endpoints are off
without a token, need the token when one is set, are open without one only when explicitly
allowed on loopback, and every call is logged with the caller's address. An empty gRPC
``Predict`` answers the DeepRec ping as the HTTP empty body and the C ABI do.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import socket
import threading
import time

import grpc
import pytest

from fakes import ANSWER, SIGNATURE, FakeManager, fake_models, fake_processor
from server.settings import DeploymentConfig

TOKEN = "limits-test-token"
TIMEOUT = 1.0  # header and body read timeouts of the limits server


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def serving(**top):
    """A ServingApp over one fake model ``m`` on free 127.0.0.1 ports; yields (app, log lines)."""
    from server.app import ServingApp

    deployment = DeploymentConfig.from_dict({
        "models": [{"name": "m", "model_config": {"savedmodel_dir": "/nonexistent"}}],
        "host": "127.0.0.1", "http_port": 0, "grpc_port": 0, "access_log": False, **top})
    records = Records()
    logger = logging.getLogger("server")
    old_level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(records)
    app = ServingApp(deployment, models=fake_models(deployment, {"m": FakeManager("m")}),
                     announce=lambda line: None)
    thread = threading.Thread(target=app.run, daemon=True)
    thread.start()
    assert app.started.wait(30), "server did not start"
    try:
        yield app, records.lines
    finally:
        app.request_stop()
        thread.join(30)
        logger.removeHandler(records)
        logger.setLevel(old_level)


@pytest.fixture(scope="module")
def limits():
    with serving(admin_token=TOKEN, max_header_bytes=16384, max_header_count=50,
                 header_read_timeout_seconds=TIMEOUT, body_read_timeout_seconds=TIMEOUT,
                 keep_alive_timeout_seconds=5) as served:
        yield served


def request(app, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    """(status, headers, body, client address 'host:port')."""
    conn = http.client.HTTPConnection("127.0.0.1", app.http_port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        client = "%s:%d" % conn.sock.getsockname()
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read(), client
    finally:
        conn.close()


def works(app) -> None:
    """The next good request still works."""
    status, _, body, _ = request(app, "POST", "/api/predict/m", b"\x0a\x01x")
    assert (status, body) == (200, ANSWER)


def raw_exchange(app, data: bytes, wait: float = 10.0) -> tuple[bytes, bool]:
    """Send ``data`` on a fresh connection, read until the server closes; (answer, whether the
    server closed the connection: False when ``wait`` seconds passed without a byte). ``wait`` is
    a hang detector, 10x the server's read timeouts (TIMEOUT), not a timing assert."""
    with socket.create_connection(("127.0.0.1", app.http_port), timeout=wait) as sock:
        with contextlib.suppress(OSError):  # the server may stop reading once it refused
            sock.sendall(data)
        chunks = []
        closed = False
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
            closed = True
        except TimeoutError:
            pass
        except OSError:  # reset: closed by the server too
            closed = True
    return b"".join(chunks), closed


def status_and_error(answer: bytes) -> tuple[int, str]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)["error"]


# --- headers ------------------------------------------------------------------------------------

def test_one_megabyte_header_is_431_quickly(limits):
    app, _ = limits
    answer, closed = raw_exchange(app, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20)
                                  + b"\r\n\r\n")
    status, error = status_and_error(answer)
    # quickly: refused while parsing (431), not after the header read timeout (that is a 408)
    assert status == 431 and "max_header_bytes" in error and closed, answer[:200]
    works(app)


def test_twenty_thousand_headers_are_431_quickly(limits):
    app, _ = limits
    headers = b"".join(b"X-H%d: v\r\n" % i for i in range(20_000))
    answer, closed = raw_exchange(app, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
    status, error = status_and_error(answer)
    # quickly: refused while parsing (431), not after the header read timeout (that is a 408)
    assert status == 431 and "max_header_count" in error and closed, answer[:200]
    works(app)


def test_headers_within_limits_are_served(limits):
    app, _ = limits
    headers = {f"X-H{i}": "v" * 100 for i in range(40)}
    status, _, body, _ = request(app, "GET", "/healthz", headers=headers)
    assert status == 200, body


def test_header_block_that_stops_is_408(limits):
    app, _ = limits
    answer, closed = raw_exchange(app, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    status, error = status_and_error(answer)
    assert status == 408 and "header_read_timeout_seconds" in error and closed, answer
    works(app)


# --- body ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("method, path", [("POST", "/api/predict/m"), ("POST", "/v1/models/m:predict"),
                                          ("PUT", "/admin/models/m/pin")])
def test_body_shorter_than_declared_is_408_within_the_timeout(limits, method, path):
    app, _ = limits
    head = (f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n"
            f"Authorization: Bearer {TOKEN}\r\n\r\n").encode()
    answer, closed = raw_exchange(app, head + b"12345")
    status, error = status_and_error(answer)
    assert status == 408 and "body_read_timeout_seconds" in error and closed, answer
    works(app)


def test_idle_connection_is_closed_after_the_keep_alive_timeout():
    with serving(keep_alive_timeout_seconds=0.5) as (app, _):
        answer, closed = raw_exchange(app, b"", wait=5.0)  # 10x the keep-alive timeout
        assert answer == b"" and closed, "the server did not close the idle connection"
        works(app)


# --- connections --------------------------------------------------------------------------------

def test_connections_beyond_the_cap_get_503_then_serve_again():
    with serving(max_connections=3) as (app, _):
        held = [socket.create_connection(("127.0.0.1", app.http_port), timeout=10) for _ in range(3)]
        try:
            time.sleep(0.2)  # let the server accept them
            answer, _ = raw_exchange(app, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            status, error = status_and_error(answer)
            assert status == 503 and "max_connections" in error, answer
        finally:
            for sock in held:
                sock.close()
        deadline = time.monotonic() + 5
        while True:
            status = request(app, "GET", "/healthz")[0]
            if status == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert status == 200


def _grpc_ping(port: int, timeout: float = 3.0) -> bytes:
    # a channel of its own (no subchannel shared with the other channels of this process)
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
        return ch.unary_unary("/tensorflow.eas.ProcessorService/Predict")(b"", timeout=timeout)


def test_grpc_connections_beyond_the_cap_are_refused():
    with serving(max_connections=2) as (app, _):
        assert app.grpc_server == "python"  # the server that enforces a cap ("auto" with max_connections)
        opened = []
        try:
            for _ in range(2):
                ch = grpc.insecure_channel(f"127.0.0.1:{app.grpc_port}",
                                           options=[("grpc.use_local_subchannel_pool", 1)])
                ch.unary_unary("/tensorflow.eas.ProcessorService/Predict")(b"", timeout=5)
                opened.append(ch)
            with pytest.raises(grpc.RpcError) as info:
                _grpc_ping(app.grpc_port, timeout=2)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value  # the connection is closed
        finally:
            for ch in opened:
                ch.close()
        deadline = time.monotonic() + 10
        while True:
            try:
                assert json.loads(_grpc_ping(app.grpc_port)) == SIGNATURE
                break
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


def test_grpc_metadata_over_the_limit_is_refused(limits):
    app, _ = limits
    with grpc.insecure_channel(f"127.0.0.1:{app.grpc_port}") as ch:
        call = ch.unary_unary("/tensorflow.eas.ProcessorService/Predict")
        with pytest.raises(grpc.RpcError) as info:
            call(b"\x0a\x01x", metadata=[("x-big", "a" * 32768)], timeout=5)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, info.value
        assert "metadata size" in info.value.details()
        assert call(b"\x0a\x01x", metadata=[("x-small", "a" * 1000)], timeout=5) == ANSWER


# --- contract -----------------------------------------------------------------------------------

def test_405_has_allow(limits):
    app, _ = limits
    for method, path, allowed in [("DELETE", "/api/predict/m", {"POST"}),
                                  ("GET", "/admin/models/m/pin", {"PUT", "DELETE"}),
                                  ("POST", "/healthz", {"GET"})]:
        status, headers, body, _ = request(app, method, path)
        assert status == 405, (method, path, body)
        assert set(headers["allow"].split(", ")) - {"HEAD"} == allowed, headers
        assert method in json.loads(body)["error"]


def test_openapi_lists_the_error_responses(limits):
    app, _ = limits
    status, _, body, _ = request(app, "GET", "/openapi.json")
    doc = json.loads(body)
    paths = doc["paths"]
    assert status == 200 and not [op for item in paths.values() for op in item.values()
                                  if "422" in op["responses"]]  # our validation errors are 400

    def codes(path, method):
        return set(paths[path][method]["responses"])

    assert {"400", "404", "413", "503"} <= codes("/api/predict/{model}", "post")
    assert {"400", "404", "413", "503"} <= codes("/v1/models/{path}", "post")
    assert {"400", "404"} <= codes("/v1/models/{path}", "get")
    assert {"404", "503"} <= codes("/api/models/{model}", "get")
    for path, method in [("/admin/models/{model}/reload", "post"), ("/admin/models/{model}/pin", "put"),
                         ("/admin/models/{model}/pin", "delete"), ("/admin/models/{model}/rollback", "post")]:
        assert {"400", "401", "403", "404", "503"} <= codes(path, method), (path, method)
    error = paths["/api/predict/{model}"]["post"]["responses"]["404"]["content"]["application/json"]["schema"]
    assert error == {"$ref": "#/components/schemas/ErrorBody"}
    assert doc["components"]["schemas"]["ErrorBody"]["required"] == ["error"]


def test_empty_grpc_predict_is_the_ping_as_on_http_and_the_c_abi(limits):
    from processor import abi

    app, _ = limits
    status, headers, http_body, _ = request(app, "POST", "/api/predict/m", b"")
    assert status == 200 and json.loads(http_body) == SIGNATURE
    with grpc.insecure_channel(f"127.0.0.1:{app.grpc_port}") as ch:
        call = ch.unary_unary("/tensorflow.eas.ProcessorService/Predict")
        grpc_body, info = call.with_call(b"", timeout=5)  # one model: no model-name needed
        assert ("x-response-format", "signature-json") in tuple(info.trailing_metadata())
        assert call(b"", metadata=[("model-name", "m")], timeout=5) == grpc_body
        with pytest.raises(grpc.RpcError) as err:
            call(b"", metadata=[("model-name", "nope")], timeout=5)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
    handle = fake_processor("m", FakeManager("m"))
    assert abi.process(handle, b"") == (200, http_body) and grpc_body == http_body


# --- admin --------------------------------------------------------------------------------------

def test_admin_off_without_a_token_by_default():
    with serving() as (app, lines):
        for method, path in [("POST", "/admin/models/m/reload"), ("POST", "/admin/models/m/rollback"),
                             ("DELETE", "/admin/models/m/pin")]:
            status, _, body, client = request(app, method, path, headers={"Authorization": "Bearer guess"})
            error = json.loads(body)["error"]
            assert status == 403 and "disabled" in error and "admin_token_env" in error, body
        status, _, _, client = request(app, "PUT", "/admin/models/m/pin", b'{"version": 1}',
                                       {"Content-Type": "application/json"})
        assert status == 403 and app.runtime.model("m").manager.actions == []
        assert any("refused" in line and client in line for line in lines), lines


def test_admin_with_a_token_and_the_callers_address_in_the_log(limits):
    app, lines = limits
    assert request(app, "POST", "/admin/models/m/reload")[0] == 401
    assert request(app, "POST", "/admin/models/m/reload", headers={"Authorization": "Bearer wrong"})[0] == 403
    assert request(app, "POST", "/admin/models/m/reload", headers={"X-Admin-Token": TOKEN + "x"})[0] == 403
    status, _, body, client = request(app, "POST", "/admin/models/m/reload",
                                      headers={"Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and json.loads(body)["action"] == "reload", body
    assert any(f"admin reload of m by {client} done" in line for line in lines), lines
    status, _, body, client = request(app, "PUT", "/admin/models/m/pin", b'{"version": 3}',
                                      {"X-Admin-Token": TOKEN, "Content-Type": "application/json"})
    assert status == 200 and any(f"admin pin of m by {client}" in line for line in lines)
    assert app.runtime.model("m").manager.actions[-2:] == ["reload", "pin 3"]


def test_admin_without_a_token_when_allowed_on_loopback():
    with serving(admin_allow_without_token=True) as (app, lines):
        status, _, body, client = request(app, "DELETE", "/admin/models/m/pin")
        assert status == 200 and json.loads(body)["action"] == "unpin", body
        assert any(f"admin unpin of m by {client}" in line for line in lines)
