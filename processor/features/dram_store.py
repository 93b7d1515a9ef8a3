"""In-process DRAM store (``ev_storage_type`` 1, and EmbeddingVariable checkpoints by default).

:class:`DramTable` holds one table: a :class:`~.hash_index.HashIndex` (key -> row), a values
array ``[rows, dim]`` (float32, or float16 with ``embedding_dtype`` float16: half the bytes,
widened to float32 at lookup) and, when the checkpoint has them, uint32 freq / version arrays
(saturating). Memory per key: ``4 * dim`` (float16: ``2 * dim``) bytes of values, 8 + 4 / load
(<= 16) bytes of index, plus 8 bytes of metadata when kept. No Python object per row.

A delta's removed ids leave the table (:meth:`DramTable.remove`): their rows are freed and taken
by later inserts, so deltas that remove as many ids as they add keep the arrays' size; a removed
id is then served the default vector, as an id never seen. With ``row_ttl_steps`` a delta also
drops the rows whose version (the step of their last update) is too old
(:meth:`LocalVersionTables.apply_delta`).

Lookups run the index probe and the row gather in native code without the GIL
(:mod:`.native_rows`) when the extension is built; :meth:`DramTable.lookup_reference` is the
numpy reference it is tested against and the fallback.

Thread safety: any number of concurrent :meth:`DramTable.lookup`; :meth:`DramTable.upsert`
only while no lookup runs (deltas are applied behind the SessionGroup's update gate).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import native_rows, shared_tables
from .rows import LookupStats, Narrowing, RowChunk, TableSpec, in_keys_shape, to_storage
from .hash_index import HashIndex
from .progress import LoadProgress
from .shared_tables import SharedTables
from .store_metrics import StoreMetrics, TableCounts

log = logging.getLogger("processor.features")

_U32_MAX = np.iinfo(np.uint32).max


def _as_u32(values: np.ndarray) -> np.ndarray:
    return np.clip(np.asarray(values, np.int64), 0, _U32_MAX).astype(np.uint32)


def checked_values(spec: TableSpec, chunk: RowChunk) -> np.ndarray:
    """``chunk``'s rows as float32; ValueError naming the table unless they are ``[n, dim]``."""
    values = np.asarray(chunk.values, np.float32)
    if values.shape != (len(chunk.keys), spec.dim):
        raise ValueError(f"table {spec.name!r}: rows of shape {list(values.shape)}, "
                         f"expected [{len(chunk.keys)}, {spec.dim}]")
    return values


def write_meta(table: Any, rows: np.ndarray, chunk: RowChunk, length: int) -> None:
    """Store ``chunk``'s freqs / versions (uint32, saturating) at ``rows`` of ``table.freqs`` /
    ``table.versions``, first creating the array, or growing it to ``length`` rows, if needed."""
    for name, given in (("freqs", chunk.freqs), ("versions", chunk.versions)):
        if given is None:
            continue
        arr = getattr(table, name)
        if arr is None or len(arr) < length:
            bigger = np.zeros(length, np.uint32)
            if arr is not None:
                bigger[: len(arr)] = arr
            arr = bigger
            setattr(table, name, arr)
        arr[rows] = _as_u32(given)


