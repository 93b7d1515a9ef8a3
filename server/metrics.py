"""Prometheus metrics of one server process (its own registry, so tests can build several).

Served at ``/metrics`` and at TF Serving's ``/monitoring/prometheus/metrics`` on the HTTP port.

Per request: ``sp_requests`` by final status code (labels ``model``, ``version``, ``protocol``,
``api``, ``code``), ``sp_request_errors`` (``model``, ``protocol``, ``api``, ``code``), the latency
histogram (``model``, ``version``, ``protocol``, ``api``) and the requests in flight (``protocol``).
The native gRPC server (server/grpc/native_server.py) counts its calls by where they were
answered: ``sp_grpc_native_calls{path}``, ``direct`` (no Python) or ``bridged``.
Model updates the server triggers (start, admin reload / rollback / pin): duration histogram and
failure count. With worker processes (``PROMETHEUS_MULTIPROC_DIR``, set by server/supervisor.py)
these are written to files and a scrape sums every worker's.

Read at scrape time from the live objects of the process that answers the scrape:

* per model, from its :class:`~processor.served_model.ServedModel`: ready, every served version
  (``sp_model_served_version``, one sample each) and how many serve, full loads / deltas /
  failed updates (the watcher's included, refused loads too) and the duration of the last
  update of each kind; the bytes each served version holds by part
  (``sp_model_memory_bytes{model, version, part}``); its shadow copies by outcome
  (``sp_shadow_requests{model, outcome}``: offered, ran, failed, dropped, shed); freshness
  (:mod:`processor.manager.freshness`): per served version (its number) the age of the parameters
  it serves (``sp_model_data_age_seconds``: now minus when its served step was written) and that
  step (``sp_model_served_step``), and the deltas' publication-to-serving time
  (``sp_model_delta_publish_to_serve_seconds``, a histogram);
* batching (models with ``batching``, :meth:`processor.dataplane.DataPlane.batching_info`): merged
  batch sizes and queue waits (histograms), requests and rows queued, requests run alone, retried
  alone after a failed merged call, refused (queue full) or expired;
* feature stores (:meth:`~processor.served_model.ServedModel.feature_store_metrics`, filled on the
  request path by the store, see :mod:`processor.features.store_metrics`): lookup latency
  (histogram, per model and store), per table the ids looked up, default vectors served and the
  hits / misses of each cache tier, rows deltas removed and rows ``row_ttl_steps`` expired, Redis
  connection errors and reconnects;
* prediction logging (models with ``logging_config``): records written / dropped (queue full) /
  failed, write and upload errors, records queued;
* a ranking request's context (models whose requests may send inputs once for every row,
  :mod:`processor.context`; the served default version's, so a new version starts at 0):
  ``sp_context_requests{path}`` (its part run once, tiled, refused), with ``context_cache``
  ``sp_context_cache_lookups{result}`` (hit, miss), ``sp_context_cache_bytes``,
  ``sp_context_cache_entries``, ``sp_context_cache_dropped{reason}`` (evicted, expired,
  invalidated by a delta).

OpenTelemetry tracing (``tracing``, server/otel.py): ``sp_tracing_spans{outcome}``, the spans
exported, dropped (the export queue was full) and lost in failed exports; a sampled request's
trace and span ids are its latency observation's exemplar, shown in the OpenMetrics exposition
(:meth:`ServerMetrics.render` with ``openmetrics``; a scraper asking for
``application/openmetrics-text`` gets it; not with worker processes, whose file-backed metrics
keep no exemplars).
"""

from __future__ import annotations

