"""A request outcome's metric children (server/metrics.py RequestMetrics): counts, latency, and a
traced request's ids as its latency bucket's exemplar, at most one per bucket per second."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import CollectorRegistry, Counter, Histogram

from server import metrics


def exemplars(histogram: Histogram) -> dict[str, dict]:
    """``le`` -> the exemplar's labels, of the buckets that hold one."""
    out = {}
    for family in histogram.collect():
        for sample in family.samples:
            if sample.name.endswith("_bucket") and sample.exemplar is not None:
                out[sample.labels["le"]] = sample.exemplar.labels
    return out


def test_a_bucket_takes_a_new_exemplar_at_most_once_a_second(monkeypatch):
    registry = CollectorRegistry()
    latency = Histogram("lat", "l", ["m"], buckets=(0.001, 0.01, 0.1), registry=registry).labels("x")
    count = Counter("req", "r", ["m"], registry=registry).labels("x")
    request = metrics.RequestMetrics(count, latency, None)
    now = [1000.0]
    monkeypatch.setattr(metrics.time, "monotonic", lambda: now[0])
    span = lambda t, s: SimpleNamespace(trace_id=t, span_id=s)  # noqa: E731

    request.observe(0.0005, span(1, 2))
    request.observe(0.0007, span(3, 4))  # the same bucket, within the second: not taken
    request.observe(0.05, span(5, 6))  # another bucket: taken
    request.observe(0.0002)  # untraced
    got = exemplars(latency)
    assert got["0.001"] == {"trace_id": f"{1:032x}", "span_id": f"{2:016x}"}
    assert got["0.1"] == {"trace_id": f"{5:032x}", "span_id": f"{6:016x}"}
    now[0] += metrics.EXEMPLAR_SECONDS
    request.observe(0.0009, span(7, 8))  # a second later: the bucket's exemplar is replaced
    assert exemplars(latency)["0.001"]["trace_id"] == f"{7:032x}"
    request.observe(5.0, span(9, 10))  # past the last bound: the +Inf bucket
    assert exemplars(latency)["+Inf"]["span_id"] == f"{10:016x}"
    assert count._value.get() == 6
