"""processor.spans (issue 46) over the OpenTelemetry SDK with an in-memory exporter: nothing is
made while no span is current; stages nest and carry errors; the stores' figures land on the
lookup span; a batch's spans link both ways; loads are traces of their own; the reference
batcher makes the queue and batch spans of the requests OpenTelemetry sampled."""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytest.importorskip("opentelemetry.sdk", reason="the server extra installs the OpenTelemetry SDK")

from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import StatusCode  # noqa: E402

from fakes import FakeGroup  # noqa: E402
from processor import spans  # noqa: E402
from processor.batching.batcher import Batcher  # noqa: E402
from processor.batching.settings import BatchingConfig  # noqa: E402
from processor.errors import InvalidArgument  # noqa: E402
from processor.features.store_metrics import StoreMetrics  # noqa: E402


@pytest.fixture
def exported():
    """Spans made from now on (the tracer enabled for the test), ended ones in the exporter."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    spans.enable(provider.get_tracer("test"))
    yield exporter
    spans.disable()
    provider.shutdown()


def names(exporter) -> list[str]:
    return [s.name for s in exporter.get_finished_spans()]


def test_nothing_is_made_without_a_current_span(exported):
    assert spans.current.get() is None
    assert spans.stage("decode") is spans.NO_SPAN
    with spans.stage("decode") as opened:
        opened.set("k", 1)  # a no-op
    spans.annotate({"k": 1})
    assert names(exported) == []


def test_work_timed_elsewhere_becomes_a_child_span_with_its_times(exported):
    spans.finished("decode", 1_000, 2_000)  # no current span: nothing
    assert names(exported) == []
    with spans.background("root"):
        spans.finished("decode", 1_000, 2_000, {"sp.rows": 4})
    decode, root = exported.get_finished_spans()
    assert decode.parent.span_id == root.context.span_id and decode.context.trace_id == root.context.trace_id
    assert (decode.start_time, decode.end_time, decode.attributes["sp.rows"]) == (1_000, 2_000, 4)


def test_nothing_is_made_while_disabled():
    root = object()  # never touched: stage returns before using it
    token = spans.current.set(root)
    try:
        assert spans.stage("decode") is spans.NO_SPAN
        assert spans.background("model.load") is spans.NO_SPAN
    finally:
        spans.current.reset(token)


def test_stages_nest_under_the_current_span_and_carry_errors(exported):
    with spans.background("root") as root:
        with spans.stage("engine.run", {"sp.lane": 1}) as run:
            assert spans.current.get() is run.span
            with spans.stage("feature_store.lookup"):
                spans.annotate({"sp.ids": 3})
            with spans.stage("warmup", leaf=True):
                assert spans.current.get() is run.span  # a leaf is not current
        with pytest.raises(InvalidArgument), spans.stage("decode"):
            raise InvalidArgument("input 'x': bad shape")
    assert spans.current.get() is None
    done = {s.name: s for s in exported.get_finished_spans()}
    assert set(done) == {"root", "engine.run", "feature_store.lookup", "warmup", "decode"}
    root_id = root.span.get_span_context().span_id
    assert done["root"].parent is None
    assert done["engine.run"].parent.span_id == root_id and done["decode"].parent.span_id == root_id
    run_id = done["engine.run"].context.span_id
    assert done["feature_store.lookup"].parent.span_id == run_id
    assert done["warmup"].parent.span_id == run_id
    assert done["feature_store.lookup"].attributes["sp.ids"] == 3
    assert done["engine.run"].attributes["sp.lane"] == 1
    assert done["decode"].status.status_code is StatusCode.ERROR
    assert done["decode"].status.description == "input 'x': bad shape"
    assert {s.context.trace_id for s in done.values()} == {root.span.get_span_context().trace_id}


def test_background_traces_only_when_asked(exported):
    spans.enable(spans._state.tracer, background=False)
    assert spans.background("model.load") is spans.NO_SPAN


def test_store_metrics_fill_the_lookup_span(exported):
    metrics = StoreMetrics("redis")
    counts = np.array([[4, 2], [1, 0], [3, 1], [1, 1]], np.int64)  # ids, defaults, hits, misses per table
    metrics.record(0.001, ("a", "b"), counts, "redis_cache")  # no span current: nothing
    with spans.background("request"), spans.stage("feature_store.lookup"):
        metrics.record(0.001, ("a", "b"), counts, "redis_cache")
    lookup = next(s for s in exported.get_finished_spans() if s.name == "feature_store.lookup")
    assert dict(lookup.attributes) == {"sp.store": "redis", "sp.tier": "redis_cache", "sp.tables": 2, "sp.ids": 6,
                                       "sp.default_vectors": 1, "sp.cache_hits": 4, "sp.cache_misses": 2}
    assert metrics.snapshot()["latency"]["count"] == 2  # the metrics are counted either way


def test_a_batch_links_its_requests_and_they_link_it(exported):
    recorders = []
    with spans.background("request 1"):
        first = spans.SpanRecorder()
        with first.stage("run"):
            recorders.append((first, 1_000.0))
    with spans.background("request 2"):
        second = spans.SpanRecorder()
        with second.stage("run"):
            recorders.append((second, 1_500.0))
    spans.batch_ran(recorders + [(object(), 0.0)], 2_000.0, 3_000.0, lane=1, rows=5, requests=3,
                    backend="onnxruntime")
    done = exported.get_finished_spans()
    batch = next(s for s in done if s.name == "batch.run")
    queues = [s for s in done if s.name == "batch.queue"]
    run_ids = [r.parent.get_span_context() for r, _ in recorders]
    assert batch.parent.span_id == run_ids[0].span_id and batch.context.trace_id == run_ids[0].trace_id
    assert {(link.context.trace_id, link.context.span_id) for link in batch.links} == {
        (c.trace_id, c.span_id) for c in run_ids}
    assert dict(batch.attributes) == {"sp.rows": 5, "sp.requests": 3, "sp.lane": 1, "sp.backend": "onnxruntime"}
    assert (batch.start_time, batch.end_time) == (2_000_000, 3_000_000)
    assert sorted(q.parent.span_id for q in queues) == sorted(c.span_id for c in run_ids)
    assert all([link.context.span_id for link in q.links] == [batch.context.span_id] for q in queues)
    assert sorted((q.start_time, q.end_time) for q in queues) == [(1_000_000, 2_000_000), (1_500_000, 2_000_000)]


def test_the_reference_batcher_makes_the_batch_spans(exported):
    group = FakeGroup()
    batcher = Batcher("m", BatchingConfig(max_batch_size=2, batch_timeout_micros=10_000_000, num_batch_threads=1))
    group.hold()
    results = {}

    def call(i: int) -> None:
        with spans.background(f"request {i}"):
            rec = spans.SpanRecorder()
            with rec.stage("run"):
                results[i] = batcher.run(group, {"x": np.full((1, 1), float(i), np.float32)}, ("y",), None, rec)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    group.entered.wait(10)
    group.release.set()
    for t in threads:
        t.join(10)
    batcher.close(10)
    assert [float(results[i][0][0, 0]) for i in range(2)] == [0.0, 2.0]
    assert group.calls == [(2, ("y",))]  # one merged run
    assert sorted(names(exported)).count("batch.queue") == 2
    batch = next(s for s in exported.get_finished_spans() if s.name == "batch.run")
    assert batch.attributes["sp.requests"] == 2 and batch.attributes["sp.rows"] == 2
    assert len(batch.links) == 2
