"""OpenTelemetry spans from inside the processor (issue 46): nothing at all until the server
turns them on.

The server owns OpenTelemetry (:mod:`server.otel`: the SDK, the exporter, the sampling decision,
the edge spans). This module is what the processor's own code calls to add spans under a sampled
request's edge span, and the traces of its own that model loads, warm-ups and deltas make. It
imports no OpenTelemetry package at module level (the processor runs without one: the C ABI, a
library user); :func:`enable` takes the tracer and the API's few functions it needs.

The request path's contract. :data:`current` holds the innermost open span of a sampled request
(None otherwise: tracing off, or the request not sampled); the edge sets it, and the context is
copied with the call onto the model's pool, so the DataPlane, the engine and the stores find it.
While it holds None every function here returns after that one check and makes no object
(:func:`stage` hands back one shared no-op). A sampled request's spans, under its edge span:

* ``decode`` (``parse`` for a JSON request), ``engine.run`` (``sp.lane``, ``sp.rows``,
  ``sp.backend``) and ``encode``, the DataPlane's stages (:class:`SpanRecorder`);
* in a batching model's ``engine.run``: ``batch.queue``, the wait for its batch, linked to the
  batch's ``batch.run`` span (``sp.rows``, ``sp.requests``, ``sp.lane``, ``sp.backend``), which
  sits in the trace of the batch's first sampled request and links to every sampled request's
  ``engine.run`` (:func:`batch_ran`);
* ``feature_store.lookup`` (all tables of one lookup: ``sp.store``, ``sp.tier``, ids, default
  vectors, cache hits and misses) and inside it ``redis.pipeline`` (one round trip: commands,
  keys).

A model load (its steps and warm-up inside) and a delta application are traces of their own
(:func:`background`), when the server samples at all (a rate above 0). A span whose work raises
gets the error status and message.

Thread-safe: :func:`enable` / :func:`disable` swap one immutable state; a span is ended by one
thread; a stage is entered and left by one thread.
"""

from __future__ import annotations

import contextvars
from collections.abc import Sequence
from typing import Any

# The innermost open span of the sampled request (or background trace) this context serves.
current: contextvars.ContextVar[Any] = contextvars.ContextVar("sp_otel_span", default=None)


class _State:
    """What :func:`enable` was given (immutable once made)."""

    __slots__ = ("tracer", "in_context", "root", "link", "record", "status", "error", "background")

    def __init__(self, tracer: Any, background: bool) -> None:
        from opentelemetry import context, trace

        self.tracer = tracer
        # a parent span as start_span's context, a span as a link: the tracer's own way where it
        # has one (the server's, server.otel_spans), else the API's (the SDK's tracer)
        self.in_context = getattr(tracer, "in_context", None) or trace.set_span_in_context
        self.link = getattr(tracer, "link", None) or (lambda span: trace.Link(span.get_span_context()))
        self.record = getattr(tracer, "record", None) or self._record  # a span that has ended already
        self.root = context.Context()  # an empty context: a span started in it is a trace's root
        self.status = trace.Status
        self.error = trace.StatusCode.ERROR
        self.background = background

    def _record(self, parent: Any, name: str, start: int, end: int, attributes: dict | None) -> None:
        self.tracer.start_span(name, context=self.in_context(parent), start_time=start,
                               attributes=attributes).end(end_time=end)


_state: _State | None = None


def enable(tracer: Any, background: bool = True) -> None:
    """Make spans with ``tracer`` (an OpenTelemetry ``Tracer``, or the server's lean one with
    the same ``start_span``, :class:`server.otel_spans.Tracer`) from now on, in this process
    (the server's :class:`~server.otel.Tracing` calls it once tracing is set up; the last call
    wins). ``background``: loads, warm-ups and deltas trace too."""
    global _state
    _state = _State(tracer, background)


def disable() -> None:
    """No spans from now on (spans already open end as they would)."""
    global _state
    _state = None


class _Open:
    """An open span, the :data:`current` one until it is left (a ``with`` block). Its span ends
    on leaving; an exception leaving it sets the error status with the message."""

    __slots__ = ("span", "leaf", "token")

    def __init__(self, span: Any, leaf: bool = False) -> None:
        self.span = span
        self.leaf = leaf

    def __enter__(self) -> _Open:
        if not self.leaf:
            self.token = current.set(self.span)
        return self

    def __exit__(self, kind, exc, tb) -> None:
        if not self.leaf:
            current.reset(self.token)
        if exc is not None:
            fail(self.span, exc)
        self.span.end()

    def set(self, key: str, value: Any) -> None:
        """An attribute of the span."""
        self.span.set_attribute(key, value)


class _NoSpan:
    """:func:`stage`'s answer when nothing is traced: one shared object doing nothing."""

    __slots__ = ()

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, kind, exc, tb) -> None:
        return None

    def set(self, key: str, value: Any) -> None:
        return None


NO_SPAN = _NoSpan()