def index_and_meta(table: Any) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A DRAM or DRAM+SSD table's index, freqs / versions (trimmed to its rows) and float16
    narrowing counts, as :mod:`.shared_tables` publishes them (:func:`adopt_index_and_meta`)."""
    numbers, arrays = table.index.arrays()
    for name in ("freqs", "versions"):
        arr = getattr(table, name)
        if arr is not None:
            arrays[name] = arr[: table.index.size]
    if table.narrowing is not None:
        numbers["narrowing"] = [table.narrowing.rows, table.narrowing.bytes_saved, table.narrowing.max_abs_diff]
    return numbers, arrays


def adopt_index_and_meta(table: Any, numbers: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """Give ``table`` the index and metadata :func:`index_and_meta` gave (arrays taken as they are)."""
    table.index = HashIndex.adopt(numbers["size"], numbers["identity"], arrays.get("keys"), arrays.get("slots"),
                                  arrays.get("free"), numbers.get("removed_slots", 0))
    table.freqs, table.versions = arrays.get("freqs"), arrays.get("versions")
    if table.narrowing is not None and "narrowing" in numbers:
        table.narrowing.rows, table.narrowing.bytes_saved, table.narrowing.max_abs_diff = numbers["narrowing"]


def forget_meta(table: Any, rows: np.ndarray) -> None:
    """Clear the freqs / versions of freed ``rows`` (a later insert there starts afresh)."""
    for arr in (table.freqs, table.versions):
        if arr is not None:
            arr[rows[rows < len(arr)]] = 0


def stale_keys(table: Any, before: int) -> np.ndarray:
    """The keys of ``table`` (DRAM or DRAM+SSD) whose version is below ``before``: the rows
    ``row_ttl_steps`` drops (none without versions: every row then has one, see
    :class:`~.ev_checkpoint.TableSource`)."""
    versions = table.versions
    if versions is None or before <= 0:
        return np.empty(0, np.int64)
    index = table.index
    rows = np.flatnonzero(versions[: index.size] < min(before, _U32_MAX))
    if len(index.free_rows):
        rows = np.setdiff1d(rows, index.free_rows, assume_unique=True)
    return index.keys_of_rows(rows)


class DramTable:
    """See the module doc. ``capacity`` pre-sizes for that many rows (bulk loads know it)."""

    def __init__(self, spec: TableSpec, capacity: int = 0) -> None:
        self.spec = spec
        self.index = HashIndex(capacity)
        self.values = np.empty((capacity, spec.dim), spec.storage)
        self.freqs: np.ndarray | None = None
        self.versions: np.ndarray | None = None
        self.default = spec.default_vector()
        self.stats = LookupStats()
        self.narrowing = Narrowing() if spec.dtype != "float32" else None

    @classmethod
    def adopt(cls, spec: TableSpec, numbers: dict[str, Any], arrays: dict[str, np.ndarray]) -> DramTable:
        """A table over :meth:`shared_arrays`' output (views of a shared-memory segment: see
        :mod:`.shared_tables`), not copied; an upsert writes into them in place or, when the
        table grows, replaces them with private arrays."""
        table = cls(spec)
        adopt_index_and_meta(table, numbers, arrays)
        table.values = arrays["values"]
        return table

    def shared_arrays(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """(the table's numbers, its arrays trimmed to its rows): what :meth:`adopt` takes."""
        numbers, arrays = index_and_meta(self)
        arrays["values"] = self.values[: self.index.size]
        return numbers, arrays

    @property
    def size(self) -> int:
        """The keys held."""
        return self.index.count

    def held_ids(self) -> np.ndarray:
        """The ids held, sorted (a copy; for tests and tools, not the request path)."""
        return np.sort(self.index.keys())

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """float32 ``[len(keys), dim]``: each key's row, the default vector where absent."""
        return self.lookup_counted(keys)[0]

    def lookup_counted(self, keys: np.ndarray) -> tuple[np.ndarray, int, int, int]:
        """(:meth:`lookup`'s rows, default vectors served, cache hits, cache misses: none here)."""
        q = np.ascontiguousarray(keys, np.int64).reshape(-1)
        if native_rows.AVAILABLE:
            out, misses = native_rows.lookup_rows(self.index, self.values, self.default, q)
        else:
            out, misses = self.lookup_reference(q)
        self.stats.add(len(q), misses)
        return out, misses, 0, 0

    def lookup_reference(self, keys: np.ndarray) -> tuple[np.ndarray, int]:
        """:meth:`lookup` in numpy: (rows as float32, how many got the default vector)."""
        rows = self.index.find(keys)
        miss = rows < 0
        misses = int(np.count_nonzero(miss))
        if self.size == 0:
            return np.broadcast_to(self.default, (len(rows), self.spec.dim)).copy(), misses
        out = self.values[np.where(miss, 0, rows)].astype(np.float32, copy=False)
        if misses:
            out[miss] = self.default
        return out, misses

    def upsert(self, chunk: RowChunk) -> int:
        """Write rows (new keys are added); returns the number of new keys."""
        if len(chunk) == 0:
            return 0
        values = to_storage(self.spec, checked_values(self.spec, chunk), self.narrowing)
        rows, new = self.index.upsert(chunk.keys)
        self._ensure_rows(self.index.size)
        self.values[rows] = values
        write_meta(self, rows, chunk, len(self.values))
        return new

    def remove(self, keys: np.ndarray) -> int:
        """Drop the rows of ``keys`` it holds (others are ignored); their rows are reused by later
        upserts. Returns how many it held."""
        rows = self.index.remove(keys)
        forget_meta(self, rows)
        return len(rows)

    def _ensure_rows(self, n: int) -> None:
        if n <= len(self.values):
            return
        cap = max(n, int(len(self.values) * 1.5) + 16)
        grown = np.empty((cap, self.spec.dim), self.values.dtype)
        grown[: len(self.values)] = self.values
        self.values = grown
        for name in ("freqs", "versions"):
            arr = getattr(self, name)
            if arr is not None:
                bigger = np.zeros(cap, np.uint32)
                bigger[: len(arr)] = arr
                setattr(self, name, bigger)

    def metadata(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(freqs, versions) of ``keys`` as int64; -1 where unknown."""
        rows = self.index.find(keys)
        out = []
        for arr in (self.freqs, self.versions):
            got = np.full(len(rows), -1, np.int64)
            if arr is not None:
                ok = rows >= 0
                got[ok] = arr[rows[ok]]
            out.append(got)
        return out[0], out[1]

    def nbytes(self) -> dict[str, int]:
        meta = sum(a.nbytes for a in (self.freqs, self.versions) if a is not None)
        return {"values": int(self.values.nbytes), "index": self.index.nbytes, "metadata": int(meta)}

    def buffers(self) -> list[np.ndarray]:
        """Every array the table holds in memory (rows, index, metadata), whole: what it costs
        (:meth:`LocalVersionTables.memory`)."""
        return [a for a in (self.values, *self.index.buffers(), self.freqs, self.versions) if a is not None]


class LocalVersionTables:
    """A version's tables held in this process (DRAM or DRAM+SSD tables). See feature_store.

    ``metrics``: the store's :class:`~.store_metrics.StoreMetrics`, filled by every lookup
    (``tier``: the cache tier whose hits and misses the tables count, "" for none)."""

    def __init__(self, kind: str, version: str, specs: dict[str, TableSpec], tables: dict[str, Any],
                 metrics: StoreMetrics | None = None, tier: str = "") -> None:
        self.kind = kind
        self.version = version
        self.specs = specs
        self.tables = tables
        self.metrics = metrics
        self.tier = tier
        self.progress: LoadProgress | None = None
        self.filtered: dict[str, int] = {}
        # workers: the segment holding the tables (shared_tables), or why this worker has its own copy
        self.shared: SharedTables | None = None
        self.shared_note: str | None = None
        # DRAM tables only (not the SSD tier's): their lookups may go native all at once
        self._in_memory = all(type(t) is DramTable for t in tables.values())
        self._sets: dict[tuple[str, ...], Any] = {}  # native TableSets by table names (see _native_set)
        self._counts = TableCounts(3)  # the native lookups' per table: lookups, ids, default vectors
        self._dropped: dict[str, list[int]] = {}  # per table: rows deltas removed, rows expired

    def load(self, source, chunk_rows: int = 65536) -> None:
        self.progress = LoadProgress(f"{self.kind} store, version {self.version}", source.row_count(self.specs))
        for name, chunk in source.rows(self.specs, chunk_rows):
            self.tables[name].upsert(chunk)
            self.progress.add(len(chunk))
        self._sets = {}
        self.progress.finish()

    def lookup(self, requests: Sequence[tuple[str, np.ndarray]]) -> list[np.ndarray]:
        started = time.perf_counter()
        names = tuple(name for name, _ in requests)
        native = self._native_set(names) if self._in_memory else None
        if native is not None:  # every table in one native call, their arrays taken once per version
            found, counts = native.lookup([keys for _, keys in requests])
            self._counts.add(names, counts)  # lookups, ids, defaults: one add for all tables
            if self.metrics is not None:
                self.metrics.record(time.perf_counter() - started, names, counts[1:], self.tier)
            return found
        found, counted = [], []
        for name, keys in requests:  # tables that count their own lookups (DRAM+SSD, no extension)
            rows, *counts = self.tables[name].lookup_counted(np.ascontiguousarray(keys, np.int64).reshape(-1))
            found.append(in_keys_shape(rows, keys))
            counted.append((len(rows), *counts))
        if self.metrics is not None:
            self.metrics.record(time.perf_counter() - started, names, np.array(counted, np.int64).T.reshape(4, -1),
                                self.tier)
        return found

    def _native_set(self, names: tuple[str, ...]):
        """The native TableSet of ``names`` (built once per list of names; None without the
        extension). Upserts drop them: they may replace the tables' arrays."""
        if not native_rows.AVAILABLE:
            return None
        found = self._sets.get(names)
        if found is None:
            found = self._sets[names] = native_rows.table_set([self.tables[n] for n in names])
        return found

    def stage_delta(self, rows: dict[str, RowChunk], step: int, source=None, removed=None) -> None:
        return None  # rows live in this process: written by apply_delta, behind the update gate

    def apply_delta(self, rows: dict[str, RowChunk], step: int, removed: dict[str, np.ndarray] | None = None,
                    expire_before: int | None = None) -> None:
        """Remove ``removed``'s ids, then upsert ``rows``; with ``expire_before`` (``row_ttl_steps``)
        then drop every row whose version is below it, a row the delta writes without a version
        taking ``step``. Removed and expired rows are counted in the store's metrics."""
        try:
            for name, ids in (removed or {}).items():
                self._count(name, removed=self.tables[name].remove(ids))
            for name, chunk in rows.items():
                if expire_before is not None and chunk.versions is None:
                    chunk = RowChunk(chunk.keys, chunk.values, chunk.freqs, np.full(len(chunk), step, np.int64))
                self.tables[name].upsert(chunk)
            if expire_before is not None:
                for name, table in self.tables.items():
                    self._count(name, expired=table.remove(stale_keys(table, expire_before)))
        finally:
            self._sets = {}  # upserts and removals may have replaced the tables' arrays

    def _count(self, table: str, removed: int = 0, expired: int = 0) -> None:
        counts = self._dropped.setdefault(table, [0, 0])
        counts[0] += removed
        counts[1] += expired
        if self.metrics is not None and (removed or expired):
            self.metrics.count_rows(table, removed=removed, expired=expired)

    def held_ids(self, table: str) -> np.ndarray:
        """The ids ``table`` holds, sorted (a copy; for tests and tools, not the request path)."""
        return self.tables[table].held_ids()

    def describe(self) -> dict[str, Any]:
        tables = {}
        native = self._counts.totals()
        for name, table in self.tables.items():
            stats = table.stats.as_dict()
            if name in native:  # lookups made through the version's TableSets
                for key, count in zip(("lookups", "ids", "default_vectors_served"), native[name].tolist()):
                    stats[key] += count
            tables[name] = {"rows": table.size, "freed_rows": len(table.index.free_rows), "dim": table.spec.dim,
                            "keyed_by": table.spec.keyed_by, "dtype": table.spec.dtype, "bytes": table.nbytes(),
                            **stats}
            if table.narrowing is not None:
                tables[name]["float16"] = table.narrowing.as_dict()
            if self.filtered.get(name):
                tables[name]["filtered_ids"] = self.filtered[name]
            if name in self._dropped:
                tables[name]["removed_rows"], tables[name]["expired_rows"] = self._dropped[name]
        out = {"store": self.kind, "version": self.version, "tables": tables,
               "load": self.progress.describe() if self.progress else None}
        if self.shared is not None:
            out["shared_memory"] = self.shared.describe()
        elif self.shared_note is not None:
            out["shared_memory"] = self.shared_note
        return out

    def memory(self) -> dict[str, int]:
        """The bytes this version's tables hold in this process's memory, by part
        (:data:`processor.memory.PARTS`): ``tables``, the arrays of this process's own (DRAM
        tables: rows, key index, freq / version metadata, with the room reserved for growth;
        DRAM+SSD: the DRAM tier, i.e. row cache, index and rows added past a shared file, never
        the SSD file); ``shared``, the shared-memory segment this version maps (workers), once,
        whose arrays are left out of ``tables`` (a table grown past it holds private arrays
        again, counted there). From the arrays' sizes (a few per table), so cheap per call;
        deltas are reflected at the next call."""
        shared = self.shared
        own = sum(int(a.nbytes) for table in list(self.tables.values()) for a in table.buffers()
                  if shared is None or not shared.holds(a))
        return {"tables": own, "shared": shared.nbytes if shared is not None else 0}

    def release(self) -> None:
        for table in self.tables.values():
            close = getattr(table, "close", None)
            if close is not None:
                close()
        self.tables = {}
        self._sets = {}
        shared, self.shared = self.shared, None
        if shared is not None:
            shared.release()


class DramStore:
    """Tables in this process's memory; each version has its own copy (load beside, swap)."""

    kind = "dram"

    def __init__(self, dtype: str = "float32") -> None:
        self.dtype = dtype  # embedding_dtype: TableSpec.dtype of the versions opened here
        self.metrics = StoreMetrics(self.kind)

    def open_version(self, version: str, specs: dict[str, TableSpec], source) -> LocalVersionTables:
        """The version's tables, loaded from ``source``. In a worker process (``workers: N``) they
        are loaded once for the server into a shared-memory segment that every worker maps
        (:mod:`.shared_tables`)."""
        name = shared_tables.version_name(self.kind, version, specs, source)
        if name is None:
            return self._load(version, specs, source)

        built: list[LocalVersionTables] = []  # the builder's private copy, dropped once mapped

        def build():
            built.append(self._load(version, specs, source))
            return built[0], {n: t.shared_arrays() for n, t in built[0].tables.items()}

        def wrap(arrays, shared):
            tables = {n: DramTable.adopt(specs[n], *arrays[n]) for n in specs}
            vt = LocalVersionTables(self.kind, version, specs, tables, self.metrics)
            vt.shared = shared
            vt.progress = built.pop().progress if built else None
            return vt

        def own_copy(vt, error):
            vt.shared_note = f"none: this worker holds its own copy ({error})"
            return vt

        return shared_tables.open_shared(name, build, wrap, own_copy)

    def _load(self, version: str, specs: dict[str, TableSpec], source) -> LocalVersionTables:
        sizes = _row_counts(source, specs)
        tables = {name: DramTable(spec, sizes.get(name, 0)) for name, spec in specs.items()}
        vt = LocalVersionTables(self.kind, version, specs, tables, self.metrics)
        vt.load(source)
        return vt

    def describe(self) -> dict[str, Any]:
        return {"type": self.kind, "embedding_dtype": self.dtype}

    def close(self) -> None:
        return None


def _row_counts(source, specs: dict[str, TableSpec]) -> dict[str, int]:
    return {name: spec.rows for name, spec in specs.items()}
