"""StoreMetrics: one model's feature store counters, for ``/metrics``, across its versions.

Filled on the request path by the version tables (one :meth:`StoreMetrics.record` per lookup
call: a lock and a few integer adds, no Prometheus call, no allocation), read at scrape time
by the server's collector (``server/metrics.py``) through
:meth:`~processor.served_model.ServedModel.feature_store_metrics`. Counters only grow: a new
version adds to the same per-table counters.

Per table: ids looked up, default vectors served (ids the store does not hold), and per cache
tier (``redis_cache``: the hot-row cache in front of Redis; ``dram_cache``: the DRAM cache of
the DRAM+SSD store) the hits and misses. Per store: the latency of whole lookup calls (all
tables of a request at once) as a histogram, and for Redis the connection errors and the
recoveries (reconnects after an outage).

Thread-safe.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field
from typing import Any

# Upper bounds (seconds) of the latency buckets; +Inf is implied.
LATENCY_BUCKETS = (0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2,
                   0.5, 1.0, 2.0, 5.0)


@dataclass
class TableCounters:
    ids: int = 0
    default_vectors: int = 0
    hits: dict[str, int] = field(default_factory=dict)    # by tier
    misses: dict[str, int] = field(default_factory=dict)  # by tier


class StoreMetrics:
    """See the module doc. ``store``: the store kind (the ``store`` label)."""

    def __init__(self, store: str) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._tables: dict[str, TableCounters] = {}
        self._buckets = [0] * (len(LATENCY_BUCKETS) + 1)
        self._sum = 0.0
        self._count = 0
        self.redis_errors = 0
        self.redis_reconnects = 0

    def record(self, seconds: float, per_table: list[tuple[str, int, int, int, int]], tier: str = "") -> None:
        """One lookup call: its latency and, per table, (name, ids, default vectors, cache hits,
        cache misses); hits and misses count under ``tier`` (no tier: none counted)."""
        i = bisect.bisect_left(LATENCY_BUCKETS, seconds)
        with self._lock:
            self._buckets[i] += 1
            self._sum += seconds
            self._count += 1
            for name, ids, defaults, hits, misses in per_table:
                c = self._tables.get(name)
                if c is None:
                    c = self._tables[name] = TableCounters()
                c.ids += ids
                c.default_vectors += defaults
                if tier:
                    c.hits[tier] = c.hits.get(tier, 0) + hits
                    c.misses[tier] = c.misses.get(tier, 0) + misses

    def count_redis(self, errors: int = 0, reconnects: int = 0) -> None:
        with self._lock:
            self.redis_errors += errors
            self.redis_reconnects += reconnects

    def snapshot(self) -> dict[str, Any]:
        """A consistent copy: ``store``, ``latency`` (cumulative ``buckets`` [(le, count)], ``sum``,
        ``count``), ``tables`` {name: {ids, default_vectors, hits {tier: n}, misses {tier: n}}},
        ``redis_errors``, ``redis_reconnects``."""
        with self._lock:
            running, buckets = 0, []
            for bound, n in zip((*LATENCY_BUCKETS, "+Inf"), self._buckets):
                running += n
                buckets.append((bound, running))
            tables = {name: {"ids": c.ids, "default_vectors": c.default_vectors, "hits": dict(c.hits),
                             "misses": dict(c.misses)} for name, c in self._tables.items()}
            return {"store": self.store, "latency": {"buckets": buckets, "sum": self._sum, "count": self._count},
                    "tables": tables, "redis_errors": self.redis_errors, "redis_reconnects": self.redis_reconnects}