import bisect
import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
UNKNOWN_MODEL = "_unknown"  # label for requests naming no served model (bounded cardinality)
_LATENCY_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10)
_UPDATE_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class _ModelStateCollector(Collector):
    def __init__(self, models: Callable[[], Iterable[Any]]) -> None:
        self._models = models

    def collect(self):
        ready = GaugeMetricFamily("sp_model_ready", "1 when the model serves a version", labels=["model"])
        version = GaugeMetricFamily("sp_model_served_version",
                                    "full checkpoint step served (-1: the SavedModel's variables)",
                                    labels=["model", "version"])
        full = CounterMetricFamily("sp_model_full_loads", "full versions loaded", labels=["model"])
        deltas = CounterMetricFamily("sp_model_delta_updates", "deltas applied in place", labels=["model"])
        failed = CounterMetricFamily("sp_model_failed_updates", "loads and deltas that failed",
                                     labels=["model"])
        last = GaugeMetricFamily("sp_model_last_update_seconds", "duration of the last update",
                                 labels=["model", "kind"])
        count = GaugeMetricFamily("sp_model_versions_served", "versions served side by side", labels=["model"])
        held = GaugeMetricFamily("sp_model_memory_bytes", "bytes a served version holds, by part",
                                 labels=["model", "version", "part"])
        shadow = CounterMetricFamily("sp_shadow_requests", "shadow copies of requests, by outcome",
                                     labels=["model", "outcome"])
        age = GaugeMetricFamily("sp_model_data_age_seconds", "now minus when the step a version serves was "
                                "written (the checkpoint's timestamp, else its mtime)", labels=["model", "version"])
        step = GaugeMetricFamily("sp_model_served_step", "the training step whose parameters a version serves",
                                 labels=["model", "version"])
        publish = HistogramMetricFamily("sp_model_delta_publish_to_serve_seconds", "from a delta's writing to "
                                        "its serving, deltas applied in place", labels=["model"])
        for model in self._models():
            name = model.name
            ready.add_metric([name], 1.0 if model.ready else 0.0)
            versions = model.served_versions()
            count.add_metric([name], float(len(versions)))
            for served in versions:
                version.add_metric([name, served.label], float(served.full_step))
            for number, parts in model.memory().items():
                for part, value in parts.items():
                    held.add_metric([name, number, part], float(value))
            fresh = getattr(model, "freshness", lambda: None)()
            if fresh is not None:
                for v in fresh["versions"]:
                    step.add_metric([name, str(v["version"])], float(v["served_step"]))
                    if v["data_age_seconds"] is not None:
                        age.add_metric([name, str(v["version"])], float(v["data_age_seconds"]))
                h = fresh["delta_publish_to_serve_seconds"]
                publish.add_metric([name], [(_le(b), float(n)) for b, n in h["buckets"]], sum_value=h["sum"])
            for outcome, value in model.shadow.stats().items():
                if outcome in ("offered", "ran", "failed", "dropped", "shed"):
                    shadow.add_metric([name, outcome], float(value))
            stats = model.stats
            for family, key in ((full, "full_loads"), (deltas, "delta_updates"), (failed, "failed_updates")):
                if stats.get(key) is not None:
                    family.add_metric([name], float(stats[key]))
            for kind, key in (("full", "last_full_load_seconds"), ("delta", "last_delta_seconds")):
                if stats.get(key) is not None:
                    last.add_metric([name, kind], float(stats[key]))
        yield from (ready, version, count, full, deltas, failed, last, held, shadow, age, step, publish)


class _BatchingCollector(Collector):
    """Reads :meth:`processor.dataplane.DataPlane.batching_info` of every batching model."""

    _EVENTS = ("run_alone", "isolated_retries", "rejected_queue_full", "expired")

    def __init__(self, batching: Callable[[], Mapping[str, dict | None]]) -> None:
        self._batching = batching

    def collect(self):
        size = HistogramMetricFamily("sp_batch_size", "rows per merged engine call (padding excluded)",
                                     labels=["model"])
        wait = HistogramMetricFamily("sp_batch_queue_wait_seconds", "time a request waited for its batch",
                                     labels=["model"])
        depth = GaugeMetricFamily("sp_batch_queue_depth", "requests waiting for a batch", labels=["model"])
        rows = GaugeMetricFamily("sp_batch_queue_rows", "rows waiting for a batch", labels=["model"])
        events = CounterMetricFamily("sp_batch_events", "requests run alone, retried alone after a failed "
                                     "merged call, refused (queue full) or expired", labels=["model", "event"])
        for name, info in self._batching().items():
            if info is None:
                continue
            for family, key in ((size, "batch_rows"), (wait, "queue_wait_seconds")):
                h = info[key]
                buckets = [(_le(bound), float(count)) for bound, count in h["buckets"]]
                family.add_metric([name], buckets, sum_value=h["sum"])
            depth.add_metric([name], float(info["queued_requests"]))
            rows.add_metric([name], float(info["queued_rows"]))
            for event in self._EVENTS:
                events.add_metric([name, event], float(info[event]))
        yield from (size, wait, depth, rows, events)


