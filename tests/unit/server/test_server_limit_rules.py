"""Issue 16's server limits and admin exposure, as fast logic: the deployment keys and their
rules, the admin gate, the HTTP connection protocol over a fake transport, the gRPC options.
(Real sockets: tests/e2e/test_server_limits.py.)"""

from __future__ import annotations

import asyncio
import json

import pytest

from server.settings import DeploymentConfig, is_loopback
from processor.errors import ConfigError
from sp_checks import TOY_MODEL
from sp_checks import toy_deployment as deployment

# --- deployment keys ----------------------------------------------------------------------------

def test_safe_defaults():
    d = deployment()
    assert d.host == "127.0.0.1" and d.admin_token is None and not d.admin_allow_without_token
    assert (d.max_header_bytes, d.max_header_count) == (16384, 100)
    assert (d.header_read_timeout_seconds, d.body_read_timeout_seconds, d.keep_alive_timeout_seconds) == (10, 60, 30)
    assert (d.max_connections, d.grpc_max_concurrent_streams, d.grpc_max_concurrent_rpcs) == (1000, 256, 1000)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_admin_without_token_allowed_on_loopback(host):
    assert deployment(admin_allow_without_token=True, host=host).admin_allow_without_token
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "example.com"])
def test_admin_without_token_elsewhere_is_a_config_error_naming_the_key(host):
    with pytest.raises(ConfigError) as info:
        deployment(admin_allow_without_token=True, host=host)
    assert info.value.message.startswith("admin_allow_without_token:") and repr(host) in info.value.message
    assert not is_loopback(host)


def test_cli_host_override_is_checked_too(tmp_path, capsys):
    from server import __main__ as cli

    path = tmp_path / "d.json"
    path.write_text(json.dumps({"models": [{"name": "m", "model_config": TOY_MODEL}], "admin_allow_without_token": True}))
    assert cli.main(["--check", "--config", str(path)]) == 0
    capsys.readouterr()
    assert cli.main(["--check", "--config", str(path), "--host", "0.0.0.0"]) == 2
    assert "bad config: admin_allow_without_token:" in capsys.readouterr().err


@pytest.mark.parametrize("key, value", [("max_header_bytes", 100), ("max_header_count", 0),
                                        ("body_read_timeout_seconds", 0), ("header_read_timeout_seconds", -1),
                                        ("keep_alive_timeout_seconds", "x"), ("max_connections", 0),
                                        ("grpc_max_concurrent_streams", 0), ("grpc_max_concurrent_rpcs", 0),
                                        ("admin_allow_without_token", "yes")])
def test_bad_limit_names_the_key(key, value):
    with pytest.raises(ConfigError) as info:
        deployment(**{key: value})
    assert info.value.message.startswith(f"{key}:")


# --- admin gate ---------------------------------------------------------------------------------

def test_admin_gate():
    from server.http.admin import AdminGate

    off = AdminGate(None)
    status, message = off.check("Bearer anything", "anything")
    assert status == 403 and "disabled" in message and "admin_token_env" in message
    assert AdminGate(None, allow_without_token=True).check("") is None
    gate = AdminGate("s3cret-token")
    assert gate.check("")[0] == 401 and gate.check("Basic xyz")[0] == 401
    assert gate.check("Bearer wrong")[0] == 403 and gate.check("", "s3cret-tokenX")[0] == 403
    assert gate.check("Bearer s3cret-token") is None and gate.check("bearer  s3cret-token ") is None
    assert gate.check("", "s3cret-token") is None


def test_admin_token_compared_in_constant_time(monkeypatch):
    import hmac

    from server.http import admin as http_admin

    seen = []
    compare = hmac.compare_digest

    def spy(a, b):
        seen.append((len(a), len(b)))
        return compare(a, b)

    monkeypatch.setattr(http_admin.hmac, "compare_digest", spy)
    gate = http_admin.AdminGate("s3cret-token")
    assert gate.check("Bearer x")[0] == 403 and gate.check("Bearer s3cret-token") is None
    assert seen == [(32, 32), (32, 32)]  # digests: the token's length does not show either


# --- HTTP protocol over a fake transport --------------------------------------------------------

class FakeTransport:
    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = self.eof = False

    def get_extra_info(self, name, default=None):
        return {"sockname": ("127.0.0.1", 8080), "peername": ("127.0.0.1", 50000)}.get(name, default)

    def write(self, data) -> None:
        self.written += data

    def write_eof(self) -> None:
        self.eof = True

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_protocol(self, protocol) -> None:
        pass


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def connection(loop, **limits):
    """(protocol, transport, ASGI calls) for a deployment with ``limits``."""
    from uvicorn.config import Config
    from uvicorn.server import ServerState

    from server.http.protocol import limited_protocol

    calls = []

    async def app(scope, receive, send):
        calls.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    cls = limited_protocol(deployment(**limits))
    config = Config(app, http=cls, lifespan="off", log_config=None)
    config.load()
    proto = cls(config=config, server_state=ServerState(), app_state={}, _loop=loop)
    transport = FakeTransport()
    proto.connection_made(transport)
    return proto, transport, calls


