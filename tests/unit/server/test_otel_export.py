"""The server's span pipeline (server/otel_spans.py, server/otel_export.py): spans encoded at
their end by the native queue, which must write what its Python reference writes, and what the
OpenTelemetry SDK's own encoder writes for the same span; batches wrapped into the request the
SDK's exporter sends; the export thread's flushes, drops and failures."""

from __future__ import annotations

import random
import threading

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace  # noqa: E402
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: E402
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402
from opentelemetry.proto.trace.v1.trace_pb2 import ScopeSpans  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan  # noqa: E402
from opentelemetry.sdk.trace.export import SpanExportResult  # noqa: E402
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState  # noqa: E402
from opentelemetry.trace.status import Status, StatusCode  # noqa: E402

from processor import native  # noqa: E402
from server import otel_export, otel_spans  # noqa: E402

needs_native = pytest.mark.skipif(native.MODULE is None or not hasattr(native.MODULE, "SpanQueue"),
                                  reason="processor._native is not built (scripts/build_native.sh)")


def random_value(rng: random.Random, nested: bool = False):
    kind = rng.randrange(8 if not nested else 6)
    if kind == 0:
        return rng.random() < 0.5
    if kind == 1:
        return rng.randrange(-(1 << 63), 1 << 63)
    if kind == 2:
        return rng.choice([0.0, -1.5, 1e300, float("inf"), rng.random()])
    if kind == 3:
        return "".join(rng.choice("abcé€𝄞 ") for _ in range(rng.randrange(12)))
    if kind == 4:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(6)))
    if kind == 5:
        return rng.choice([1 << 70, -(1 << 64), object.__name__])  # past int64: written as digits
    if kind == 6:
        return [random_value(rng, True) for _ in range(rng.randrange(4))]
    return None  # no attribute


def random_span(rng: random.Random) -> tuple:
    attributes = {f"k{i}": random_value(rng) for i in range(rng.randrange(6))} if rng.random() < 0.9 else None
    links = [(rng.getrandbits(128) or 1, rng.getrandbits(64) or 1, rng.choice([0x100, 0x300]))
             for _ in range(rng.randrange(3))] or None
    code = rng.choice([0, 1, 2])
    return (rng.getrandbits(128) or 1, rng.getrandbits(64) or 1, rng.choice([0, rng.getrandbits(64)]),
            rng.choice([0x100, 0x300]), rng.randrange(1, 6), rng.getrandbits(62), rng.getrandbits(62),
            rng.choice(["decode", "POST predict", "é" * 3, ""]), attributes, code,
            rng.choice([None, "it failed", "ü"]) if code == 2 else None, rng.choice([None, "a=1,b=2"]), links)


@needs_native
def test_the_native_queue_writes_what_the_reference_writes():
    rng = random.Random(7)
    ours, reference = native.MODULE.SpanQueue(10_000), otel_export.PySpanQueue(10_000)
    for _ in range(2_000):
        args = random_span(rng)
        assert ours.add(*args) == reference.add(*args)
    assert len(ours) == len(reference) == 2_000
    while True:
        (a, n), (b, m) = ours.take(333), reference.take(333)
        assert n == m
        if not n:
            break
        assert ScopeSpans.FromString(a) == ScopeSpans.FromString(b)


@pytest.mark.parametrize("make", [otel_export.PySpanQueue, pytest.param(
    lambda n: native.MODULE.SpanQueue(n), marks=needs_native)], ids=["python", "native"])
def test_a_full_queue_drops_and_take_returns_the_oldest(make):
    queue = make(3)
    added = [queue.add(1, i + 1, 0, 0x100, 1, 0, 1, f"s{i}", None, 0, None, None, None) for i in range(5)]
    assert added == [1, 2, 3, 0, 0]  # the queue's length with each span; 0: dropped
    frames, count = queue.take(2)
    assert count == 2 and [s.name for s in ScopeSpans.FromString(frames).spans] == ["s0", "s1"]
    frames, count = queue.take(10)
    assert count == 1 and [s.name for s in ScopeSpans.FromString(frames).spans] == ["s2"]
    assert queue.take(10) == (b"", 0) and len(queue) == 0


class Keep:
    """A SpanExporter keeping what it is given (or failing, or raising)."""

    def __init__(self, outcome: str = "ok") -> None:
        self.outcome = outcome
        self.batches: list[otel_export.EncodedSpans] = []
        self.shut = False

    def export(self, batch):
        if self.outcome == "raise":
            raise RuntimeError("the collector is gone")
        self.batches.append(batch)
        return SpanExportResult.SUCCESS if self.outcome == "ok" else SpanExportResult.FAILURE

    def shutdown(self):
        self.shut = True

    def spans(self) -> list:
        return [s for b in self.batches for rs in b.request().resource_spans
                for ss in rs.scope_spans for s in ss.spans]