class _PredictionLogCollector(Collector):
    """Reads ``prediction_log.describe()`` of every model that logs its predictions."""

    _RECORDS = (("written", "written"), ("dropped", "dropped_queue_full"), ("failed", "failed"))
    _ERRORS = (("write", "write_errors"), ("upload", "upload_errors"))

    def __init__(self, models: Callable[[], Iterable[Any]]) -> None:
        self._models = models

    def collect(self):
        records = CounterMetricFamily("sp_prediction_log_records", "sampled predict calls written to the "
                                      "prediction log, dropped (queue full) or failed", labels=["model", "outcome"])
        errors = CounterMetricFamily("sp_prediction_log_sink_errors", "prediction log writes and uploads "
                                     "that failed", labels=["model", "kind"])
        queued = GaugeMetricFamily("sp_prediction_log_queued", "records waiting for the prediction log "
                                   "writer", labels=["model"])
        for model in self._models():
            logger = getattr(model, "prediction_log", None)
            if logger is None:
                continue
            info = logger.describe()
            for outcome, key in self._RECORDS:
                records.add_metric([model.name, outcome], float(info[key]))
            for kind, key in self._ERRORS:
                errors.add_metric([model.name, kind], float(info[key]))
            queued.add_metric([model.name], float(info["queued"]))
        yield from (records, errors, queued)


class _FeatureStoreCollector(Collector):
    """Reads :meth:`processor.served_model.ServedModel.feature_store_metrics` of every model."""

    def __init__(self, models: Callable[[], Iterable[Any]]) -> None:
        self._models = models

    def collect(self):
        latency = HistogramMetricFamily("sp_feature_store_latency_seconds",
                                        "feature store lookups (all tables of a request)",
                                        labels=["model", "store", "op"])
        ids = CounterMetricFamily("sp_feature_store_ids", "ids looked up", labels=["model", "table"])
        defaults = CounterMetricFamily("sp_feature_store_default_vectors",
                                       "ids the store does not hold, served the default vector",
                                       labels=["model", "table"])
        hits = CounterMetricFamily("sp_feature_store_cache_hits", "distinct ids of a lookup found in a "
                                   "cache tier", labels=["model", "table", "tier"])
        misses = CounterMetricFamily("sp_feature_store_cache_misses", "distinct ids of a lookup a cache "
                                     "tier did not hold", labels=["model", "table", "tier"])
        removed = CounterMetricFamily("sp_feature_store_rows_removed", "rows deltas removed", labels=["model", "table"])
        expired = CounterMetricFamily("sp_feature_store_rows_expired", "rows dropped at a delta for row_ttl_steps",
                                      labels=["model", "table"])
        errors = CounterMetricFamily("sp_feature_store_redis_errors", "Redis connection errors and "
                                     "timeouts", labels=["model"])
        reconnects = CounterMetricFamily("sp_feature_store_redis_reconnects", "recoveries after a Redis "
                                         "outage", labels=["model"])
        for model in self._models():
            snap = getattr(model, "feature_store_metrics", lambda: None)()
            if snap is None:
                continue
            name = model.name
            lat = snap["latency"]
            latency.add_metric([name, snap["store"], "lookup"], [(_le(b), float(n)) for b, n in lat["buckets"]],
                               sum_value=lat["sum"])
            for table, c in snap["tables"].items():
                ids.add_metric([name, table], float(c["ids"]))
                defaults.add_metric([name, table], float(c["default_vectors"]))
                for tier, n in c["hits"].items():
                    hits.add_metric([name, table, tier], float(n))
                for tier, n in c["misses"].items():
                    misses.add_metric([name, table, tier], float(n))
                removed.add_metric([name, table], float(c["removed"]))
                expired.add_metric([name, table], float(c["expired"]))
            if snap["store"] in ("redis", "cluster_redis"):
                errors.add_metric([name], float(snap["redis_errors"]))
                reconnects.add_metric([name], float(snap["redis_reconnects"]))
        yield from (latency, ids, defaults, hits, misses, removed, expired, errors, reconnects)


