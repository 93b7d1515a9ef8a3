"""The way out of a sampled request's spans (issue 46): each span is encoded as OTLP protobuf
when it ends, queued as bytes, and exported in batches by the OpenTelemetry SDK's OTLP exporter
on a thread of its own.

Why not the SDK's ``Span`` objects and ``BatchSpanProcessor``: measured here, a span made and
ended through the SDK's tracer costs ~22 us of CPU and its encoding for export (the SDK's
``encode_spans``) ~30 us more, so tracing every request of a batch-1 server (4-5 spans over a
~80 us request) cut its rate to a quarter. Here a span is a slotted object
(:mod:`server.otel_spans`) whose end encodes it natively (``processor._native.SpanQueue``, ~1 us
with five attributes; :class:`PySpanQueue` is the Python reference it is tested against, and
what runs where the native module is not built). The transport stays the SDK's: the gRPC and
HTTP/protobuf ``OTLPSpanExporter`` (endpoint, headers, TLS, compression, timeouts, retries and
their ``OTEL_EXPORTER_OTLP_*`` variables), given the batch's ``ExportTraceServiceRequest``
ready-made (:func:`otlp_exporter`).

* :class:`ExportWorker`: the batch processor: wakes every ``schedule_delay`` seconds, or when
  ``max_export_batch_size`` spans are queued, and exports what is queued in batches of at most
  that many. A full queue drops the span (counted by the caller); an export that fails or hangs
  delays nothing but this thread.
* :class:`EncodedSpans`: one batch: the request's bytes (resource, scope, spans) and the span
  count.

Thread-safe: spans are queued from any thread; the worker exports on its own.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from processor.protobuf_wire import length_field, tag

log = logging.getLogger("server.otel")


def _field(number: int, body: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return length_field(tag(number), body)


def _any_value(value: Any, nested: bool = False) -> Any:
    """An attribute's value as OTLP's AnyValue (the rules :class:`processor._native.SpanQueue`
    follows: bool, int64, float, str, bytes, a flat list or tuple of those; an int past int64
    and anything else as its ``str``)."""
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue

    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value) if -(1 << 63) <= value < (1 << 63) else AnyValue(string_value=str(value))
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, str):
        return AnyValue(string_value=value)
    if isinstance(value, bytes):
        return AnyValue(bytes_value=value)
    if not nested and isinstance(value, (list, tuple)):
        return AnyValue(array_value=ArrayValue(values=[_any_value(v, True) for v in value]))
    return AnyValue(string_value=str(value))


def key_values(attributes: Mapping[str, Any] | None) -> list:
    """OTLP KeyValues of ``attributes`` (a value of None is no attribute, as in the SDK)."""
    from opentelemetry.proto.common.v1.common_pb2 import KeyValue

    return [KeyValue(key=str(k), value=_any_value(v)) for k, v in (attributes or {}).items() if v is not None]


def _id(value: int, size: int) -> bytes:
    return value.to_bytes(size, "big")


class PySpanQueue:
    """The Python reference of ``processor._native.SpanQueue`` (see its doc in
    ``native/src/module_otlp.cc``): the same arguments, the same frames."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._frames: list[bytes] = []
        self._lock = threading.Lock()

    def add(self, trace_id: int, span_id: int, parent_id: int, flags: int, kind: int, start_ns: int, end_ns: int,
            name: str, attributes: Mapping[str, Any] | None, status_code: int, status_message: str | None,
            trace_state: str | None, links: list[tuple[int, int, int]] | None) -> int:
        from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

        span = Span(trace_id=_id(trace_id, 16), span_id=_id(span_id, 8), name=name, kind=kind,
                    start_time_unix_nano=start_ns, end_time_unix_nano=end_ns, attributes=key_values(attributes),
                    flags=flags, trace_state=trace_state or "")
        if parent_id:
            span.parent_span_id = _id(parent_id, 8)
        for trace, span_of, link_flags in links or ():
            span.links.add(trace_id=_id(trace, 16), span_id=_id(span_of, 8), flags=link_flags)
        if status_code or status_message:
            span.status.CopyFrom(Status(code=status_code, message=status_message or ""))
        frame = _field(2, span.SerializeToString())
        with self._lock:
            if len(self._frames) >= self._capacity:
                return 0
            self._frames.append(frame)
            return len(self._frames)

    def take(self, max_spans: int) -> tuple[bytes, int]:
        with self._lock:
            taken, self._frames = self._frames[:max_spans], self._frames[max_spans:]
        return b"".join(taken), len(taken)

    def __len__(self) -> int:
        return len(self._frames)


def span_queue(capacity: int) -> Any:
    """The native span queue, or the Python reference where ``processor._native`` is not built."""
    from processor import native

    module = native.MODULE
    if module is not None and hasattr(module, "SpanQueue"):
        return module.SpanQueue(capacity)
    return PySpanQueue(capacity)


class EncodedSpans:
    """One export's spans: ``payload``, the ``ExportTraceServiceRequest``'s bytes, and ``len``,
    the spans in it."""

    __slots__ = ("payload", "count")

    def __init__(self, payload: bytes, count: int) -> None:
        self.payload, self.count = payload, count

    def __len__(self) -> int:
        return self.count

    def request(self) -> Any:
        """The payload as the message the gRPC exporter sends."""
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        return ExportTraceServiceRequest.FromString(self.payload)


