"""StoreMetrics: one model's feature store counters, for ``/metrics``, across its versions.

Filled on the request path by the version tables (one :meth:`StoreMetrics.record` per lookup
call: a lock, a few integer adds and one numpy add for all its tables, no Prometheus call),
read at scrape time by the server's collector (``server/metrics.py``) through
:meth:`~processor.served_model.ServedModel.feature_store_metrics`. Counters only grow: a new
version adds to the same per-table counters.

Per table: ids looked up, default vectors served (ids the store does not hold), and per cache
tier (``redis_cache``: the hot-row cache in front of Redis; ``dram_cache``: the DRAM cache of
the DRAM+SSD store) the hits and misses; rows deltas removed (DRAM, DRAM+SSD: the ids held;
Redis: the ids named, counted by every replica as it applies the delta) and rows
``row_ttl_steps`` expired. Per store: the latency of whole lookup calls (all
tables of a request at once) as a histogram, and for Redis the connection errors and the
recoveries (reconnects after an outage).

Thread-safe.
"""

from __future__ import annotations

import bisect
import threading
from typing import Any

import numpy as np

from .. import spans

# Upper bounds (seconds) of the latency buckets; +Inf is implied.
LATENCY_BUCKETS = (0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2,
                   0.5, 1.0, 2.0, 5.0)


class TableCounts:
    """Integer counters per table, ``rows`` of them, added a lookup call at a time for all of its
    tables with one numpy add (the request path's cost does not grow with the number of tables);
    summed per table when read. Thread-safe."""

    def __init__(self, rows: int) -> None:
        self._rows = rows
        self._lock = threading.Lock()
        self._by_names: dict[tuple[str, ...], np.ndarray] = {}

    def add(self, names: tuple[str, ...], counts: np.ndarray) -> None:
        """``counts``: int64 ``[k, len(names)]``, column ``j`` for ``names[j]``: the first ``k``
        counters (``k <= rows``; the others unchanged)."""
        with self._lock:
            acc = self._by_names.get(names)
            if acc is None:
                acc = self._by_names[names] = np.zeros((self._rows, len(names)), np.int64)
            acc[:len(counts)] += counts

    def totals(self) -> dict[str, np.ndarray]:
        """Per table: its ``rows`` counters (int64)."""
        with self._lock:
            items = [(names, acc.copy()) for names, acc in self._by_names.items()]
        out: dict[str, np.ndarray] = {}
        for names, acc in items:
            for j, name in enumerate(names):
                out[name] = out[name] + acc[:, j] if name in out else acc[:, j].copy()
        return out


class StoreMetrics:
    """See the module doc. ``store``: the store kind (the ``store`` label)."""

    def __init__(self, store: str) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._tables: dict[str, TableCounts] = {}  # by tier ("": none)
        self._buckets = [0] * (len(LATENCY_BUCKETS) + 1)
        self._sum = 0.0
        self._count = 0
        self.redis_errors = 0
        self.redis_reconnects = 0
        self._rows: dict[str, list[int]] = {}  # per table: [removed, expired]

    def record(self, seconds: float, names: tuple[str, ...], counts: np.ndarray, tier: str = "") -> None:
        """One lookup call: its latency and, for its tables ``names``, ``counts`` int64
        ``[4, len(names)]``: ids, default vectors, cache hits, cache misses (the last two may be
        left out: none); hits and misses count under ``tier`` (no tier: none counted). A sampled
        request's ``feature_store.lookup`` span (:mod:`processor.spans`) gets the same figures."""
        if spans.current.get() is not None:
            self._annotate(names, counts, tier)
        i = bisect.bisect_left(LATENCY_BUCKETS, seconds)
        with self._lock:
            self._buckets[i] += 1
            self._sum += seconds
            self._count += 1
            tables = self._tables.get(tier)
            if tables is None:
                tables = self._tables[tier] = TableCounts(4)
        tables.add(names, counts)

    def _annotate(self, names: tuple[str, ...], counts: np.ndarray, tier: str) -> None:
        totals = counts.sum(axis=1).tolist()
        attributes = {"sp.store": self.store, "sp.tier": tier or "none", "sp.tables": len(names),
                      "sp.ids": totals[0], "sp.default_vectors": totals[1]}
        if len(totals) == 4:
            attributes["sp.cache_hits"], attributes["sp.cache_misses"] = totals[2], totals[3]
        spans.annotate(attributes)

    def count_rows(self, table: str, removed: int = 0, expired: int = 0) -> None:
        """Rows of ``table`` a delta removed, and rows ``row_ttl_steps`` expired."""
        with self._lock:
            counts = self._rows.setdefault(table, [0, 0])
            counts[0] += removed
            counts[1] += expired

    def count_redis(self, errors: int = 0, reconnects: int = 0) -> None:
        with self._lock:
            self.redis_errors += errors
            self.redis_reconnects += reconnects

    def snapshot(self) -> dict[str, Any]:
        """A copy (each counter as it was at some point of the call): ``store``, ``latency``
        (cumulative ``buckets`` [(le, count)], ``sum``, ``count``), ``tables`` {name: {ids, default_vectors,
        hits {tier: n}, misses {tier: n}, removed, expired}}, ``redis_errors``, ``redis_reconnects``."""
        with self._lock:
            running, buckets = 0, []
            for bound, n in zip((*LATENCY_BUCKETS, "+Inf"), self._buckets):
                running += n
                buckets.append((bound, running))
            per_tier = list(self._tables.items())
            latency = {"buckets": buckets, "sum": self._sum, "count": self._count}
            errors, reconnects = self.redis_errors, self.redis_reconnects
            rows = {name: list(counts) for name, counts in self._rows.items()}
        tables: dict[str, dict[str, Any]] = {}

        def table_of(name: str) -> dict[str, Any]:
            return tables.setdefault(name, {"ids": 0, "default_vectors": 0, "hits": {}, "misses": {},
                                            "removed": 0, "expired": 0})

        for name, (removed, expired) in rows.items():
            table_of(name).update(removed=removed, expired=expired)
        for tier, counts in per_tier:
            for name, (ids, defaults, hits, misses) in counts.totals().items():
                table = table_of(name)
                table["ids"] += int(ids)
                table["default_vectors"] += int(defaults)
                if tier:
                    table["hits"][tier] = int(hits)
                    table["misses"][tier] = int(misses)
        return {"store": self.store, "latency": latency, "tables": tables, "redis_errors": errors,
                "redis_reconnects": reconnects}
