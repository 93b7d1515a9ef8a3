"""RedisVersionTables: one version's embedding tables in Redis, as a :class:`~.redis_store.RedisStore`
serves them: lookups through the hot-row cache and one pipelined ``HMGET`` round, the rows a delta
changes pinned until it applies, and the version's counters. The store's module doc tells the
protocol (loading, deltas, outage); this one holds what each request runs.

Thread-safe.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import spans
from ..errors import ConfigError, Internal, Unavailable
from .ev_checkpoint import TableSource
from .key_layout import FIELD_DTYPE, table_id
from .progress import LoadProgress
from .row_cache import HotRowCache
from .rows import LookupStats, Narrowing, RowChunk, TableSpec, in_keys_shape

log = logging.getLogger("processor.features")


class RedisVersionTables:
    """One version's tables in Redis. See the module doc and :mod:`.feature_store`.

    ``store``: the :class:`~.redis_store.RedisStore` serving it (its connections, layout,
    settings and outage state). ``version`` names the version's keys in Redis: the engine's version id, with ``.f16`` added
    for ``embedding_dtype`` float16 (replicas with another dtype never read these rows).
    """

    def __init__(self, store: Any, version: str, specs: dict[str, TableSpec], source: TableSource) -> None:
        self.store = store
        self.version = version if store.dtype == "float32" else f"{version}.f16"
        self.specs = specs
        self.source = source
        self.keys, self.slots = store.layout.partition_keys(self.version)
        self.tids = {name: table_id(name) for name in specs}
        if len(set(self.tids.values())) != len(self.tids):
            raise Internal("two embedding tables share a 24-bit table id; rename one")
        self._defaults = {name: spec.default_vector() for name, spec in specs.items()}
        self._wire = {name: np.dtype(spec.storage).newbyteorder("<") for name, spec in specs.items()}
        self.stats = LookupStats(extra={"redis_commands": 0, "cache_hits": 0, "cache_misses": 0})
        self.narrowing = {name: Narrowing() for name, spec in specs.items() if spec.dtype != "float32"}
        self._narrowing_lock = threading.Lock()
        self.loaded_by: str | None = None
        self.progress: LoadProgress | None = None
        self.delta_step = -1
        self.cache_off = HotRowCache.reason_off(store.cache_bytes)
        self.cache = HotRowCache(specs, store.cache_bytes) if self.cache_off is None else None
        self.prefilled = 0
        # Rows a delta this replica is writing into Redis changes, as the served version has them
        # (table -> (sorted ids, rows, present)); lookups serve them until apply_delta. See stage_delta.
        self._pinned: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None

    # --- serving ----------------------------------------------------------------------------

    def lookup(self, requests: Sequence[tuple[str, np.ndarray]]) -> list[np.ndarray]:
        """Rows of each request: cached ones from the hot-row cache, the distinct others from
        Redis in one pipelined round (and then cached). See the module doc. Cache hits and
        misses count ids as requested (a repeated id counts each time)."""
        started = time.perf_counter()
        self.store.check_up()
        cache = self.cache
        parts, wanted = [], []
        names = tuple(name for name, _ in requests)
        flats = [(name, np.ascontiguousarray(keys, np.int64).reshape(-1)) for name, keys in requests]
        if cache is not None:  # the cache first (one native call), on the ids as they come: no sort when all hit
            outs, misses = cache.lookup_many(names, [flat for _, flat in flats])
            if not any(len(m) for m in misses):  # every id cached: nothing to fetch, no default served
                sizes = [flat.size for _, flat in flats]
                zeros = [0] * len(sizes)
                self._count(names, np.array([sizes, zeros, sizes, zeros], np.int64), started, "redis_cache")
                return [in_keys_shape(rows, keys) for rows, (_, keys) in zip(outs, requests)]
        for k, (name, flat) in enumerate(flats):
            if cache is not None:
                rows, miss = outs[k], misses[k]
                uniq, inverse = np.unique(flat[miss], return_inverse=True) if len(miss) else (flat[:0], miss)
            else:
                rows, miss = None, None
                uniq, inverse = np.unique(flat, return_inverse=True)
            parts.append((name, flat.size, rows, miss, inverse))
            wanted.append((name, uniq))
        fetched = self._fetch(wanted)
        pinned = self._pinned
        out, counts = [], []
        for (name, size, rows, miss, inverse), (_, ids), (got, present), (_, keys) in zip(parts, wanted, fetched,
                                                                                           requests):
            if len(ids):
                if pinned is not None and name in pinned:
                    _overlay(pinned[name], ids, got, present)
                if cache is not None:
                    cache.insert(name, ids[present], got[present])
                    rows[miss] = got[inverse]
                else:
                    rows = got[inverse]
            elif rows is None:
                rows = got
            defaults = int(np.count_nonzero(~present[inverse])) if not present.all() else 0
            out.append(in_keys_shape(rows, keys))
            missed = len(miss) if cache is not None else 0
            counts.append((size, defaults, size - missed if cache is not None else 0, missed))
        self._count(names, np.array(counts, np.int64).T.reshape(4, -1), started,
                    "redis_cache" if cache is not None else "")
        return out

    def _count(self, names: tuple[str, ...], counts: np.ndarray, started: float, tier: str) -> None:
        """A lookup's counters: int64 [4, tables]: ids, default vectors, cache hits, cache misses."""
        ids, defaults, hits, misses = counts.sum(axis=1).tolist()
        self.stats.add(ids, defaults)
        self.stats.extra["cache_hits"] += hits
        self.stats.extra["cache_misses"] += misses
        self.store.metrics.record(time.perf_counter() - started, names, counts, tier)

    def _fetch(self, wanted: Sequence[tuple[str, np.ndarray]]) -> list[tuple[np.ndarray, np.ndarray]]:
        """For each (table, distinct ids): (float32 rows, the default vector where absent; present
        mask), read from Redis with one ``HMGET`` per partition, pipelined per node."""
        store = self.store
        layout = store.layout
        sizes = [len(ids) for _, ids in wanted]
        total = sum(sizes)
        if total == 0:
            return [(np.empty((0, self.specs[n].dim), np.float32), np.zeros(0, bool)) for n, _ in wanted]
        ids = np.concatenate([ids for _, ids in wanted])
        tids = np.concatenate([np.full(len(i), self.tids[n], np.uint32) for n, i in wanted])
        parts = np.concatenate([layout.partition_of(self.tids[n], i) for n, i in wanted])
        order = np.argsort(parts, kind="stable")
        counts = np.bincount(parts, minlength=layout.partitions)
        fields = layout.packed_fields(tids[order], ids[order])
        commands = []
        pos = 0
        for p in np.flatnonzero(counts).tolist():
            c = int(counts[p])
            commands.append((int(self.slots[p]), layout.pack_hmget(self.keys[p], fields[pos: pos + c])))
            pos += c
        if spans.current.get() is None:
            replies = store.run(commands)
        else:  # a sampled request's lookup: the round trip is a span of its own
            with spans.stage("redis.pipeline", {"db.system": "redis", "sp.commands": len(commands),
                                                "sp.keys": total}, leaf=True):
                replies = store.run(commands)
        flat_sorted: list[bytes | None] = []
        for reply in replies:
            if isinstance(reply, Exception):
                raise Internal(f"feature store: {type(reply).__name__}: {reply}")
            if reply[0] is None:
                store.data_lost(self, "a partition of version %s has no data" % self.version)
            flat_sorted.extend(reply[1:])
        self.stats.extra["redis_commands"] += len(commands)
        inv_order = np.empty(total, np.int64)
        inv_order[order] = np.arange(total)
        flat = [flat_sorted[j] for j in inv_order.tolist()]
        out = []
        start = 0
        for (name, _), n in zip(wanted, sizes):
            seg = flat[start: start + n]
            start += n
            dim = self.specs[name].dim
            hit = np.fromiter((v is not None for v in seg), bool, n)
            rows = np.empty((n, dim), np.float32)
            hits = int(np.count_nonzero(hit))
            if hits:
                rows[hit] = np.frombuffer(b"".join([v for v in seg if v is not None]),
                                          self._wire[name]).reshape(hits, dim)
            if hits < n:
                rows[~hit] = self._defaults[name]
            out.append((rows, hit))
        return out

    def prefill(self, previous: RedisVersionTables | None, limit: int = 65536) -> None:
        """Fill the cache with this version's rows of the ids hottest in ``previous``'s cache
        (at most ``limit`` a table); best effort: a Redis error leaves the cache as it is."""
        if self.cache is None or previous is None or previous.cache is None:
            return
        wanted = []
        for name in self.specs:
            if name in previous.specs:
                hot = previous.cache.hot_ids(name, min(limit, self.cache.capacity_rows(name)))
                if len(hot):
                    wanted.append((name, np.unique(hot)))
        try:
            for (name, ids), (rows, present) in zip(wanted, self._fetch(wanted)):
                self.cache.insert(name, ids[present], rows[present])
                self.prefilled += int(np.count_nonzero(present))
        except (Unavailable, Internal) as exc:
            log.warning("feature store %s: no cache prefill for version %s: %s", self.store.kind, self.version, exc)

    # --- updates ----------------------------------------------------------------------------

    def stage_delta(self, rows: dict[str, RowChunk], step: int, source: TableSource | None = None,
                    removed: dict[str, np.ndarray] | None = None) -> None:
        """Delete a delta's removed ids and write its rows once for all replicas (see the module
        doc). The replica that writes them first pins the rows it changes or removes as they are
        now (:meth:`pin`), so its requests see the old version whole until :meth:`apply_delta`,
        then the new one whole."""
        if source is not None:
            self.source = source
        self.store.write_delta(self, rows, step, removed)
        self.delta_step = step

    def pin(self, rows: dict[str, RowChunk], removed: dict[str, np.ndarray] | None = None) -> None:
        """Keep serving the served rows of ``rows``' and ``removed``'s ids until :meth:`apply_delta`
        (called with the version's writer lock held, before the delta is written into Redis)."""
        ids: dict[str, list[np.ndarray]] = {}
        for name, chunk in rows.items():
            ids.setdefault(name, []).append(np.asarray(chunk.keys, np.int64))
        for name, gone in (removed or {}).items():
            ids.setdefault(name, []).append(np.asarray(gone, np.int64))
        wanted = [(name, np.unique(np.concatenate(parts))) for name, parts in ids.items() if name in self.specs]
        wanted = [(name, held) for name, held in wanted if len(held)]
        self._pinned = {name: (ids, got, present)
                        for (name, ids), (got, present) in zip(wanted, self._fetch(wanted))}

    def apply_delta(self, rows: dict[str, RowChunk], step: int, removed: dict[str, np.ndarray] | None = None,
                    expire_before: int | None = None) -> None:
        """Behind the update gate (no lookup in flight): the hot-row cache forgets the delta's
        removed ids and its cached rows of the delta's ids take the delta's values (as Redis now
        holds them: in the storage dtype), on every replica, whoever wrote the delta into Redis;
        rows pinned by :meth:`pin` are let go. ``expire_before`` (``row_ttl_steps``) is refused:
        Redis keeps no row's step (the config check refuses it first)."""
        if expire_before is not None:
            raise ConfigError("row_ttl_steps: the Redis stores keep no row's step; use the DRAM or DRAM+SSD store")
        for name, gone in (removed or {}).items():
            if name in self.specs:
                if self.cache is not None:
                    self.cache.erase(name, np.asarray(gone, np.int64))
                self.store.metrics.count_rows(name, removed=len(gone))
        if self.cache is not None:
            for name, chunk in rows.items():
                spec = self.specs.get(name)
                if spec is None or not len(chunk):
                    continue
                values = np.asarray(chunk.values, np.float32).astype(spec.storage).astype(np.float32)
                self.cache.update(name, np.asarray(chunk.keys, np.int64), values)
        self._pinned = None

    def held_ids(self, table: str) -> np.ndarray:
        """The ids of ``table`` this version holds in Redis, sorted: a scan of every partition
        (``HKEYS``), for tests and tools, not the request path."""
        tid = self.tids[table]
        replies = self.store._checked(self.store.run([(int(s), ("HKEYS", k)) for k, s in zip(self.keys, self.slots)]))
        fields = [f for reply in replies for f in reply if len(f) == FIELD_DTYPE.itemsize]
        packed = np.frombuffer(b"".join(fields), FIELD_DTYPE) if fields else np.empty(0, FIELD_DTYPE)
        mine = packed["table"] == ((np.uint32(tid) << np.uint32(8)) | np.uint32(1))
        return np.sort(packed["id"][mine].astype(np.int64))

    def describe(self) -> dict[str, Any]:
        tables = {}
        for n, s in self.specs.items():
            tables[n] = {"dim": s.dim, "keyed_by": s.keyed_by, "checkpoint_rows": s.rows, "dtype": s.dtype}
            if n in self.narrowing:
                tables[n]["float16"] = self.narrowing[n].as_dict()
        lookups = self.stats.as_dict()
        looked = lookups["cache_hits"] + lookups["cache_misses"]
        lookups["cache_hit_rate"] = lookups["cache_hits"] / looked if looked else None
        cache = self.cache.describe() if self.cache is not None else {"policy": self.cache_off}
        return {"store": self.store.kind, "version": self.version, "loaded_by": self.loaded_by,
                "delta_step": self.delta_step, "partitions": len(self.keys), "tables": tables,
                "cache": {**cache, "prefilled_rows": self.prefilled}, "lookups": lookups,
                "load": self.progress.describe() if self.progress else None}

    def memory(self) -> dict[str, int]:
        """The bytes this version holds in this process, by part (:data:`processor.memory.PARTS`):
        ``caches``, the hot-row cache in use (:meth:`HotRowCache.nbytes`) plus the rows of a
        delta pinned until it applies; ``tables`` 0, the rows live in Redis. Cheap."""
        pinned = self._pinned
        held = sum(int(a.nbytes) for arrays in (pinned or {}).values() for a in arrays)
        return {"tables": 0, "caches": held + (self.cache.nbytes() if self.cache is not None else 0)}

    def release(self) -> None:
        self.store.forget(self)


def _overlay(pinned: tuple[np.ndarray, np.ndarray, np.ndarray], ids: np.ndarray, rows: np.ndarray,
             present: np.ndarray) -> None:
    """Replace ``rows`` / ``present`` of the ``ids`` that ``pinned`` holds by the pinned ones."""
    pids, prows, ppresent = pinned
    if not len(pids):
        return
    pos = np.minimum(np.searchsorted(pids, ids), len(pids) - 1)
    match = pids[pos] == ids
    if match.any():
        rows[match] = prows[pos[match]]
        present[match] = ppresent[pos[match]]