class _ContextCollector(Collector):
    """Reads :meth:`processor.served_model.ServedModel.context_stats` of every model (issue 47)."""

    _PATHS = (("context_once", "context_once"), ("tiled", "tiled"), ("refused", "refused"))
    _DROPS = (("evicted", "evictions"), ("expired", "expired"), ("invalidated", "invalidations"))

    def __init__(self, models: Callable[[], Iterable[Any]]) -> None:
        self._models = models

    def collect(self):
        requests = CounterMetricFamily("sp_context_requests", "requests sending a context once for every row: its "
                                       "part run once, tiled, or refused", labels=["model", "path"])
        lookups = CounterMetricFamily("sp_context_cache_lookups", "context cache lookups", labels=["model", "result"])
        held = GaugeMetricFamily("sp_context_cache_bytes", "bytes the context cache holds", labels=["model"])
        entries = GaugeMetricFamily("sp_context_cache_entries", "contexts the cache holds", labels=["model"])
        dropped = CounterMetricFamily("sp_context_cache_dropped", "cached contexts dropped: evicted, expired, "
                                      "or every one at a delta (invalidated)", labels=["model", "reason"])
        for model in self._models():
            stats = getattr(model, "context_stats", lambda: None)()
            if stats is None:
                continue
            name = model.name
            for path, key in self._PATHS:
                requests.add_metric([name, path], float(stats[key]))
            cache = stats["cache"]
            if cache is None:
                continue
            lookups.add_metric([name, "hit"], float(cache["hits"]))
            lookups.add_metric([name, "miss"], float(cache["misses"]))
            held.add_metric([name], float(cache["bytes"]))
            entries.add_metric([name], float(cache["entries"]))
            for reason, key in self._DROPS:
                dropped.add_metric([name, reason], float(cache[key]))
        yield from (requests, lookups, held, entries, dropped)


def _le(bound: float | str) -> str:
    return bound if isinstance(bound, str) else repr(float(bound))


EXEMPLAR_SECONDS = 1.0  # a latency bucket takes a new exemplar at most this often


class RequestMetrics:
    """The metric children one request outcome updates (see :meth:`ServerMetrics.request`).

    A latency bucket keeps one exemplar, the last one given, until the next scrape: a traced
    request's trace ids are given to its bucket when the bucket's exemplar is older than
    :data:`EXEMPLAR_SECONDS` (one per bucket per second is more than any scrape keeps; checking
    each one costs a traced request microseconds). Races between threads only let an extra one
    through."""

    __slots__ = ("_count", "_latency", "_error", "_bounds", "_exemplar_at")

    def __init__(self, count, latency, error) -> None:
        self._count, self._latency, self._error = count, latency, error
        self._bounds = list(getattr(latency, "_upper_bounds", ()))  # the client library's buckets
        self._exemplar_at = [float("-inf")] * (len(self._bounds) + 1)

    def observe(self, seconds: float, span: Any = None) -> None:
        """One request of ``seconds``; ``span``: its edge span (a traced request: its
        ``trace_id`` and ``span_id`` are the exemplar's, when its bucket takes one)."""
        self._count.inc()
        exemplar = None
        if span is not None:
            bucket = bisect.bisect_left(self._bounds, seconds)  # the bucket the library counts it in
            now = time.monotonic()
            if now - self._exemplar_at[bucket] >= EXEMPLAR_SECONDS:
                self._exemplar_at[bucket] = now
                exemplar = {"trace_id": f"{span.trace_id:032x}", "span_id": f"{span.span_id:016x}"}
        self._latency.observe(seconds, exemplar)
        if self._error is not None:
            self._error.inc()


