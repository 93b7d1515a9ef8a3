"""The Python side of one bridged call of the native gRPC server (:mod:`server.grpc.native_server`):
where services register their handlers (:class:`HandlerSet`, what ``grpc.aio.Server`` offers
them) and the ``grpc.aio.ServicerContext`` the handlers and the interceptor get
(:class:`NativeContext`)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import grpc

_OK = grpc.StatusCode.OK


class HandlerSet:
    """What ``grpc.aio.Server`` offers the code that registers services (``add_generic_rpc_handlers``,
    ``add_registered_method_handlers``: the generated ``add_*_to_server`` functions), kept for
    the bridge to look a method's handler up in."""

    def __init__(self) -> None:
        self._generic: list[grpc.GenericRpcHandler] = []
        self._registered: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self._generic.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        for name, handler in handlers.items():
            self._registered[f"/{service}/{name}"] = handler

    def find(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = self._registered.get(details.method)
        if handler is not None:
            return handler
        for generic in self._generic:
            handler = generic.service(details)
            if handler is not None:
                return handler
        return None


class _Details(grpc.HandlerCallDetails):
    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata = ()


class _Aborted(Exception):
    """``context.abort``: the call ends with the status set on its context."""


class NativeContext:
    """The ``grpc.aio.ServicerContext`` of one bridged call: what the handlers and the interceptor
    use (metadata, deadline, status, initial and trailing metadata, peer, auth context, abort,
    write). Used on the server's event loop only."""

    __slots__ = ("call", "_deadline", "_code", "_details", "_initial", "_trailing", "_write_done", "_serializer",
                 "task", "_cancelled", "_loop")

    def __init__(self, call: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.call = call
        remaining = call.deadline_remaining
        self._deadline = None if remaining is None else loop.time() + remaining
        self._loop = loop
        self._code = _OK
        self._details = ""
        self._initial: Any = None
        self._trailing: Any = None
        self._write_done: asyncio.Future | None = None
        self._serializer = None
        self.task: asyncio.Task | None = None
        self._cancelled = False

    def invocation_metadata(self) -> tuple:
        return self.call.metadata

    def time_remaining(self) -> float | None:
        """Seconds left before the call's deadline; None when the client set none."""
        return None if self._deadline is None else max(0.0, self._deadline - self._loop.time())

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def set_details(self, details: str) -> None:
        self._details = details

    def details(self) -> str:
        return self._details

    def set_trailing_metadata(self, metadata) -> None:
        self._trailing = tuple(metadata)

    def trailing_metadata(self) -> tuple:
        return self._trailing or ()

    async def send_initial_metadata(self, metadata) -> None:
        """Sent with the answer's first message (or its status)."""
        self._initial = tuple(metadata)

    def peer(self) -> str:
        return self.call.peer

    def auth_context(self) -> dict[str, list[bytes]]:
        return self.call.auth_context()

    def cancelled(self) -> bool:
        return self._cancelled

    def done(self) -> bool:
        return self.call.finished

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata=()) -> None:
        if code == _OK:
            raise ValueError("abort() with an OK status")
        self._code, self._details = code, details
        if trailing_metadata:
            self._trailing = tuple(trailing_metadata)
        raise _Aborted()

    async def write(self, message) -> None:
        """One message of a server-streaming answer; returns once gRPC has sent it."""
        if self._cancelled:
            raise asyncio.CancelledError()
        data = self._serializer(message) if self._serializer is not None else message
        self._write_done = self._loop.create_future()
        if not self.call.write(data, self._initial):
            self._write_done = None
            return
        self._initial = None
        await self._write_done

    def _wrote(self, ok: bool) -> None:
        waiter, self._write_done = self._write_done, None
        if waiter is not None and not waiter.done():
            waiter.set_result(ok)

    def _cancel(self) -> None:
        self._cancelled = True
        if self.task is not None:
            self.task.cancel()