def stage(name: str, attributes: dict[str, Any] | None = None, leaf: bool = False) -> _Open | _NoSpan:
    """``with stage("decode"): ...``: a child span of :data:`current`, current itself inside the
    block (``leaf``: not, so what runs inside makes no spans of its own); :data:`NO_SPAN` when
    nothing is traced here."""
    parent = current.get()
    if parent is None:
        return NO_SPAN
    state = _state
    if state is None:
        return NO_SPAN
    return _Open(state.tracer.start_span(name, context=state.in_context(parent), attributes=attributes), leaf)


def finished(name: str, start_ns: int, end_ns: int, attributes: dict[str, Any] | None = None) -> None:
    """A child span of :data:`current` that ran from ``start_ns`` to ``end_ns`` (ns since the
    epoch: work timed elsewhere, the native engine's stages); nothing when nothing is traced."""
    parent = current.get()
    state = _state
    if parent is not None and state is not None:
        state.record(parent, name, start_ns, end_ns, attributes)


def annotate(attributes: dict[str, Any]) -> None:
    """Attributes of :data:`current` (a no-op when nothing is traced)."""
    span = current.get()
    if span is not None:
        span.set_attributes(attributes)


def background(name: str, attributes: dict[str, Any] | None = None) -> _Open | _NoSpan:
    """``with background("model.load", {...}): ...``: a trace of its own (a child of
    :data:`current` when one is open), current inside the block, for work off the request path
    (loads, warm-ups, deltas); :data:`NO_SPAN` unless the server traces background work."""
    state = _state
    if state is None or not state.background:
        return NO_SPAN
    parent = current.get()
    context = state.in_context(parent) if parent is not None else state.root
    return _Open(state.tracer.start_span(name, context=context, attributes=attributes))


def fail(span: Any, exc: BaseException) -> None:
    """Set ``span``'s error status, with the exception's message."""
    state = _state
    if state is not None:
        message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
        span.set_status(state.status(state.error, message[:1024]))
        span.set_attribute("error.type", type(exc).__name__)


class SpanRecorder:
    """The DataPlane's stages of one sampled request as spans; the stand-in for a timeline
    :class:`~processor.tracing.TraceRecorder` on the paths both take (its ``stage``, ``lane``,
    ``engine``, ``run_window``, ``stages``; ``engine_trace`` False: the engine runs untraced).
    ``parent``: the span open around the engine run (what the batch thread links to). Used by
    one request's thread, then read by the batch thread its request joined."""

    __slots__ = ("lane", "engine", "run_window", "stages", "parent", "error")

    engine_trace = False
    tracer = None  # no timeline to hand it to: its spans end as its stages do
    # the DataPlane's stage names that become spans, by their span name (acquire: microseconds,
    # not worth a span; request: the edge span is the request)
    _NAMES = {"parse": "parse", "decode": "decode", "run": "engine.run", "encode": "encode"}

    def __init__(self) -> None:
        self.lane: int | None = None
        self.engine = None
        self.run_window = None
        self.stages: list = []  # the batcher's timeline stage; unused here (batch_ran makes the span)
        self.parent = None
        self.error: str | None = None  # set by the DataPlane on failure; the spans carry it already

    def stage(self, name: str) -> _Open | _NoSpan:
        span_name = self._NAMES.get(name)
        if span_name is None:
            return NO_SPAN
        opened = stage(span_name)
        if span_name == "engine.run":
            self.parent = opened.span if opened is not NO_SPAN else None
        return opened


def backend_name(group: Any) -> str:
    """The engine that runs ``group`` (a SessionGroup or a signature's view): ``onnxruntime``,
    ``tensorflow``; ``unknown`` for a stand-in without a backend (tests' fakes)."""
    return getattr(getattr(group, "backend", None), "engine_name", "unknown")


def batch_ran(queued: Sequence[tuple[Any, float]], started_us: float, ended_us: float, lane: int,
              rows: int, requests: int, backend: str) -> None:
    """One merged run (on the batch thread): ``queued`` holds (recorder, when it was queued in
    wall-clock microseconds) of each traced request of the batch; the :class:`SpanRecorder` ones get their
    ``batch.queue`` span and one ``batch.run`` span links them all (see the module doc).
    Never raises (a span never fails a batch)."""
    state = _state
    mine = [(rec, at) for rec, at in queued if isinstance(rec, SpanRecorder) and rec.parent is not None]
    if state is None or not mine:
        return
    try:
        start, end = int(started_us * 1000), int(ended_us * 1000)
        tracer, in_context, link = state.tracer, state.in_context, state.link
        batch = tracer.start_span(
            "batch.run", context=in_context(mine[0][0].parent), start_time=start,
            links=[link(rec.parent) for rec, _ in mine],
            attributes={"sp.rows": rows, "sp.requests": requests, "sp.lane": lane, "sp.backend": backend})
        batch.end(end_time=end)
        to_batch = [link(batch)]
        for rec, enqueued_us in mine:
            wait = tracer.start_span("batch.queue", context=in_context(rec.parent), links=to_batch,
                                     start_time=int(enqueued_us * 1000))
            wait.end(end_time=start)
    except Exception:  # noqa: BLE001 - tracing never fails a request
        return