class ServerMetrics:
    """See the module doc. Thread-safe (prometheus_client metrics are)."""

    def __init__(self, models: Callable[[], Iterable[Any]],
                 batching: Callable[[], Mapping[str, dict | None]] | None = None) -> None:
        """``models``: the served models (:class:`~processor.served_model.ServedModel`), read at
        each scrape; ``batching``: their batching info by name."""
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("sp_requests", "requests by final status code",
                                ["model", "version", "protocol", "api", "code"], registry=r)
        self.errors = Counter("sp_request_errors", "failed requests",
                              ["model", "protocol", "api", "code"], registry=r)
        self.latency = Histogram("sp_request_latency_seconds", "request latency in the server",
                                 ["model", "version", "protocol", "api"], buckets=_LATENCY_BUCKETS,
                                 registry=r)
        # with workers (PROMETHEUS_MULTIPROC_DIR): the sum over the live workers
        self.in_flight = Gauge("sp_requests_in_flight", "requests being served", ["protocol"], registry=r,
                               multiprocess_mode="livesum")
        self._bound: dict[tuple[str, ...], RequestMetrics] = {}
        self._in_flight: dict[str, Any] = {}
        self.update_seconds = Histogram("sp_model_update_duration_seconds",
                                        "model loads the server ran (start, reload, rollback, pin)",
                                        ["model", "kind"], buckets=_UPDATE_BUCKETS, registry=r)
        self.update_failures = Counter("sp_model_update_failures", "model loads that failed",
                                       ["model", "kind"], registry=r)
        self.grpc_native_calls = Counter("sp_grpc_native_calls", "calls the native gRPC server answered on "
                                         "the direct path (no Python) or bridged to the Python handlers",
                                         ["path"], registry=r)
        self.tracing_spans = Counter("sp_tracing_spans", "OpenTelemetry spans exported, dropped (the export "
                                     "queue was full) or lost in a failed export", ["outcome"], registry=r)
        # workers > 1 (server/supervisor.py sets PROMETHEUS_MULTIPROC_DIR before a worker starts;
        # prometheus_client reads it at import): the metrics above are written to files there and
        # a scrape reads every worker's (MultiProcessCollector); the collectors below read this
        # worker's live objects, so the worker that answers the scrape reports them.
        multiprocess_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if multiprocess_dir:
            from prometheus_client.multiprocess import MultiProcessCollector

            self._scrape = CollectorRegistry(auto_describe=True)
            MultiProcessCollector(self._scrape, path=multiprocess_dir)
        else:
            self._scrape = r
        self._scrape.register(_ModelStateCollector(models))
        self._scrape.register(_FeatureStoreCollector(models))
        self._scrape.register(_PredictionLogCollector(models))
        self._scrape.register(_ContextCollector(models))
        if batching is not None:
            self._scrape.register(_BatchingCollector(batching))

    def request(self, model: str, version: str, protocol: str, api: str, code: str) -> RequestMetrics:
        """What one request's outcome updates, bound once per label set: the client library's
        label lookup costs more than the update itself, and this runs on every request. The label
        sets are bounded (served models or ``_unknown``, versions, APIs, status codes)."""
        key = (model, version, protocol, api, code)
        bound = self._bound.get(key)
        if bound is None:
            bound = self._bound[key] = RequestMetrics(
                self.requests.labels(model, version, protocol, api, code),
                self.latency.labels(model, version, protocol, api),
                self.errors.labels(model, protocol, api, code) if code != "OK" else None)
        return bound

    def in_flight_of(self, protocol: str) -> Any:
        """The ``sp_requests_in_flight`` gauge of ``protocol``, bound once."""
        gauge = self._in_flight.get(protocol)
        if gauge is None:
            gauge = self._in_flight[protocol] = self.in_flight.labels(protocol)
        return gauge

    def observe_update(self, model: str, kind: str, seconds: float, ok: bool) -> None:
        self.update_seconds.labels(model, kind).observe(seconds)
        if not ok:
            self.update_failures.labels(model, kind).inc()

    def count_spans(self, outcome: str, spans: int) -> None:
        """``spans`` OpenTelemetry spans had ``outcome`` (exported, dropped, export_failed)."""
        self.tracing_spans.labels(outcome).inc(spans)

    def render(self, openmetrics: bool = False) -> bytes:
        """The exposition: Prometheus' text format, or ``openmetrics`` (with exemplars)."""
        if openmetrics:
            from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

            return generate_openmetrics(self._scrape)
        return generate_latest(self._scrape)
