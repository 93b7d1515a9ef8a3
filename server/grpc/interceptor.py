"""The one place every gRPC call of ours goes through: request id, parsing, tracking, errors.

:class:`EdgeInterceptor` (a ``grpc.aio.ServerInterceptor``) wraps each method the server
registers with a :class:`Method` (ours, TF Serving's, KServe v2's) once, on its first call, and
then for every call:

* the request id: the ``x-request-id`` metadata when it is sane, else a new one
  (:func:`server.logs.new_request_id`), set for the call's logs and echoed in the trailing
  metadata;
* the request bytes parsed here, not by grpcio: grpcio's ``request_deserializer`` runs before
  any handler, so bytes that are not the method's message would end as INTERNAL ("Exception
  deserializing request!") with a traceback in the log, neither counted nor access-logged; here
  they are INVALID_ARGUMENT, counted and logged like any bad request;
* the call tracked (``ServingRuntime.track``: drain gate, in-flight gauge, metrics, access log)
  under the model the :class:`Method` names;
* any error mapped once (:func:`fail`: ``STATUS_TABLE``'s status and the message);
* with tracing on (server/otel.py), the ``traceparent`` / ``tracestate`` metadata read for the
  call's edge span, and a traced call's ``traceparent`` sent back in the trailing metadata.

Handlers under it are ``async def handler(request, context)`` that return the response message
or raise; where a method's model work runs is theirs to say, through ``ServingRuntime.dispatch``
(the one concurrency rule of every edge), which decides by the request's size as it came
(:data:`request_bytes`). Thread-safe: one event loop runs every call.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from processor.echo import shorten
from processor.errors import InvalidArgument, edge_error

from ..logs import new_request_id, request_id_var
from ..otel import edge_trace
from ..runtime import ServingRuntime

log = logging.getLogger("server.grpc")

MAX_MESSAGE = 4096  # characters of an error message sent (a client's metadata limit is 8-16 KiB)
Handler = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]

# The call's request message size in bytes, as it came, for its handler (``request.ByteSize()``
# would size the parsed message again: a pass over every field of a large request).
request_bytes: contextvars.ContextVar[int] = contextvars.ContextVar("grpc_request_bytes", default=0)


def fail(context: grpc.aio.ServicerContext, exc: BaseException) -> None:
    """The one mapping of an error to gRPC: STATUS_TABLE's status name and the message, set on
    ``context``; the handler then returns None (grpcio sends no message with a non-OK status).

    Not ``context.abort``: the ``AbortError`` it raises carries a traceback through the
    handler's frame, and grpcio's handling of it closes a reference cycle, so each refused
    call's request bytes stayed in memory until a full garbage collection."""
    err = edge_error(exc, "grpc", log)
    message = err.message  # it travels in the trailing metadata: never past a client's limit
    if len(message) > MAX_MESSAGE:
        message = f"{message[:MAX_MESSAGE]}... ({len(message)} characters)"
    context.set_code(grpc.StatusCode[err.edge.grpc])
    context.set_details(message)


# The request metadata that picks the arm of a model's traffic split for a call naming no
# version (:mod:`processor.routing`), as HTTP's ``X-Routing-Key`` header does.
ROUTING_KEY = ("x-routing-key",)


def metadata(context: grpc.aio.ServicerContext, keys: tuple[str, ...]) -> str | None:
    """The first value of any of ``keys`` in the call's metadata, or None."""
    for key, value in context.invocation_metadata() or ():
        if key in keys:
            return _text(value)
    return None


def metadata_values(context: grpc.aio.ServicerContext, slots: dict[str, int], count: int) -> list[str | None]:
    """Several metadata values in one scan of the call's metadata: ``count`` slots, each the
    first value of a key ``slots`` maps to that slot's index (None: not sent)."""
    found: list[str | None] = [None] * count
    for key, value in context.invocation_metadata() or ():
        slot = slots.get(key)
        if slot is not None and found[slot] is None:
            found[slot] = _text(value)
    return found


def _text(value: str | bytes) -> str:
    """A metadata value as text (a ``-bin`` key's bytes as Latin-1)."""
    return value if isinstance(value, str) else value.decode("latin-1")


def _no_model(request: Any, context: grpc.aio.ServicerContext) -> str:
    return ""


