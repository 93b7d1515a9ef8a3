"""The HTTP/1.1 connection: uvicorn's httptools protocol with the deployment's limits enforced.

uvicorn (with httptools) takes any number of header fields of any size, and a request whose body
never arrives holds its connection for ever. :func:`limited_protocol` returns the protocol class
the server runs (``uvicorn.Config(http=...)``); per connection it enforces:

* ``max_header_bytes`` (request line and header fields) and ``max_header_count``: counted while
  they arrive, so an oversized header block is refused before it is buffered: ``431``;
* ``header_read_timeout_seconds`` from a request's first byte to the end of its headers, and
  ``body_read_timeout_seconds`` from there to the end of its body: ``408``;
* ``keep_alive_timeout_seconds``: a connection with no request in progress is closed, from the
  moment it opens (uvicorn arms its keep-alive timer only after a first response);
* ``max_connections``: a request on a connection beyond the cap gets ``503`` and the connection
  is closed;
* bytes that are not HTTP/1.1: ``400`` (uvicorn answers these in plain text).

On a TLS connection whose client presented a verified certificate, each request's scope carries
``extensions["tls"]["client_cert_names"]`` (its subject CN and DNS/URI SANs) for the admin gate.

Every refusal is ``{"error": message}`` with ``Connection: close``; the connection then reads
and drops what the client still sends for a short while (a "lingering close", as nginx does), so
the client reads the answer instead of a reset. Nothing here touches the request path otherwise.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

from ..logs import new_request_id, request_id_var
from ..otel import EdgeTrace, edge_trace
from .predict import Later, Reply, header

from ..tls import client_identity

log = logging.getLogger("server.http")

# The uvicorn releases (major, minor) this module was tested with: it subclasses uvicorn's
# httptools protocol and uses its internals (the parser, the cycle, the timers), which change
# between minor releases. pyproject.toml pins the same range; tests/unit/server/
# test_uvicorn_pin.py fails on any other installed version.
UVICORN_TESTED = ((0, 54),)

# after a refusal: drop what the client still sends, for at most this long / this many bytes
LINGER_SECONDS = 2.0
LINGER_BYTES = 16 * 1024 * 1024

REASONS = {400: b"Bad Request", 408: b"Request Timeout", 431: b"Request Header Fields Too Large", 503: b"Service Unavailable"}


class _Refused(Exception):
    """Raised inside a parser callback to stop parsing once a refusal was sent."""


def limited_protocol(deployment: Any, inline: Any = None) -> type[HttpToolsProtocol]:
    """The protocol class for ``deployment`` (a :class:`~server.settings.DeploymentConfig`);
    ``inline``: the predict routes (:class:`~server.http.predict.PredictRoutes`) whose small
    requests the connection answers itself (see :class:`LimitedHttpProtocol`)."""
    attrs = {
        "inline": inline,
        "max_header_bytes": deployment.max_header_bytes,
        "max_header_count": deployment.max_header_count,
        "header_timeout": deployment.header_read_timeout_seconds,
        "body_timeout": deployment.body_read_timeout_seconds,
        "idle_timeout": deployment.keep_alive_timeout_seconds,
        "max_connections": deployment.max_connections,
    }
    return type("LimitedHttpProtocol", (LimitedHttpProtocol,), attrs)


def refusal(status: int, message: str) -> bytes:
    """A complete HTTP/1.1 response: ``{"error": message}``, closing the connection."""
    body = json.dumps({"error": message}).encode()
    return b"".join([
        b"HTTP/1.1 %d %s\r\n" % (status, REASONS.get(status, b"Error")),
        b"content-type: application/json\r\n",
        b"content-length: %d\r\n" % len(body),
        b"connection: close\r\n\r\n", body])


class _HeldHead:
    """A transport that holds the first write (the response head uvicorn writes) until the next
    one (its first body bytes), then sends both in one write: one send(), one TCP segment,
    instead of two. Every other transport call passes through; ``close`` and ``flush`` write
    the held head first."""

    __slots__ = ("real", "head")

    def __init__(self, real) -> None:
        self.real = real
        self.head: bytes | None = None

    def write(self, data: bytes) -> None:
        if self.head is None:
            self.head = data  # the head: held
            return
        self.real.write(self.head + data)
        self.head = b""  # sent; the cycle drops this object after the write

    def flush(self) -> None:
        if self.head:
            self.real.write(self.head)
            self.head = b""

    def close(self) -> None:
        self.flush()
        self.real.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


class CoalescingCycle(RequestResponseCycle):
    """uvicorn's request/response cycle, writing a response's head together with its body.

    A batch-1 answer is a few hundred bytes: its head and body as two writes cost a second
    system call and a second packet to the client, a large share of such a request's CPU. The
    head is held from ``http.response.start`` to the first body write; whatever ends the
    response (a body, a HEAD request's empty one, a close) writes it first.

    ``after``: the task of an earlier request on the connection whose lean answer is awaited
    (``LimitedHttpProtocol``'s deferred answers); this response starts once it has been written,
    so answers stay in the order of their requests.
    """

    after: asyncio.Task | None = None

    async def send(self, message) -> None:
        if self.after is not None:
            after, self.after = self.after, None
            await asyncio.wait((after,))  # its own outcome is its own: only the order matters here
        if message["type"] == "http.response.start" and not self.response_started and not self.disconnected:
            real = self.transport
            held = self.transport = _HeldHead(real)
            try:
                await super().send(message)  # uvicorn writes the head into `held`
            except BaseException:
                self.transport = real
                held.flush()
                raise
            return
        try:
            await super().send(message)
        finally:
            held = self.transport
            if held.__class__ is _HeldHead:
                self.transport = held.real
                held.flush()


class _Exchange:
    """A request the connection answers itself: its answer (``now(body, headers)``), headers
    and body so far."""

    __slots__ = ("now", "headers", "body")

    def __init__(self, now, headers: list) -> None:
        self.now, self.headers, self.body = now, headers, bytearray()


class LimitedHttpProtocol(HttpToolsProtocol):
    """See the module doc; the limits are class attributes set by :func:`limited_protocol`.

    The lean path: a small inference request (our wire format, TF Serving REST, KServe v2 REST;
    a ``Content-Length`` of at most ``inline_max_request_bytes``) whose model runs in place on
    the native engine is answered by the connection itself when its body is complete, without
    an asyncio task, ASGI messages or uvicorn's response cycle (they cost more than such a
    request's engine run): the same work as the ASGI route
    (:meth:`~server.http.predict.PredictRoutes.lean_admit`: request id, deadline, limits, drain
    gate, metrics, access log, the one error mapping), one write for the whole response. Only
    when the connection has no response in progress, so answers stay in order.

    A request whose model does not run it in place (a batching model's, one on the model's pool;
    and any of our wire format within ``max_request_bytes``, since a large one never runs in
    place) is answered the same way once it ran: the answer (:class:`~server.http.predict.Later`)
    is awaited in a task of its own on the loop, without ASGI messages or the response cycle,
    counted among uvicorn's tasks (a shutdown waits for it as for an ASGI one); so is one answered
    here that must wait after all (the engine declined it: its answer is a ``Later`` too, the
    request's tracking carried into the task). While it is awaited, the connection's next
    request takes the ASGI path and its response waits for this one's (``CoalescingCycle.after``).
    """

    max_header_bytes = 16 * 1024
    max_header_count = 100
    header_timeout = 10.0
    body_timeout = 60.0
    idle_timeout = 30.0
    max_connections = 1000
    inline = None  # PredictRoutes, or None: every request takes the ASGI path

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._exchange: _Exchange | None = None
        self.timeout_keep_alive = self.idle_timeout
        self._read_timer = None  # fires at (or before) the read deadline of the request being read
        self._deadline = 0.0  # loop time by which its headers, then its body, must have arrived
        self._in_headers = False
        self._header_bytes = 0  # counted from the parser callbacks (complete fields)
        self._partial_bytes = 0  # raw bytes of chunks that arrived inside an unfinished header block
        self._header_count = 0
        self._messages = 0
        self._refused = False
        self._lingered = 0
        self._over_cap = False
        self._tls_scope = None  # {"client_cert_names": (...)} for a verified client certificate
        self._later: asyncio.Task | None = None  # a deferred lean answer being awaited
        self._close_after_later = False  # shutdown() came while it was (or its body came): it ends the connection

    # --- connection --------------------------------------------------------------------------

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        names = client_identity(transport)  # once per connection: the handshake is over by now
        if names is not None:
            self._tls_scope = {"tls": {"client_cert_names": names}}
        if len(self.connections) > self.max_connections:
            self._over_cap = True  # its request gets 503 (a response needs the request first)
        # a connection that never sends a byte is closed like an idle keep-alive one
        self.timeout_keep_alive_task = self.loop.call_later(self.idle_timeout, self.timeout_keep_alive_handler)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_read_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:  # lingering close: read and drop
            self._lingered += len(data)
            if self._lingered > LINGER_BYTES:
                self.transport.close()
            return
        self._unset_keepalive_if_required()
        began = self._messages
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # as uvicorn does (the server runs with ws="none")
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError as exc:
            if not self._refused:  # uvicorn answers text; ours is {"error"} like every other
                self._refuse(400, f"invalid HTTP request: {exc}", raise_=False)
            return
        if self._in_headers and self._messages == began:
            # the whole chunk belongs to a header block that is still unfinished: this bounds the
            # bytes httptools buffers for one endless header field
            self._partial_bytes += len(data)
            if self._partial_bytes > self.max_header_bytes:
                self._refuse(431, f"request header fields are over {self.max_header_bytes} bytes "
                                  f"(max_header_bytes)", raise_=False)
        elif (not self._in_headers and self.timeout_keep_alive_task is None
              and (self.cycle is None or self.cycle.response_complete) and not self._refused):
            # bytes that began no request (stray CRLFs): the connection is still idle
            self.timeout_keep_alive_task = self.loop.call_later(self.idle_timeout, self.timeout_keep_alive_handler)

    # --- parser callbacks --------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._tls_scope is not None:  # ASGI's "extensions"; the admin gate reads it
            self.scope["extensions"] = self._tls_scope
        self._messages += 1
        self._in_headers = True
        self._header_bytes = self._partial_bytes = self._header_count = 0
        # one timer per request on the hot path: armed here, moved on only if it fires early
        self._deadline = self.loop.time() + self.header_timeout
        self._arm(self.header_timeout)

    def on_url(self, url: bytes) -> None:
        self._header_bytes += len(url)
        self._check_headers()
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        self._header_bytes += len(name) + len(value) + 4
        self._check_headers()
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_headers = False
        if self._over_cap:
            self._refuse(503, f"too many connections (max_connections {self.max_connections}); retry later")
        self._deadline = self.loop.time() + self.body_timeout
        if self.body_timeout < self.header_timeout:  # else the header timer fires first, then moves on
            self._arm(self.body_timeout)
        if self.inline is not None and not self._refused and self._take_inline():
            return
        super().on_headers_complete()
        if self.cycle is not None and self.cycle.__class__ is RequestResponseCycle:
            self.cycle.__class__ = CoalescingCycle  # before its task first runs (it is only scheduled)
            if self._later is not None:
                self.cycle.after = self._later

    def on_body(self, body: bytes) -> None:
        if self._exchange is not None:
            self._exchange.body += body
            return
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._cancel_read_timer()
        exchange = self._exchange
        if exchange is not None:
            self._exchange = None
            self._answer(exchange)
            return
        super().on_message_complete()

    # --- the lean path (see the class doc) ---------------------------------------------------

    def _take_inline(self) -> bool:
        """Whether this request is one the connection answers itself (then it is remembered)."""
        if (self.expect_100_continue or self.pipeline or self._later is not None
                or self.parser.get_method() != b"POST"
                or (self.cycle is not None and not self.cycle.response_complete)
                or self.parser.should_upgrade()):
            return False
        now = self.inline.lean_admit(self.url, self.headers)
        if now is None:
            return False
        self._exchange = _Exchange(now, self.headers)
        return True

    def _answer(self, exchange: _Exchange) -> None:
        rid = new_request_id(header(exchange.headers, b"x-request-id"))
        keep_alive = self.parser.should_keep_alive() and self.parser.get_http_version() != "1.0"
        answer = exchange.now
        otel = self.inline.rt.otel  # tracing on: the request's trace context (server/otel.py)
        edge = otel.http_edge(exchange.headers, "POST", len(exchange.body)) if otel is not None else None
        if answer.__class__ is not Later:
            token = request_id_var.set(rid)
            if edge is not None:
                edge_token = edge_trace.set(edge)
            try:
                reply = answer(bytes(exchange.body), exchange.headers)
            finally:
                request_id_var.reset(token)
                if edge is not None:
                    edge_trace.reset(edge_token)
            if reply.__class__ is not Later:
                self._write(reply, rid, keep_alive and not self._close_after_later, edge)
                return
            answer = reply  # it must wait after all (the engine declined it): the rest in a task
        context = contextvars.copy_context()
        context.run(request_id_var.set, rid)
        if edge is not None:
            context.run(edge_trace.set, edge)
        task = self._later = self.loop.create_task(
            self._answer_later(answer, exchange.body, exchange.headers, rid, keep_alive, edge), context=context)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _answer_later(self, later: Later, body: bytearray, headers: list, rid: str, keep_alive: bool,
                            edge: EdgeTrace | None) -> None:
        """``later``'s answer, written once it is ready; ``body`` is the exchange's own buffer
        (no copy: a large body is not held twice), which nothing writes to any more."""
        try:
            reply = await later.run(body, headers)
        finally:
            self._later = None
        self._write(reply, rid, keep_alive and not self._close_after_later, edge)

    def _write(self, reply: Reply, rid: str, keep_alive: bool, edge: EdgeTrace | None = None) -> None:
        """The whole response in one write (with a traced request's ``traceparent``); then the
        connection waits for its next request, or is closed."""
        out = [STATUS_LINE[reply.status]]
        out += [b"%s: %s\r\n" % kv for kv in self.server_state.default_headers]
        out.append(b"content-type: %s\r\ncontent-length: %d\r\nx-request-id: %s\r\n"
                   % (reply.content_type.encode(), len(reply.body), rid.encode()))
        if edge is not None and edge.span is not None:
            out.append(b"traceparent: %s\r\n" % edge.response_traceparent().encode())
        out += [b"%s: %s\r\n" % kv for kv in reply.headers]
        out.append(b"\r\n" if keep_alive else b"connection: close\r\n\r\n")
        out.append(reply.body)
        if not self.transport.is_closing():
            self.transport.write(b"".join(out))
        if not keep_alive:
            self.server_state.total_requests += 1
            self.transport.close()
        elif self.cycle is None or self.cycle.response_complete:
            self.on_response_complete()
        else:  # a later request's ASGI cycle is under way (it waited for this answer): it goes on
            self.server_state.total_requests += 1

    def shutdown(self) -> None:
        """uvicorn's graceful shutdown: a connection awaiting a deferred lean answer, or whose
        lean request's body is still arriving (and no later request), ends after that answer,
        as one with an ASGI response in progress does."""
        if ((self._later is not None or self._exchange is not None)
                and (self.cycle is None or self.cycle.response_complete)):
            self._close_after_later = True
            return
        super().shutdown()

    # --- limits ------------------------------------------------------------------------------

    def _check_headers(self) -> None:
        if self._header_count > self.max_header_count:
            self._refuse(431, f"too many request header fields: over {self.max_header_count} "
                              f"(max_header_count)")
        if self._header_bytes > self.max_header_bytes:
            self._refuse(431, f"request header fields are over {self.max_header_bytes} bytes "
                              f"(max_header_bytes)")

    def _arm(self, seconds: float) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
        self._read_timer = self.loop.call_later(seconds, self._read_timed_out)

    def _cancel_read_timer(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _read_timed_out(self) -> None:
        self._read_timer = None
        left = self._deadline - self.loop.time()
        if left > 0.001:
            self._read_timer = self.loop.call_later(left, self._read_timed_out)
        elif self._in_headers:
            self._header_timed_out()
        else:
            self._body_timed_out()

    def _header_timed_out(self) -> None:
        if not self._refused:
            self._refuse(408, f"request headers not received within {self.header_timeout:g} s "
                              f"(header_read_timeout_seconds)", raise_=False)

    def _body_timed_out(self) -> None:
        if self._exchange is not None:  # the lean path's body: nothing was started for it
            self._exchange = None
            self._refuse(408, f"request body not received within {self.body_timeout:g} s "
                              f"(body_read_timeout_seconds)", raise_=False)
            return
        cycle = self.cycle
        if cycle is None or not cycle.more_body or self._refused:
            return
        message = (f"request body not received within {self.body_timeout:g} s "
                   f"(body_read_timeout_seconds)")
        started = cycle.response_started
        cycle.disconnected = True  # the handler's receive() now returns http.disconnect, its send() is dropped
        cycle.message_event.set()
        if started:  # the answer went out already (413): just end the connection
            self.transport.close()
        else:
            self._refuse(408, message, raise_=False)

    def _refuse(self, status: int, message: str, raise_: bool = True) -> None:
        """Answer ``status`` and close (after a lingering read); stops the parser when asked."""
        if not self._refused:
            self._refused = True
            self._cancel_read_timer()
            self._unset_keepalive_if_required()
            client = "%s:%s" % self.client if self.client else "?"
            log.warning("refused a request from %s: %d %s", client, status, message,
                        extra={"client": client, "status": status})
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete and not cycle.disconnected:
                # a pipelined request is refused while the one before it is still answered: that
                # answer goes out, then the connection closes; nothing is written in between
                cycle.keep_alive = False
            elif not self.transport.is_closing():
                self.transport.write(refusal(status, message))
                try:
                    self.transport.write_eof()
                except (NotImplementedError, AttributeError, RuntimeError, OSError):
                    self.transport.close()
                self.loop.call_later(LINGER_SECONDS, self._close)
        if raise_:
            raise _Refused(message)

    def _close(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()
