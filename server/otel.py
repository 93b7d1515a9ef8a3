"""OpenTelemetry traces of the server (issue 46): a request's path as spans in the user's own
tracing system, exported over OTLP by the OpenTelemetry SDK's exporters.

:class:`Tracing` is built by the runtime when the deployment has a ``tracing`` key
(:class:`~server.otel_settings.TracingSettings`; the standard ``OTEL_*`` environment variables
fill in what it leaves out, read then, :func:`resolve`). It owns the process's resource (the
SDK's ``Resource``: ``service.name`` and one ``service.instance.id`` per process, so each worker
of a ``workers: N`` server exports as an instance of its own), the queue of encoded spans and
the export thread in front of the SDK's OTLP exporter (gRPC or HTTP/protobuf;
:mod:`server.otel_export` says why the spans are not the SDK's), and hands the tracer
(:class:`server.otel_spans.Tracer`) to :mod:`processor.spans` for the spans made inside the
processor.

Per request, at the edges:

* the transport (HTTP's ASGI middleware and its lean path, gRPC's interceptor) finds the W3C
  ``traceparent`` header or metadata and takes the sampling decision (:meth:`Tracing.http_edge`,
  :meth:`Tracing.grpc_edge`): a caller's sampled trace is continued and an unsampled one is not
  (parent-based; ``OTEL_TRACES_SAMPLER=traceidratio`` and ``always_*`` decide without the
  parent's flag), a request without one is picked with probability ``sample_rate``. An
  unsampled request costs that scan and one random number: no object, no span. A picked one
  gets an :class:`EdgeTrace` (its caller's context, ``tracestate`` included);
* ``RequestTrack`` (every model request of both transports) starts its edge span
  (:meth:`Tracing.begin`: ``sp.protocol``, ``sp.route``, ``sp.model``, ``sp.model.version``,
  ``sp.status``, request and response bytes, the request id; a failure's status and message),
  the parent of every span the processor makes for it, and its ids the exemplar of the latency
  histogram. Few attributes on purpose: each costs a sampled request microseconds to make and
  to export;
* the response carries ``traceparent`` naming the edge span (HTTP header, gRPC trailing
  metadata), for sampled requests.

Export runs on the export thread, never on the request path: a span is encoded and appended to a
bounded queue when it ends (``max_queue_size``; one that finds it full is dropped), a collector that is down, refuses
or hangs delays nothing but that thread (each export gives up after ``export_timeout_seconds``).
``sp_tracing_spans{outcome}`` in ``/metrics`` counts the spans exported, dropped (queue full)
and lost in failed exports.

Thread-safe: :meth:`Tracing.begin` runs on any edge's thread; :class:`EdgeTrace` and
:class:`RequestSpan` belong to one request.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import uuid
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from processor import spans
from processor.errors import ConfigError, ProcessorError

from . import otel_export, otel_spans
from .logs import request_id_var
from .otel_settings import TracingSettings

log = logging.getLogger("server.otel")

DEFAULT_SERVICE_NAME = "serving-processor"
DEFAULT_SAMPLE_RATE = 0.01  # ours; the SDK's default would trace every request
_CLOSE_SECONDS = 5.0  # at most this long to export what is queued when the server stops
_ODD = frozenset("13579bdfBDF")  # a traceparent's flags byte whose low bit (sampled) is set

# The request's trace state at the edge; None while tracing is off (or outside a request).
edge_trace: ContextVar[EdgeTrace | None] = ContextVar("sp_edge_trace", default=None)


@dataclass(frozen=True)
class Resolved:
    """The tracing settings in force: the deployment's, else the environment's, else defaults.
    ``endpoint`` / ``headers`` / ``timeout`` None: the exporter's own environment variables
    and defaults. The export queue's (``OTEL_BSP_*``): ``max_queue_size`` spans, exported
    ``max_export_batch_size`` at a time, at least every ``schedule_delay`` seconds. The sizes'
    defaults are 4x the SDK's batch processor's (2048 and 512): an export costs its thread a
    fixed ~0.4 ms of CPU here (gRPC's Python client) beside ~0.2 us a span, so a batch of 2048
    spans (~400 KB, far below gRPC's 4 MiB message limit) costs a span a third of what one of
    512 does."""

    protocol: str
    endpoint: str | None
    headers: dict[str, str] | None
    timeout: float | None
    parent_based: bool
    rate: float
    service_name: str
    max_queue_size: int = 8192
    max_export_batch_size: int = 2048
    schedule_delay: float = 5.0


_SAMPLERS = {  # OTEL_TRACES_SAMPLER -> (parent-based, rate; None: OTEL_TRACES_SAMPLER_ARG)
    "always_on": (False, 1.0), "always_off": (False, 0.0), "traceidratio": (False, None),
    "parentbased_always_on": (True, 1.0), "parentbased_always_off": (True, 0.0),
    "parentbased_traceidratio": (True, None),
}


def resolve(settings: TracingSettings | None, environ: Mapping[str, str]) -> Resolved | None:
    """What :class:`Tracing` runs with; None: tracing is off (no ``tracing`` key, or
    ``OTEL_SDK_DISABLED=true``). ConfigError naming the variable for a bad environment value."""
    if settings is None or environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    protocol = (settings.protocol or environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc").strip()
    if protocol not in ("grpc", "http/protobuf"):
        raise ConfigError(f"OTEL_EXPORTER_OTLP_PROTOCOL: {protocol[:40]!r} is not supported "
                          f"(grpc or http/protobuf)")
    endpoint = settings.otlp_endpoint
    if endpoint is not None and protocol == "http/protobuf" and urlsplit(endpoint).path in ("", "/"):
        endpoint = endpoint.rstrip("/") + "/v1/traces"  # a base URL, as OTEL_EXPORTER_OTLP_ENDPOINT
    if settings.sample_rate is not None:
        parent_based, rate = True, settings.sample_rate
    else:
        parent_based, rate = _sampler(environ)
    queue = settings.max_queue_size or _positive(environ, "OTEL_BSP_MAX_QUEUE_SIZE", Resolved.max_queue_size)
    batch = settings.max_export_batch_size or _positive(environ, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
                                                        Resolved.max_export_batch_size)
    if batch > queue:
        name = "tracing.max_export_batch_size" if settings.max_export_batch_size else "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"
        raise ConfigError(f"{name}: {batch} is larger than the export queue ({queue} spans)")
    delay_ms = _positive(environ, "OTEL_BSP_SCHEDULE_DELAY", int(Resolved.schedule_delay * 1000))
    return Resolved(protocol=protocol, endpoint=endpoint, headers=settings.headers,
                    timeout=settings.export_timeout_seconds, parent_based=parent_based, rate=rate,
                    service_name=settings.service_name or environ.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME,
                    max_queue_size=queue, max_export_batch_size=batch, schedule_delay=delay_ms / 1000)


def _positive(environ: Mapping[str, str], name: str, default: int) -> int:
    """A positive integer environment variable (``default`` when unset); ConfigError naming it."""
    text = environ.get(name, "").strip()
    if not text:
        return default
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"{name}: {text[:40]!r} is not a positive integer")
    return int(text)


def _sampler(environ: Mapping[str, str]) -> tuple[bool, float]:
    """(parent-based, rate) from ``OTEL_TRACES_SAMPLER`` / ``_ARG``; ours when unset."""
    name = environ.get("OTEL_TRACES_SAMPLER", "").strip().lower()
    if not name:
        return True, DEFAULT_SAMPLE_RATE
    if name not in _SAMPLERS:
        raise ConfigError(f"OTEL_TRACES_SAMPLER: {name[:40]!r} is not supported ({', '.join(_SAMPLERS)})")
    parent_based, rate = _SAMPLERS[name]
    if rate is None:
        arg = environ.get("OTEL_TRACES_SAMPLER_ARG", "1.0")
        try:
            rate = float(arg)
        except ValueError:
            rate = -1.0
        if not 0.0 <= rate <= 1.0:
            raise ConfigError(f"OTEL_TRACES_SAMPLER_ARG: {arg[:40]!r} is not a rate between 0 and 1")
    return parent_based, rate


class EdgeTrace:
    """A request the sampler picked, at the edge: the caller's trace context (``context``, an
    OpenTelemetry Context; None: a root), its size in bytes (None: unknown), its ``name`` (gRPC:
    the method's path, the span's name; HTTP: the request method) and ``span``, the edge span
    :meth:`Tracing.begin` made (None until then, and for a request about no model). Made by the
    transport (:meth:`Tracing.http_edge`, :meth:`Tracing.grpc_edge`) and set in
    :data:`edge_trace` for the request; used by that request only."""

    __slots__ = ("context", "request_bytes", "name", "span")

    def __init__(self, context: Any, request_bytes: int | None, name: str) -> None:
        self.context, self.request_bytes, self.name = context, request_bytes, name
        self.span = None

    def response_traceparent(self) -> str | None:
        """The ``traceparent`` the response carries (the edge span's), or None: not traced."""
        span = self.span
        if span is None:
            return None
        return f"00-{span.trace_id:032x}-{span.span_id:016x}-{span.trace_flags:02x}"


class RequestSpan:
    """A sampled request's edge span, open from ``RequestTrack``'s enter to its exit, and the
    :data:`processor.spans.current` span meanwhile. Used by that request only."""

    __slots__ = ("span", "token", "size")

    def __init__(self, span: Any) -> None:
        self.span = span
        self.token = spans.current.set(span)
        self.size: int | None = None

    def leave(self) -> None:
        """Stop being this context's current span (the request goes on in another context)."""
        spans.current.reset(self.token)

    def enter(self) -> None:
        """Be the current span of the context the request goes on in (after :meth:`leave`)."""
        self.token = spans.current.set(self.span)

    def reply(self, reply: Any) -> None:
        """The response's size, from the reply (an HTTP ``Reply`` or response with a ``body``,
        a protobuf message, bytes)."""
        self.size = message_size(reply)

    def end(self, version: str, error: ProcessorError | None = None, cancelled: bool = False) -> Any:
        """End the span (the request's outcome: ``error`` or OK, ``cancelled`` when the caller
        went away) and leave it; the span (its ids: the latency histogram's exemplar)."""
        spans.current.reset(self.token)
        span = self.span
        status = "CANCELLED" if cancelled else "OK" if error is None else error.code.name
        attributes = {"sp.status": status, "sp.model.version": version}
        if self.size is not None:
            attributes["sp.response.bytes"] = self.size
        span.set_attributes(attributes)
        if error is not None:
            spans.fail(span, error)
        span.end()
        return span


def message_size(reply: Any) -> int | None:
    """Bytes of a reply: ``len`` of bytes, of a ``body``, or a message's ``ByteSize()``."""
    if isinstance(reply, (bytes, bytearray, memoryview)):
        return len(reply)
    body = getattr(reply, "body", None)
    if isinstance(body, (bytes, bytearray, memoryview)):
        return len(body)
    size = getattr(reply, "ByteSize", None)
    return size() if callable(size) else None


class Tracing:
    """See the module doc. ``count(outcome, spans)``: where the span counts go (``exported``,
    ``dropped``: the queue was full, ``export_failed``); ``exporter``: a SpanExporter in place of
    the OTLP one (tests). The processor's spans (:mod:`processor.spans`) are process-wide: the
    last Tracing made in a process gets them, and its :meth:`close` ends them."""

    def __init__(self, resolved: Resolved, count: Callable[[str, int], None] = lambda outcome, n: None,
                 exporter: Any = None) -> None:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.resolved = resolved
        self.instance_id = str(uuid.uuid4())
        # the SDK's Resource: OTEL_RESOURCE_ATTRIBUTES and the SDK's own attributes merged in
        resource = Resource.create({"service.name": resolved.service_name, "service.instance.id": self.instance_id,
                                    "host.name": socket.gethostname(), "process.pid": os.getpid()})
        self.exporter = _CountingExporter(
            exporter if exporter is not None else otel_export.otlp_exporter(
                resolved.protocol, resolved.endpoint, resolved.headers, resolved.timeout),
            count, resolved.endpoint or resolved.protocol)
        # the decision is ours, made before any span (begin): an unsampled request costs no span
        # object; a span we start is one we keep and export (server.otel_export's doc says why
        # not through the SDK's spans)
        self._queue = otel_export.span_queue(resolved.max_queue_size)
        self._worker = otel_export.ExportWorker(
            self._queue, self.exporter, otel_export.Envelope(resource.attributes, "serving-processor",
                                                             resource.schema_url),
            resolved.max_export_batch_size, resolved.schedule_delay, lambda: count("dropped", 1))
        self.tracer = otel_spans.Tracer(self._queue, self._worker.queued)
        self._propagator = TraceContextTextMapPropagator()
        self._span_in = trace.get_current_span  # of a context (a caller's, extracted)
        self._server = trace.SpanKind.SERVER
        self._parent_based, self._rate = resolved.parent_based, resolved.rate
        self._ratio_bound = round(resolved.rate * (1 << 64))
        spans.enable(self.tracer, background=resolved.rate > 0)
        log.info("tracing: OTLP %s to %s, sampling %g%s, service %s, instance %s", resolved.protocol,
                 resolved.endpoint or "the OTEL_EXPORTER_OTLP_* endpoint", resolved.rate,
                 " (a caller's sampled trace is always continued)" if resolved.parent_based else "",
                 resolved.service_name, self.instance_id)

    @classmethod
    def from_deployment(cls, deployment, count: Callable[[str, int], None]) -> Tracing | None:
        """The deployment's tracing (the environment read now), or None when it is off."""
        resolved = resolve(getattr(deployment, "tracing", None), os.environ)
        return None if resolved is None else cls(resolved, count)

    # --- the edges --------------------------------------------------------------------------

    def http_edge(self, headers: list[tuple[bytes, bytes]], method: str = "POST",
                  body_bytes: int | None = None) -> EdgeTrace | None:
        """An HTTP ``method`` request's :class:`EdgeTrace` from its ASGI header list when the
        sampler picks it (its size: ``body_bytes``, else its ``Content-Length``); None, having
        made nothing, when it does not."""
        parent = None
        for key, value in headers:  # the one scan an unsampled request costs
            if key == b"traceparent":
                parent = value.decode("latin-1")
                break
        if not self._sampled(parent):
            return None
        state = length = None
        for key, value in headers:
            if key == b"tracestate":
                state = value.decode("latin-1")
            elif key == b"content-length":
                length = value
        if body_bytes is None and length is not None and length.isdigit():
            body_bytes = int(length)
        return self._edge(parent, state, body_bytes, method)

    def grpc_edge(self, metadata: Any, request_bytes: int, method: str) -> EdgeTrace | None:
        """A gRPC call's :class:`EdgeTrace` from its invocation metadata when the sampler picks
        it (None otherwise); ``method``: its full path (``/package.Service/Method``)."""
        parent = state = None
        for key, value in metadata or ():
            if key == "traceparent":
                parent = value if isinstance(value, str) else value.decode("latin-1")
            elif key == "tracestate":
                state = value if isinstance(value, str) else value.decode("latin-1")
        if not self._sampled(parent):
            return None
        return self._edge(parent, state, request_bytes, method.lstrip("/"))

    def _sampled(self, parent: str | None) -> bool:
        """The sampler's decision for a request with the caller's ``traceparent`` ``parent``
        (None: none): a root is picked with the rate's probability; a caller's trace by its
        sampled flag (parent-based), else by its trace id against the rate (TraceIdRatioBased's
        rule). A malformed ``traceparent`` is checked later, when picked (:meth:`_edge`)."""
        if parent is None or len(parent) < 55 or parent[2] != "-" or parent[35] != "-" or parent[52] != "-":
            rate = self._rate  # none, or not a traceparent's shape (ignored): a root
            return rate >= 1.0 or (rate > 0.0 and random.random() < rate)
        if self._parent_based:  # 00-<trace id>-<parent id>-<flags>: the flags' low bit
            return parent[54] in _ODD
        return self._by_trace_id(parent)

    def _edge(self, parent: str | None, state: str | None, size: int | None, name: str) -> EdgeTrace | None:
        """The EdgeTrace of a picked request: the caller's context extracted (a malformed one
        is ignored, as the propagator does: the request is then a root, and a root's decision
        is taken)."""
        context = None
        if parent is not None and len(parent) >= 55:
            carrier = {"traceparent": parent}
            if state is not None:
                carrier["tracestate"] = state
            context = self._propagator.extract(carrier)
            if not self._span_in(context).get_span_context().is_valid:
                if not self._sampled(None):
                    return None
                context = None
        return EdgeTrace(context, size, name)

    def begin(self, protocol: str, api: str, model: str) -> RequestSpan | None:
        """The edge span of the request :data:`edge_trace` holds (a ``protocol`` ``api`` call
        about ``model``): None, at once, when there is none (the edge did not pick it). Sets
        ``span`` on the EdgeTrace for the response's ``traceparent``. Never raises: tracing never
        fails a request."""
        edge = edge_trace.get()
        if edge is None:
            return None
        try:
            return self._begin(edge, protocol, api, model)
        except Exception:  # noqa: BLE001
            log.exception("tracing: could not start a request's span")
            return None

    def _begin(self, edge: EdgeTrace, protocol: str, api: str, model: str) -> RequestSpan:
        # few attributes: each costs a sampled request microseconds to make and to export
        attributes = {"sp.protocol": protocol, "sp.route": api, "sp.model": model,
                      "sp.request_id": request_id_var.get()}
        if edge.request_bytes is not None:
            attributes["sp.request.bytes"] = edge.request_bytes
        name = edge.name if protocol == "grpc" else f"{edge.name} {api}"
        span = edge.span = self.tracer.start_span(name, context=edge.context, kind=self._server,
                                                  attributes=attributes)
        return RequestSpan(span)

    def _by_trace_id(self, traceparent: str) -> bool:
        """TraceIdRatioBased's decision on a caller's trace id (its low 64 bits against the
        rate's bound), so every service deciding by the same rate decides alike."""
        try:
            return int(traceparent[19:35], 16) < self._ratio_bound
        except ValueError:
            return False

    # --- lifecycle --------------------------------------------------------------------------

    def force_flush(self, timeout: float = 30.0) -> bool:
        """Export the spans queued now; False if that took longer than ``timeout`` seconds."""
        return self._worker.force_flush(timeout)

    def close(self, timeout: float = _CLOSE_SECONDS) -> None:
        """Stop tracing: no more spans, what is queued exported for at most ``timeout`` seconds
        (a collector that hangs does not hold the server's exit)."""
        spans.disable()
        closer = threading.Thread(target=self._worker.shutdown, name="sp-otel-close", daemon=True)
        closer.start()
        closer.join(timeout)
        if closer.is_alive():
            log.warning("tracing: spans still queued after %.0f s at shutdown were not exported", timeout)


class _CountingExporter:
    """The OTLP exporter, its outcomes counted (``exported``, ``export_failed``) and a failing
    collector logged once per outage (the SDK logs every failed export). Runs on the span
    processor's thread."""

    def __init__(self, exporter: Any, count: Callable[[str, int], None], where: str) -> None:
        from opentelemetry.sdk.trace.export import SpanExportResult

        self._exporter, self._count, self._where = exporter, count, where
        self._success = SpanExportResult.SUCCESS
        self._failure = SpanExportResult.FAILURE
        self._failing = False

    def export(self, batch) -> Any:
        try:
            result = self._exporter.export(batch)
        except Exception as exc:  # noqa: BLE001 - an exporter's error stays on this thread
            result, why = self._failure, f"{type(exc).__name__}: {exc}"
        else:
            why = "the collector did not take them"
        if result is self._success:
            self._count("exported", len(batch))
            if self._failing:
                self._failing = False
                log.info("tracing: exporting to %s again", self._where)
        else:
            self._count("export_failed", len(batch))
            if not self._failing:
                self._failing = True
                log.warning("tracing: exporting %d spans to %s failed (%s); spans are lost until it answers "
                            "(sp_tracing_spans_total{outcome=\"export_failed\"})", len(batch), self._where, why)
        return result

    def shutdown(self, *args: Any, **kwargs: Any) -> None:
        self._exporter.shutdown(*args, **kwargs)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._exporter.force_flush(timeout_millis)