class Envelope:
    """The bytes around a batch's spans: one ResourceSpans (the process's resource) holding one
    ScopeSpans (the instrumentation scope ``scope``)."""

    def __init__(self, resource_attributes: Mapping[str, Any], scope: str, schema_url: str = "") -> None:
        from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
        from opentelemetry.proto.resource.v1.resource_pb2 import Resource

        self._resource = _field(1, Resource(attributes=key_values(resource_attributes)).SerializeToString())
        self._resource_tail = _field(3, schema_url.encode()) if schema_url else b""
        self._scope = _field(1, InstrumentationScope(name=scope).SerializeToString())

    def wrap(self, frames: bytes, count: int) -> EncodedSpans:
        scope_spans = _field(2, self._scope + frames)
        resource_spans = _field(1, self._resource + scope_spans + self._resource_tail)
        return EncodedSpans(resource_spans, count)


class ExportWorker:
    """Exports ``queue``'s spans through ``exporter`` (a SpanExporter taking
    :class:`EncodedSpans`) on a daemon thread: see the module doc. :meth:`queued` is called by
    whoever queued a span, with what the queue's ``add`` answered; ``dropped()`` is called for
    each span a full queue dropped."""

    def __init__(self, queue: Any, exporter: Any, envelope: Envelope, max_export_batch_size: int,
                 schedule_delay: float, dropped: Callable[[], None] = lambda: None) -> None:
        self.queue, self.exporter, self.envelope, self._dropped = queue, exporter, envelope, dropped
        self.batch, self.delay = max_export_batch_size, schedule_delay
        self._event = threading.Event()
        self._lock = threading.Condition()
        self._flushes = 0  # flushes asked for; _flushed: done
        self._flushed = 0
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="sp-otel-export", daemon=True)
        self._thread.start()

    def queued(self, length: int) -> None:
        """A span was queued, the queue now ``length`` long (0: it was full, the span dropped):
        a batch's worth wakes the thread."""
        if length % self.batch == 0:
            if length:
                self._event.set()
            else:
                self._dropped()

    def _run(self) -> None:
        while True:
            woken = self._event.wait(self.delay)
            self._event.clear()
            with self._lock:
                asked, stopping = self._flushes, self._stopping
            # full batches only, unless the delay is up or a flush asks for everything: under
            # load the queue refills while a batch exports, and exporting whatever is there
            # would send many small batches, each costing an export's fixed price
            self.drain(everything=not woken or asked > self._flushed or stopping)
            with self._lock:
                self._flushed = asked
                self._lock.notify_all()
            if stopping:
                return

    def drain(self, everything: bool = True) -> None:
        """Export what is queued, a batch at a time, on the worker's thread: everything, or
        (``everything`` False) as long as a full batch is queued."""
        while everything or len(self.queue) >= self.batch:
            frames, count = self.queue.take(self.batch)
            if not count:
                return
            try:
                self.exporter.export(self.envelope.wrap(frames, count))
            except Exception:  # noqa: BLE001 - an exporter's error stays on this thread
                log.exception("tracing: exporting %d spans failed", count)

    def force_flush(self, timeout: float = 30.0) -> bool:
        """Export what is queued now; False if that took longer than ``timeout`` seconds."""
        with self._lock:
            self._flushes += 1
            target = self._flushes
            self._event.set()
            return self._lock.wait_for(lambda: self._flushed >= target or not self._thread.is_alive(), timeout)

    def shutdown(self) -> None:
        """Export what is queued, stop the thread, shut the exporter down (may block for as long
        as the exporter's timeout; the caller bounds it)."""
        with self._lock:
            self._stopping = True
            self._flushes += 1
        self._event.set()
        self._thread.join()
        self.exporter.shutdown()


def otlp_exporter(protocol: str, endpoint: str | None, headers: dict[str, str] | None,
                  timeout: float | None) -> Any:
    """The SDK's OTLP span exporter of ``protocol`` (``grpc``, ``http/protobuf``), taking
    :class:`EncodedSpans` in place of SDK spans."""
    if protocol == "grpc":
        return _grpc_exporter_class()(endpoint=endpoint, headers=headers, timeout=timeout)
    return _http_exporter_class()(endpoint=endpoint, headers=headers, timeout=timeout)


def _grpc_exporter_class() -> type:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    class GrpcExporter(OTLPSpanExporter):
        """The SDK's gRPC exporter (its channel, retries, timeouts) sending our batch's request."""

        def _translate_data(self, data: EncodedSpans) -> Any:
            return data.request()

        def _count_data(self, data: EncodedSpans) -> int:
            return len(data)

    return GrpcExporter


def _http_exporter_class() -> type:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    class HttpExporter(OTLPSpanExporter):
        """The SDK's HTTP/protobuf exporter (its session, compression, retries, timeouts)
        posting our batch's bytes: its ``export`` less the encoding."""

        def export(self, data: EncodedSpans) -> SpanExportResult:
            if self._shutdown:
                return SpanExportResult.FAILURE
            with self._metrics.export_operation(len(data)) as result:
                outcome = self._client.export(data.payload)
                if not outcome.success:
                    result.error = outcome.error
                    return SpanExportResult.FAILURE
            return SpanExportResult.SUCCESS

    return HttpExporter

