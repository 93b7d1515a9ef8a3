"""The inference routes' fast path: a POST to a protocol's inference URL (our wire format's
``/api/predict/...``, TF Serving REST's ``:predict|classify|regress``, KServe v2's ``infer``) is
answered by a plain ASGI handler, and the replies those handlers give.

They are the hot path, so :class:`~server.http.app.RequestContext` sends them here directly,
skipping FastAPI's routing and request objects (about a fifth of a batch-1 request's CPU), and
the HTTP connection answers a small one itself (:meth:`PredictRoutes.lean_admit`, the lean path
of :mod:`server.http.protocol`); the FastAPI routes for the same URLs (what OpenAPI documents)
call the same handlers. Each protocol adds its inference routes once, at start-up
(:meth:`PredictRoutes.add`, from its registration: :mod:`server.protocols`): one ordered list
of (path prefix, path test, handler, lean answer), tried per request as one loop. Model work
runs on the model's thread pool; errors are mapped once, through ``STATUS_TABLE``.

Every inference route passes the ``X-Routing-Key`` header on as the call's ``routing_key``
(what a model's traffic split hashes: one key, one version) and answers with
``X-Model-Version``, the number of the version that answered (:func:`version_header`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from processor.errors import Unavailable, edge_error
from processor.request import Work

from ..deadline import from_http_headers
from ..runtime import RequestTrack, ServingRuntime
from .body import Receive
from .json_stream import DEFAULT_MAX_ELEMENTS
from .memory_budget import DEFAULT_BUDGET, Hold, MemoryBudget

log = logging.getLogger("server.http")
T = TypeVar("T")
Now = Callable[[bytes, list], "Reply"]  # a lean request's answer: (whole body, headers) -> Reply; never raises
Match = Callable[[str], Any]  # an inference route's test of a path: what it names (a re.Match...), or None
Handler = Callable[[Any, Receive, list], Awaitable["Reply"]]  # its ASGI answer (see PredictRoutes.add)
Lean = Callable[[Any, list, int], "Now | Later | None"]  # its lean answer

JSON = "application/json"

ROUTING_KEY = b"x-routing-key"
MODEL_VERSION = b"x-model-version"


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes | bytearray
    content_type: str = JSON
    headers: tuple[tuple[bytes, bytes], ...] = ()  # more response headers (Retry-After)


@dataclass(frozen=True, slots=True)
class Later:
    """A lean request's answer that is awaited on the connection's loop rather than given at
    once (a batching model's request waits for its batch, another model's runs on its pool):
    ``await run(body, headers)`` -> Reply (``body``: the connection's buffer, a bytearray);
    never raises."""

    run: Callable[[bytes | bytearray, list], Awaitable[Reply]]


def version_header(number: int | str) -> tuple[bytes, bytes]:
    """The ``X-Model-Version`` response header naming the version that answered (its number)."""
    return MODEL_VERSION, (b"%d" % number if number.__class__ is int else number.encode())


def header(headers: list, name: bytes) -> str | None:
    """The first value of header ``name`` (lower case) among ASGI ``headers``."""
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return None


def routing_key(headers: list) -> str | None:
    """The request's ``X-Routing-Key`` (None: none sent): the call's ``routing_key``."""
    return header(headers, ROUTING_KEY)


def error_reply(exc: BaseException) -> Reply:
    """The one mapping of an error to HTTP: STATUS_TABLE's status and ``{"error": message}``."""
    err = edge_error(exc, "http", log)
    retry_after = getattr(exc, "retry_after", None)
    headers = ((b"retry-after", str(retry_after).encode()),) if retry_after else ()
    return Reply(err.edge.http, json.dumps({"error": err.message}).encode(), headers=headers)


def as_response(reply: Reply):
    """A Reply as a Starlette response, for the FastAPI routes."""
    from starlette.responses import Response

    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in reply.headers}
    return Response(reply.body, status_code=reply.status, media_type=reply.content_type, headers=headers or None)


