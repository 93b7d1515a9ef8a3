"""The server's spans (issue 46): what :mod:`processor.spans` and the edges make for a sampled
request, a model load or a delta, lean enough to trace every request.

:class:`Tracer` has the part of OpenTelemetry's ``Tracer`` interface the server uses
(``start_span(name, context=, kind=, attributes=, links=, start_time=)``) and :class:`Span` the
part of ``Span``'s (``set_attribute(s)``, ``set_status``, ``end``, ``get_span_context``), so
:mod:`processor.spans` runs on it or on the SDK's tracer alike. What it
leaves out on purpose, the SDK's per-span machinery that costs a sampled request most of its
spans' price: a sampler per span (the server's edge decided already), attribute limits and
copies, span processors, a lock per span. A span ending is encoded and queued for export at once
(:mod:`server.otel_export`); it is never seen again.

Ids are random (``random.getrandbits``, as the SDK's ``RandomIdGenerator``); a child span takes
its parent's trace id, trace flags and ``tracestate``, a span under a caller's context (the W3C
``traceparent`` the edge extracted) the caller's, its parent marked remote. The OTLP span's
``flags`` are OTLP's "has is-remote" / "is remote" bits, as the SDK's encoder writes them; the
W3C trace flags (``trace_flags``) go into ``traceparent`` headers.

Thread-safe: a span belongs to one request (or background trace); its end queues it from
whichever thread ends it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import Any

_LOCAL = 0x100  # OTLP SpanFlags: the parent's remoteness is known (and it is local) ...
_REMOTE = 0x300  # ... and it is remote (a caller's span)
_SAMPLED = 0x01  # the W3C trace flags' sampled bit
_KIND_INTERNAL = 1  # OTLP's SpanKind (the API's enum value + 1)
_getrandbits = random.getrandbits
_now = time.time_ns


def _span_id() -> int:
    return _getrandbits(64) or 1  # never 0 (invalid); 2**-64 odds of taking the else


def _trace_id() -> int:
    return _getrandbits(128) or 1


class Span:
    """One span (see the module doc); ended once, by :meth:`end`."""

    __slots__ = ("_tracer", "name", "trace_id", "span_id", "parent_id", "trace_flags", "flags", "trace_state",
                 "kind", "start", "attributes", "links", "status_code", "status_message", "_ended")

    def __init__(self, tracer: Tracer, name: str, trace_id: int, parent_id: int, trace_flags: int, flags: int,
                 trace_state: str | None, kind: int, attributes: dict | None, links: list | None, start: int) -> None:
        self._tracer = tracer
        self.name, self.trace_id, self.span_id, self.parent_id = name, trace_id, _span_id(), parent_id
        self.trace_flags, self.flags, self.trace_state = trace_flags, flags, trace_state
        self.kind, self.start = kind, start
        self.attributes, self.links = attributes, links
        self.status_code, self.status_message = 0, None
        self._ended = False

    def set_attribute(self, key: str, value: Any) -> None:
        if self.attributes is None:
            self.attributes = {}
        self.attributes[key] = value

    def set_attributes(self, attributes: dict) -> None:
        if self.attributes is None:
            self.attributes = dict(attributes)
        else:
            self.attributes.update(attributes)

    def set_status(self, status: Any, description: str | None = None) -> None:
        """An OpenTelemetry ``Status`` (or a ``StatusCode`` and a description)."""
        code = getattr(status, "status_code", status)
        self.status_code = int(code.value)
        self.status_message = getattr(status, "description", None) or description

    def get_span_context(self) -> Any:
        """The OpenTelemetry ``SpanContext`` of this span (for a ``Link`` of the SDK's API)."""
        from opentelemetry.trace import SpanContext, TraceFlags

        return SpanContext(self.trace_id, self.span_id, is_remote=False, trace_flags=TraceFlags(self.trace_flags))

    def end(self, end_time: int | None = None) -> None:
        """End the span (``end_time`` in ns since the epoch; now by default) and queue it for
        export; a second end does nothing."""
        if self._ended:
            return
        self._ended = True
        self._tracer.finished(self, _now() if end_time is None else end_time)


class Tracer:
    """Makes :class:`Span` s whose end calls ``queue.add`` (a :mod:`server.otel_export` span
    queue) and then ``on_queued(count)``: the queue's length with it, 0 when it was full
    (:meth:`server.otel_export.ExportWorker.queued`)."""

    def __init__(self, queue: Any, on_queued: Callable[[int], None]) -> None:
        from opentelemetry import trace

        self._add = queue.add
        self._on_queued = on_queued
        self._span_of_context = trace.get_current_span
        self._internal = trace.SpanKind.INTERNAL

    @staticmethod
    def in_context(span: Span) -> Span:
        """What ``start_span(context=)`` takes for a child of ``span``: the span itself (the SDK
        would need a Context made around it)."""
        return span

    @staticmethod
    def link(span: Span) -> tuple[int, int, int]:
        """A link to ``span`` as ``start_span(links=)`` takes it: (trace id, span id, OTLP
        flags: a local span)."""
        return (span.trace_id, span.span_id, _LOCAL)

    def record(self, parent: Span, name: str, start: int, end: int, attributes: dict | None) -> None:
        """A child of ``parent`` that ran from ``start`` to ``end`` (ns), queued at once (no
        object made)."""
        self._on_queued(self._add(parent.trace_id, _span_id(), parent.span_id, _LOCAL, _KIND_INTERNAL, start, end, name,
                                  attributes, 0, None, parent.trace_state, None))

    def start_span(self, name: str, context: Any = None, kind: Any = None, attributes: dict | None = None,
                   links: Sequence | None = None, start_time: int | None = None) -> Span:
        """A span named ``name`` under ``context``: a :class:`Span` (its child), an
        OpenTelemetry ``Context`` (the caller's span in it, if any, as a remote parent) or None
        (a root). ``kind``: an OpenTelemetry ``SpanKind`` (internal by default); ``links``:
        :meth:`link` tuples or the API's ``Link`` s."""
        otlp_kind = (kind if kind is not None else self._internal).value + 1  # the API's enum is OTLP's less 1
        if context.__class__ is Span:
            trace_id, parent_id, trace_flags, state = (context.trace_id, context.span_id, context.trace_flags,
                                                       context.trace_state)
            flags = _LOCAL
        else:
            parent = self._span_of_context(context).get_span_context() if context is not None else None
            if parent is not None and parent.is_valid:
                trace_id, parent_id, trace_flags = parent.trace_id, parent.span_id, int(parent.trace_flags)
                flags = _REMOTE if parent.is_remote else _LOCAL
                state = (parent.trace_state.to_header() or None) if parent.trace_state else None
            else:
                trace_id, parent_id, trace_flags, flags, state = _trace_id(), 0, _SAMPLED, _LOCAL, None
        if links:
            links = [link if isinstance(link, tuple) else _link_tuple(link) for link in links]
        return Span(self, name, trace_id, parent_id, trace_flags, flags, state, otlp_kind,
                    dict(attributes) if attributes else None, links or None,
                    _now() if start_time is None else start_time)

    def finished(self, span: Span, end: int) -> None:
        self._on_queued(self._add(span.trace_id, span.span_id, span.parent_id, span.flags, span.kind, span.start, end,
                                  span.name, span.attributes, span.status_code, span.status_message, span.trace_state,
                                  span.links))


def _link_tuple(link: Any) -> tuple[int, int, int]:
    """An API ``Link`` as :meth:`Tracer.link`'s tuple (its attributes are not kept)."""
    ctx = link.context
    return (ctx.trace_id, ctx.span_id, _REMOTE if ctx.is_remote else _LOCAL)
