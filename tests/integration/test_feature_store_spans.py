"""A Redis feature store's lookup under a sampled request (issue 46): the lookup span gets the
store, tier, ids, default vectors and cache hits and misses; each round trip to Redis is a
``redis.pipeline`` span inside it (commands, keys); a lookup the hot-row cache answers whole
makes none. Against a real redis-server on 127.0.0.1."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("opentelemetry.sdk", reason="the server extra installs the OpenTelemetry SDK")

from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from processor import spans  # noqa: E402
from processor.features.redis_client import RedisNodes  # noqa: E402
from processor.features.redis_store import RedisStore  # noqa: E402
from processor.features.redis_url import parse_redis_url  # noqa: E402
from processor.features.rows import RowChunk, TableSpec  # noqa: E402
from tools.local_redis import LocalRedis, redis_server_binary  # noqa: E402

pytestmark = pytest.mark.skipif(redis_server_binary() is None,
                                reason="redis-server is not installed (scripts/setup.sh installs it)")

SPECS = {"emb/a": TableSpec("emb/a", 4, "raw", 100)}


class Source:
    """A TableSource stand-in: ids 0..99, row i = i."""

    full_prefix, delta_prefix, delta_step = "mem://full", "", -1

    def row_count(self, specs):
        return 100

    def rows(self, specs, chunk_rows=1000):
        keys = np.arange(100, dtype=np.int64)
        yield "emb/a", RowChunk(keys, np.repeat(keys[:, None], 4, axis=1).astype(np.float32))


@pytest.fixture
def exported():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    spans.enable(provider.get_tracer("test"))
    yield exporter
    spans.disable()
    provider.shutdown()


def test_a_redis_lookup_and_its_round_trip_are_spans(exported):
    redis = LocalRedis()
    try:
        nodes = RedisNodes(parse_redis_url(redis.url, cluster=False), None, 2, 2, False, socket_timeout=1.0)
        store = RedisStore("redis", nodes, "spans", lock_timeout=30, write_threads=1, cache_bytes=1 << 20)
        nodes.refresh()
        tables = store.open_version("run_1-1", SPECS, Source())
        ids = np.array([1, 2, 3, 1, 500], np.int64)  # 500: not in the table
        tables.lookup([("emb/a", ids)])  # untraced: no span current, none made
        assert exported.get_finished_spans() == ()
        with spans.background("request"):
            with spans.stage("feature_store.lookup"):
                rows = tables.lookup([("emb/a", np.array([4, 5, 1, 600], np.int64))])
            with spans.stage("feature_store.lookup"):
                tables.lookup([("emb/a", np.array([4, 5], np.int64))])  # all cached now: no round trip
        np.testing.assert_array_equal(rows[0][:, 0], [4, 5, 1, 0])
        store.close()
    finally:
        redis.close()
    done = exported.get_finished_spans()
    first, second = [s for s in done if s.name == "feature_store.lookup"]
    assert dict(first.attributes) == {"sp.store": "redis", "sp.tier": "redis_cache", "sp.tables": 1, "sp.ids": 4,
                                      "sp.default_vectors": 1, "sp.cache_hits": 1, "sp.cache_misses": 3}
    assert second.attributes["sp.cache_hits"] == 2 and second.attributes["sp.cache_misses"] == 0
    (trip,) = [s for s in done if s.name == "redis.pipeline"]
    assert trip.parent.span_id == first.context.span_id
    assert trip.attributes["db.system"] == "redis" and trip.attributes["sp.keys"] == 3  # 4, 5, 600
    assert trip.attributes["sp.commands"] >= 1