def pipeline(exporter, capacity: int = 1000, batch: int = 10, delay: float = 30.0):
    queue = otel_export.span_queue(capacity)
    envelope = otel_export.Envelope({"service.name": "recs", "process.pid": 7}, "serving-processor")
    dropped = []
    worker = otel_export.ExportWorker(queue, exporter, envelope, batch, delay, lambda: dropped.append(1))
    return otel_spans.Tracer(queue, worker.queued), worker, dropped


def test_spans_nest_and_reach_the_exporter_in_batches_under_the_resource():
    kept = Keep()
    tracer, worker, _ = pipeline(kept, batch=4)
    caller = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1),
                         trace_state=TraceState([("vendor", "x")]))
    edge = tracer.start_span("POST predict", context=trace.set_span_in_context(NonRecordingSpan(caller)),
                             kind=trace.SpanKind.SERVER, attributes={"sp.model": "m"})
    child = tracer.start_span("decode", context=tracer.in_context(edge))
    child.end()
    tracer.record(edge, "encode", 10, 20, {"sp.rows": 3})
    edge.set_status(Status(StatusCode.ERROR, "bad input"))
    edge.end()
    edge.end()  # a second end does nothing
    root = tracer.start_span("model.load", links=[tracer.link(edge)])
    root.end()
    assert worker.force_flush(10)
    got = {s.name: s for s in kept.spans()}
    assert set(got) == {"POST predict", "decode", "encode", "model.load"}
    assert all(len(b) <= 4 for b in kept.batches)
    e = got["POST predict"]
    assert int.from_bytes(e.trace_id, "big") == 0xABC and int.from_bytes(e.parent_span_id, "big") == 0xDEF
    assert e.kind == 2 and e.flags == 0x300 and e.trace_state == "vendor=x"  # a remote parent
    assert e.status.code == 2 and e.status.message == "bad input"
    for name in ("decode", "encode"):
        assert got[name].trace_id == e.trace_id and got[name].parent_span_id == e.span_id
        assert got[name].flags == 0x100 and got[name].kind == 1
    assert got["encode"].start_time_unix_nano == 10 and got["encode"].attributes[0].value.int_value == 3
    load = got["model.load"]
    assert load.trace_id != e.trace_id and not load.parent_span_id and load.links[0].span_id == e.span_id
    resource = kept.batches[0].request().resource_spans[0]
    assert {kv.key for kv in resource.resource.attributes} == {"service.name", "process.pid"}
    assert resource.scope_spans[0].scope.name == "serving-processor"
    assert edge.get_span_context().trace_id == 0xABC  # as the API's SpanContext, for links
    worker.shutdown()
    assert kept.shut


def test_a_span_encodes_as_the_sdks_encoder_encodes_it():
    kept = Keep()
    tracer, worker, _ = pipeline(kept)
    caller = SpanContext(0x1234, 0x5678, is_remote=True, trace_flags=TraceFlags(1))
    span = tracer.start_span("POST predict", context=trace.set_span_in_context(NonRecordingSpan(caller)),
                             kind=trace.SpanKind.SERVER, start_time=1_000,
                             attributes={"s": "x", "i": 3, "f": 0.5, "b": True, "l": [1, 2]})
    span.set_status(Status(StatusCode.ERROR, "no"))
    span.end(end_time=2_000)
    assert worker.force_flush(10)
    (ours,) = kept.spans()
    sdk = ReadableSpan(name="POST predict", context=SpanContext(0x1234, span.span_id, is_remote=False,
                                                                trace_flags=TraceFlags(1)),
                       parent=caller, attributes={"s": "x", "i": 3, "f": 0.5, "b": True, "l": (1, 2)},
                       kind=trace.SpanKind.SERVER, start_time=1_000, end_time=2_000,
                       status=Status(StatusCode.ERROR, "no"))
    (theirs,) = encode_spans([sdk]).resource_spans[0].scope_spans[0].spans
    assert ours == theirs
    worker.shutdown()


def test_a_full_queue_drops_and_a_failing_exporter_stops_nothing():
    for outcome in ("fail", "raise"):
        exporter = Keep(outcome)
        tracer, worker, dropped = pipeline(exporter, capacity=5, batch=5)
        worker.batch = 1 << 40  # the thread never wakes on its own here: the queue fills
        for i in range(8):
            tracer.start_span(f"s{i}").end()
        assert len(dropped) == 3
        assert worker.force_flush(10)  # the exporter failed (or raised): the thread goes on
        tracer.start_span("after").end()
        assert worker.force_flush(10)
        worker.shutdown()


def test_flushes_from_many_threads_all_return():
    kept = Keep()
    tracer, worker, _ = pipeline(kept, capacity=100_000, batch=64, delay=0.01)

    def work():
        for _ in range(200):
            tracer.start_span("s").end()
        assert worker.force_flush(10)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert worker.force_flush(10)
    assert sum(len(b) for b in kept.batches) == 800
    worker.shutdown()
