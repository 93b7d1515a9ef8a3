"""The native gRPC server's bridge, as fast logic (server/grpc/native_bridge.py): where services
register (:class:`HandlerSet`, what ``grpc.aio.Server`` offers the generated ``add_*_to_server``
functions) and the call context the Python handlers get (:class:`NativeContext`). (The server
itself: tests/e2e/test_grpc_native_server.py.)"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from server.grpc.native_bridge import HandlerSet, NativeContext, _Aborted, _Details


class FakeCall:
    """What the native server hands Python for one call (``_native_grpc.Call``)."""

    def __init__(self, deadline_remaining: float | None = None) -> None:
        self.id = 7
        self.method = "/svc/M"
        self.peer = "ipv4:127.0.0.1:5555"
        self.metadata = (("model-name", "m"), ("x-bin", b"\x00"))
        self.deadline_remaining = deadline_remaining
        self.finished = False
        self.writes: list = []

    def write(self, data, initial) -> bool:
        self.writes.append((data, initial))
        return True

    def auth_context(self) -> dict:
        return {"x509_common_name": [b"ops"]}


def test_services_register_as_generated_code_registers_them():
    from grpc_health.v1 import health, health_pb2_grpc

    handlers = HandlerSet()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), handlers)
    found = handlers.find(_Details("/grpc.health.v1.Health/Watch"))
    assert found is not None and found.unary_stream is not None
    assert handlers.find(_Details("/grpc.health.v1.Health/Nope")) is None


def test_registered_and_generic_handlers_are_found():
    handlers = HandlerSet()
    one = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
    two = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
    handlers.add_registered_method_handlers("a.B", {"C": one})
    handlers.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("d.E", {"F": two})])
    assert handlers.find(_Details("/a.B/C")) is one
    assert handlers.find(_Details("/d.E/F")) is two
    assert handlers.find(_Details("/d.E/G")) is None


def test_the_context_has_what_the_handlers_use():
    async def run() -> None:
        loop = asyncio.get_running_loop()
        ctx = NativeContext(FakeCall(deadline_remaining=5.0), loop)
        assert ctx.invocation_metadata()[0] == ("model-name", "m")
        assert 4.0 < ctx.time_remaining() <= 5.0
        assert ctx.peer() == "ipv4:127.0.0.1:5555"
        assert ctx.auth_context() == {"x509_common_name": [b"ops"]}
        ctx.set_trailing_metadata((("x-request-id", "r"),))
        await ctx.send_initial_metadata((("x-model-version", "3"),))
        assert ctx.trailing_metadata() == (("x-request-id", "r"),) and ctx.code() == grpc.StatusCode.OK
        with pytest.raises(_Aborted):
            await ctx.abort(grpc.StatusCode.NOT_FOUND, "no such thing")
        assert (ctx.code(), ctx.details()) == (grpc.StatusCode.NOT_FOUND, "no such thing")
        assert NativeContext(FakeCall(), loop).time_remaining() is None  # no deadline

    asyncio.run(run())


def test_a_streamed_message_waits_for_its_write_and_carries_the_initial_metadata_once():
    async def run() -> None:
        loop = asyncio.get_running_loop()
        call = FakeCall()
        ctx = NativeContext(call, loop)
        await ctx.send_initial_metadata((("k", "v"),))
        writing = loop.create_task(ctx.write(b"one"))
        await asyncio.sleep(0)
        assert not writing.done() and call.writes == [(b"one", (("k", "v"),))]
        ctx._wrote(True)  # the native server's WRITE_DONE event
        await writing
        loop.call_soon(ctx._wrote, True)
        await ctx.write(b"two")
        assert call.writes[1] == (b"two", None)

    asyncio.run(run())
