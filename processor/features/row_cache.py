"""HotRowCache: the hot-row cache in front of Redis / Redis Cluster, one per served version.

Recommendation ids are skewed (a few percent of the ids take most lookups), so a small local
cache of float32 rows answers most ids without a Redis round trip. Per table, a native
``RowCache`` (``native/src/row_store.cc``):

* **bounded in bytes**: ``redis_cache_bytes`` per version (default 256 MiB; 0 turns the cache
  off), split over the tables smallest first, each at most an even share of what is left (a
  small table is cached whole, never more rows than it has; the large ones share the rest). A
  row costs ``4 * dim + 18`` bytes (values, key, index, reference bit);
* **CLOCK eviction** (second chance): a hit only sets a reference bit, under a shared lock, so
  concurrent lookups never serialize on a list update as an exact LRU's would; a miss evicts
  the first slot whose bit is clear as the hand sweeps. Under a skewed (Zipf) distribution it
  keeps what LRU keeps: ids looked up again within one sweep stay;
* **version-aware** (what :class:`~.redis_tables.RedisVersionTables` does with it): a new full
  version gets a new cache (prefilled with the hottest ids of the last one, read from the new
  version in Redis); a delta overwrites the cached rows it changes, from the delta file, and
  forgets the ids it removes, behind the update gate (no lookup in flight), on every replica,
  whoever wrote it into Redis. A row
  of another version is never cached: rows enter only from the version's own Redis keys or
  its own delta.

Without the native extension there is no cache (model info says so); lookups go to Redis.

Thread-safe.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import native_rows
from .rows import TableSpec

ROW_OVERHEAD = 18  # bytes per cached row beyond its floats: key 8, two index slots 8, flags 2


def index_bytes(capacity: int) -> int:
    """The bytes of a native ``RowCache``'s index (``native/src/row_store.h``), allocated and
    written when it is made: an open-addressing table of int32 slots (a power of two, at least 16
    and 2 x ``capacity``) and per row its key (8 bytes), reference bit and busy flag (1 each)."""
    slots = 16
    while slots < 2 * capacity:
        slots <<= 1
    return 4 * slots + 10 * capacity


class HotRowCache:
    """See the module doc. ``budget``: bytes for all of ``specs``' tables."""

    def __init__(self, specs: dict[str, TableSpec], budget: int) -> None:
        self.budget = int(budget)
        self._caches: dict[str, Any] = {}
        self._dims = {name: spec.dim for name, spec in specs.items()}
        self._sets: dict[tuple[str, ...], Any] = {}  # native CacheSets by table names (see lookup_many)
        left = self.budget
        by_size = sorted(specs.items(), key=lambda item: max(item[1].rows, 1) * item[1].dim)
        for i, (name, spec) in enumerate(by_size):
            # smallest tables first, each at most an even share of what is left: a small table is
            # cached whole, the large ones share the rest evenly
            row_bytes = 4 * spec.dim + ROW_OVERHEAD
            rows = min(left // (len(by_size) - i) // row_bytes, max(spec.rows, 1), (1 << 30) - 1)
            left -= rows * row_bytes
            if rows > 0:
                cache = native_rows.row_cache(rows, spec.dim)
                if cache is None:
                    break
                self._caches[name] = cache

    @staticmethod
    def reason_off(budget: int) -> str | None:
        """Why a cache of ``budget`` bytes would not run, or None."""
        if budget <= 0:
            return "off (redis_cache_bytes is 0)"
        if not native_rows.AVAILABLE:
            return "off: processor._native is not built (scripts/build_native.sh)"
        return None

    def lookup_many(self, tables: tuple[str, ...], ids: Sequence[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """(rows, misses) of ``ids[i]`` (int64, C-contiguous) in ``tables[i]``'s cache, all tables
        in one native call (the GIL released once): float32 ``[ids.size, dim]`` holding the cached
        ids' rows (the other rows are for the caller to write), and the positions of the ids not
        cached (all of them for a table without a cache)."""
        found = self._sets.get(tables)
        if found is None:
            found = self._sets[tables] = native_rows.MODULE.CacheSet(
                [self._caches.get(t) for t in tables], [self._dims[t] for t in tables])
        return found.lookup(list(ids))

    def insert(self, table: str, ids: np.ndarray, rows: np.ndarray) -> None:
        cache = self._caches.get(table)
        if cache is not None and len(ids):
            cache.insert(ids, np.ascontiguousarray(rows, np.float32))

    def update(self, table: str, ids: np.ndarray, rows: np.ndarray) -> int:
        """Overwrite the cached rows of ``ids`` (the others stay uncached); how many were cached."""
        cache = self._caches.get(table)
        if cache is None or not len(ids):
            return 0
        return cache.update(np.ascontiguousarray(ids, np.int64), np.ascontiguousarray(rows, np.float32))

    def erase(self, table: str, ids: np.ndarray) -> int:
        """Forget the cached rows of ``ids`` (a delta removed them); how many were cached."""
        cache = self._caches.get(table)
        if cache is None or not len(ids):
            return 0
        return cache.erase(np.ascontiguousarray(ids, np.int64))

    def hot_ids(self, table: str, limit: int) -> np.ndarray:
        """Up to ``limit`` cached ids of ``table``, those used since the CLOCK hand passed first."""
        cache = self._caches.get(table)
        return np.asarray(cache.hot_keys(limit) if cache is not None else [], np.int64)

    def capacity_rows(self, table: str) -> int:
        cache = self._caches.get(table)
        return cache.capacity if cache is not None else 0

    def nbytes(self) -> int:
        """The bytes the caches hold now: each one's index, allocated whole when it is made
        (:func:`index_bytes`), and the rows cached so far, ``4 * dim`` bytes each (the row
        array's pages are touched only as rows come). Cheap: two counters per table."""
        return sum(index_bytes(c.capacity) + 4 * c.dim * c.size for c in self._caches.values())

    def describe(self) -> dict[str, Any]:
        rows = {n: {"capacity_rows": c.capacity, "cached_rows": c.size, "evictions": c.evictions}
                for n, c in self._caches.items()}
        used = sum((4 * c.dim + ROW_OVERHEAD) * c.capacity for c in self._caches.values())
        return {"policy": "CLOCK (second chance)", "budget_bytes": self.budget, "allocated_bytes": used,
                "tables": rows}