@dataclass(frozen=True)
class Method:
    """How the interceptor treats one unary method's calls. ``api``: the metrics and access-log
    name; ``request_type``: the message the request bytes are parsed into (None: the handler
    gets the bytes); ``response_type``: the message the handler returns (None: bytes);
    ``model``: the model a call is counted under, from its request and metadata;
    ``tracked``: False for calls about the server itself (liveness), which are neither counted
    nor access-logged (their errors are still mapped)."""

    api: str
    request_type: Any = None
    response_type: Any = None
    model: Callable[[Any, grpc.aio.ServicerContext], str] = _no_model
    tracked: bool = True

    def parse(self, data: bytes) -> tuple[Any, InvalidArgument | None]:
        """(the request, None), or (None, the InvalidArgument that answers bytes that are not
        the method's message)."""
        if self.request_type is None:
            return data, None
        try:
            return self.request_type.FromString(data), None
        except (DecodeError, ValueError, RecursionError) as exc:
            return None, InvalidArgument(
                f"the request is not a serialized {self.request_type.DESCRIPTOR.full_name} "
                f"({len(data)} bytes): {shorten(str(exc), 120)}")


class Service:
    """One gRPC service of ours: its methods' handlers and :class:`Method` entries, registered
    with grpcio as bytes-in handlers (:meth:`generic_handler`), their behaviour the
    interceptor's (:meth:`methods`)."""

    def __init__(self, name: str, methods: dict[str, tuple[Handler, Method]]) -> None:
        self.name = name
        self._methods = methods

    def generic_handler(self) -> grpc.GenericRpcHandler:
        handlers = {}
        for name, (handler, method) in self._methods.items():
            serialize = method.response_type.SerializeToString if method.response_type is not None else None
            # no request deserializer: the interceptor parses (see the module doc)
            handlers[name] = grpc.unary_unary_rpc_method_handler(handler, response_serializer=serialize)
        return grpc.method_handlers_generic_handler(self.name, handlers)

    def methods(self) -> dict[str, Method]:
        """Per full method path (``/service/Method``), its :class:`Method`."""
        return {f"/{self.name}/{name}": method for name, (_, method) in self._methods.items()}


class EdgeInterceptor(grpc.aio.ServerInterceptor):
    """See the module doc. ``methods``: per full method path, its :class:`Method`; any other
    method (the standard health service) passes through untouched."""

    def __init__(self, rt: ServingRuntime, methods: dict[str, Method]) -> None:
        self.rt = rt
        self._methods = methods
        self._wrapped: dict[str, grpc.RpcMethodHandler] = {}  # built once per method

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> Any:
        wrapped = self._wrapped.get(details.method)
        if wrapped is not None:
            return wrapped
        handler = await continuation(details)
        method = self._methods.get(details.method)
        if handler is None or method is None or handler.unary_unary is None:
            return handler
        wrapped = grpc.unary_unary_rpc_method_handler(self._wrap(details.method, method, handler.unary_unary),
                                                      response_serializer=handler.response_serializer)
        self._wrapped[details.method] = wrapped
        return wrapped

    def _wrap(self, name: str, method: Method, handler: Handler) -> Handler:
        """``handler`` of the method at path ``name``, as the module doc says."""
        rt = self.rt

        async def call(data: bytes, context: grpc.aio.ServicerContext) -> Any:
            rid = new_request_id(metadata(context, ("x-request-id",)))
            token, size_token = request_id_var.set(rid), request_bytes.set(len(data))
            context.set_trailing_metadata((("x-request-id", rid),))
            otel = rt.otel
            edge = otel.grpc_edge(context.invocation_metadata(), len(data), name) if otel is not None else None
            if edge is not None:  # the sampler picked it
                edge_token = edge_trace.set(edge)
            try:
                request, problem = method.parse(data)
                if problem is None and not method.tracked:
                    return await handler(request, context)
                model = method.model(request, context) if problem is None else ""
                with rt.track(model, "grpc", method.api) as track:
                    if problem is not None:
                        raise problem
                    response = await handler(request, context)
                    if track.traced is not None:
                        track.traced.reply(response)
                    return response
            except Exception as exc:
                fail(context, exc)
                return None
            finally:
                request_id_var.reset(token)
                request_bytes.reset(size_token)
                if edge is not None:
                    edge_trace.reset(edge_token)
                    if edge.span is not None:
                        context.set_trailing_metadata((("x-request-id", rid),
                                                       ("traceparent", edge.response_traceparent())))
        return call