async def tracked(rt: ServingRuntime, model: str, api: str, work: Callable[[], Awaitable[T]],
                  on_error: Callable[[Exception], T]) -> T:
    """``await work()`` as one HTTP ``api`` request to ``model`` (``rt.track``); a request the
    drain timeout cuts off is Unavailable; any error is answered with ``on_error(exc)``."""
    try:
        with rt.track(model, "http", api) as track:
            try:
                reply = await work()
            except asyncio.CancelledError:  # the drain timeout cut the request off
                raise Unavailable("the server shut down before the request finished") from None
            if track.traced is not None:
                track.traced.reply(reply)
            return reply
    except Exception as exc:
        return on_error(exc)



def _continued(track: RequestTrack, answer: Awaitable[Reply]) -> Callable[[bytes | bytearray, list], Awaitable[Reply]]:
    """A :class:`Later`'s ``run`` going on with a request :meth:`PredictRoutes.now_tracked`
    began (its track detached): ``answer`` awaited in the task's context, the track exited
    there, as :func:`tracked` does."""
    async def run(body: bytes | bytearray, headers: list) -> Reply:
        track.resume()
        try:
            try:
                reply = await answer
            except asyncio.CancelledError:  # the drain timeout cut the request off
                raise Unavailable("the server shut down before the request finished") from None
        except Exception as exc:
            track.__exit__(type(exc), exc, exc.__traceback__)
            return error_reply(exc)
        if track.traced is not None:
            track.traced.reply(reply)
        track.__exit__(None, None, None)
        return reply
    return run