def answer(transport) -> tuple[int, str]:
    head, _, body = bytes(transport.written).partition(b"\r\n\r\n")
    assert b"connection: close" in head
    return int(head.split(b" ", 2)[1]), json.loads(body)["error"]


def test_too_many_headers_refused_while_parsing(loop):
    proto, transport, calls = connection(loop, max_header_count=10)
    proto.data_received(b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(20_000)) + b"\r\n")
    status, error = answer(transport)
    assert status == 431 and "max_header_count" in error and transport.eof and not calls
    assert proto._header_count == 11  # stopped at the first field over the limit


def test_header_bytes_counted_across_chunks(loop):
    proto, transport, calls = connection(loop, max_header_bytes=2048)
    proto.data_received(b"GET / HTTP/1.1\r\nX-Big: ")
    for _ in range(3):
        proto.data_received(b"a" * 1000)  # one field that never ends: refused once over the limit
    status, error = answer(transport)
    assert status == 431 and "max_header_bytes" in error and not calls
    proto.data_received(b"a" * 100_000)  # lingering close: read and dropped
    assert not transport.closed and not calls


def test_headers_within_limits_reach_the_app(loop):
    proto, transport, calls = connection(loop, max_header_count=3, max_header_bytes=1024)
    proto.data_received(b"GET /x HTTP/1.1\r\nHost: a\r\nX-A: " + b"v" * 900 + b"\r\n\r\n")
    loop.run_until_complete(asyncio.sleep(0.01))
    assert calls == ["/x"] and bytes(transport.written).startswith(b"HTTP/1.1 200")


def test_body_that_stops_gets_408(loop):
    proto, transport, calls = connection(loop, body_read_timeout_seconds=0.05)

    async def reader(scope, receive, send):  # reads until the body ends or the client is gone
        while True:
            calls.append(await receive())
            if calls[-1]["type"] == "http.disconnect" or not calls[-1].get("more_body"):
                return

    proto.app = reader
    proto.data_received(b"POST /p HTTP/1.1\r\nContent-Length: 10\r\n\r\n12345")
    loop.run_until_complete(asyncio.sleep(0.02))
    assert calls[0]["more_body"] and transport.written == b""
    loop.run_until_complete(asyncio.sleep(0.1))
    status, error = answer(transport)
    assert status == 408 and "body_read_timeout_seconds" in error and proto.cycle.disconnected
    assert calls[-1] == {"type": "http.disconnect"}


def test_header_block_that_stops_gets_408(loop):
    proto, transport, calls = connection(loop, header_read_timeout_seconds=0.05)
    proto.data_received(b"GET / HTTP/1.1\r\nHost: ")
    loop.run_until_complete(asyncio.sleep(0.1))
    status, error = answer(transport)
    assert status == 408 and "header_read_timeout_seconds" in error and not calls


def test_silent_connection_closed_after_the_idle_timeout(loop):
    proto, transport, calls = connection(loop, keep_alive_timeout_seconds=0.05)
    loop.run_until_complete(asyncio.sleep(0.1))
    assert transport.closed and transport.written == b""


def test_connection_over_the_cap_gets_503(loop):
    proto, transport, calls = connection(loop, max_connections=1)
    proto.connections.add(object())  # one more connection already open
    proto2 = type(proto)(config=proto.config, server_state=proto.server_state, app_state={}, _loop=loop)
    transport2 = FakeTransport()
    proto2.connection_made(transport2)
    proto2.data_received(b"GET / HTTP/1.1\r\n\r\n")
    status, error = answer(transport2)
    assert status == 503 and "max_connections" in error and not calls


def test_grpc_options_carry_the_limits():
    from server.grpc.server import grpc_options

    options = dict(grpc_options(deployment(max_header_bytes=4096, max_connections=7, grpc_max_concurrent_streams=9)))
    assert options["grpc.max_metadata_size"] == options["grpc.absolute_max_metadata_size"] == 4096
    assert options["grpc.max_allowed_incoming_connections"] == 7
    assert options["grpc.max_concurrent_streams"] == 9


def test_example_config_spells_out_every_limit():
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "configs/server_limits.json"
    raw = json.loads(path.read_text())
    d = DeploymentConfig.from_file(path)
    assert d.host == "0.0.0.0" and d.admin_token_env == "SP_ADMIN_TOKEN" and not d.admin_allow_without_token
    for key in ("max_header_bytes", "max_header_count", "header_read_timeout_seconds", "body_read_timeout_seconds",
                "keep_alive_timeout_seconds", "max_connections", "grpc_max_concurrent_streams",
                "grpc_max_concurrent_rpcs"):
        assert getattr(d, key) == raw[key] == DeploymentConfig.model_fields[key].default, key