class PredictRoutes:
    """See the module doc: the inference routes of every protocol, and what they share (the
    body limits, the JSON decode memory budget, the default deadline)."""

    def __init__(self, rt: ServingRuntime) -> None:
        self.rt = rt
        dep = rt.deployment
        self.limit = dep.max_request_bytes
        self.inline_bytes = dep.inline_max_request_bytes  # served on the event loop up to this size
        # JSON bodies (TF Serving REST, KServe v2): their own body limit, element limit and decode
        # memory budget (issue 16)
        json_limit = getattr(dep, "json_max_request_bytes", None)
        self.json_limit, self.json_setting = ((json_limit, "json_max_request_bytes") if json_limit
                                              else (self.limit, "max_request_bytes"))
        self.json_max_elements = getattr(dep, "json_max_elements", DEFAULT_MAX_ELEMENTS)
        self.json_budget = MemoryBudget(getattr(dep, "json_decode_memory_bytes", DEFAULT_BUDGET))
        # a request without X-Request-Timeout-Ms gets this one (TF Serving's --rest_api_timeout_in_ms)
        self.timeout_ms = getattr(dep, "http_request_timeout_ms", None)
        self._routes: list[tuple[str, Match, Handler, Lean | None]] = []

    def deadline(self, headers: list) -> float | None:
        """A request's deadline: its ``X-Request-Timeout-Ms``, else ``http_request_timeout_ms``'s
        (:func:`server.deadline.from_http_headers`)."""
        return from_http_headers(headers, self.timeout_ms)

    def add(self, match: Match, handler: Handler, lean: Lean | None = None, prefix: str = "") -> None:
        """Answer POSTs to the paths ``match`` takes (``match(path)``: what the path names, a
        compiled pattern's ``match`` or any function; None: not this route's) with
        ``handler(matched, receive, headers)`` on this fast path (a protocol's inference route;
        start-up only: routes are tried in the order they were added, the first match answers).
        ``lean(matched, headers, content_length)``: the route's answer on the lean path
        (:meth:`lean_admit`: a :data:`Now`, a :class:`Later`), or None where the request must
        take the ASGI path (its checks are the route's: say no to a body over its limits).
        ``prefix``: what every path it takes begins with, exactly (tested first: a path to
        another route costs a ``startswith``; "" for a route that matches in any case)."""
        self._routes.append((prefix, match, handler, lean))

    def route(self, path: str) -> Callable[[Receive, list], Awaitable[Reply]] | None:
        """The handler for a POST to ``path``, or None (not an inference URL)."""
        for prefix, match, handler, _ in self._routes:
            if path.startswith(prefix):
                m = match(path)
                if m is not None:
                    return lambda receive, headers: handler(m, receive, headers)
        return None

    def lean_admit(self, url: bytes, headers: list) -> Now | Later | None:
        """The answer of a POST to ``url`` that the HTTP connection may give itself, once the
        whole body is in, before any task or ASGI message (``LimitedHttpProtocol``'s lean path);
        None: the request takes the ASGI path. Taken: a ``Content-Length`` and no percent-escape
        in the URL, to a route :meth:`add`-ed with ``lean`` that takes it (our wire format: a
        body within ``max_request_bytes``, read as the ASGI route reads it; the JSON ones: a body
        of at most ``inline_max_request_bytes``, since a larger one is held against the decode
        memory budget as it arrives, on the ASGI path). Answered here and now for a body of at
        most ``inline_max_request_bytes`` to a model whose plan runs such a request in place
        (``ServingRuntime.runs_here``; our wire format's may still go on later, should the engine
        decline it: :meth:`now_tracked`); else a :class:`Later`, awaited on the loop without the ASGI cycle: the model's
        batching queue or its pool."""
        if not self.inline_bytes or b"%" in url:
            return None
        length = header(headers, b"content-length")
        if length is None or not length.isdigit():
            return None
        path = url.split(b"?", 1)[0].decode("latin-1")
        for prefix, match, _, lean in self._routes:
            if path.startswith(prefix):
                m = match(path)
                if m is not None:
                    return lean(m, headers, int(length)) if lean is not None else None
        return None

    def now_tracked(self, model: str, api: str, work: Callable[[], Reply | Awaitable[Reply]]) -> Reply | Later:
        """``work()`` as one HTTP ``api`` request to ``model``, here and now (``rt.track``); any
        error is answered through the one mapping. The lean path's :func:`tracked`. ``work``
        may answer an awaitable instead (the request must wait after all: it runs on the
        model's pool): then a :class:`Later` awaiting it, the request tracked until it ends."""
        try:
            track = self.rt.track(model, "http", api).__enter__()
        except Exception as exc:  # draining
            return error_reply(exc)
        try:
            reply = work()
        except Exception as exc:
            track.__exit__(type(exc), exc, exc.__traceback__)
            return error_reply(exc)
        if reply.__class__ is not Reply:
            return Later(_continued(track.detach(), reply))
        if track.traced is not None:
            track.traced.reply(reply)
        track.__exit__(None, None, None)
        return reply

    def budgeted(self, model: str, api: str, size: int,
                 run: Callable[[bytes, float | None, Hold, str | None], Reply]) -> Now | Later:
        """The lean answer of an ``api`` request of ``size`` bytes to ``model`` that
        ``run(body, deadline, hold, routing_key)`` decodes and answers, the body's bytes held
        from the decode memory budget (as ``read_body`` holds them on the ASGI path), tracked:
        here and now on the loop when the model's plan runs such a request there
        (``ServingRuntime.runs_here``: :meth:`now_tracked`), else a :class:`Later` awaiting it
        where ``ServingRuntime.dispatch`` puts it (the model's pool)."""
        rt, budget = self.rt, self.json_budget

        if rt.runs_here(model, size, False):
            def now(body: bytes, headers: list) -> Reply:
                def work() -> Reply:
                    deadline = self.deadline(headers)
                    with budget.hold() as hold:
                        hold.need(len(body))
                        return run(body, deadline, hold, routing_key(headers))
                return self.now_tracked(model, api, work)
            return now

        async def later(body: bytes | bytearray, headers: list) -> Reply:
            async def work() -> Reply:
                deadline = self.deadline(headers)
                with budget.hold() as hold:
                    hold.need(len(body))
                    return await rt.dispatch(Work(model, size, run, (body, deadline, hold, routing_key(headers))))
            return await tracked(rt, model, api, work, error_reply)
        return Later(later)
