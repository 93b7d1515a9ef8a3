"""DRAM+SSD store (``ev_storage_type`` 12): a DRAM row cache over an SSD file per table.

Per table:

* the key index (:class:`~.hash_index.HashIndex`, key -> row) stays in DRAM (about 15 bytes a
  key, against ``4 * dim`` bytes of row);
* every row lives in a file ``<ev_storage_path>/<model>/<version>/<n>.rows`` (float32, or
  float16 with ``embedding_dtype`` float16; row ``r`` at byte ``r * itemsize * dim``), read
  through a read-only ``mmap`` with random-access advice;
* a DRAM cache of ``cache_rows`` rows, replaced by CLOCK (second chance): a hit sets the slot's
  reference bit; a miss takes slots whose bit is clear, clearing bits as the hand sweeps.

A delta's removed ids (and rows ``row_ttl_steps`` expires) leave the index and the DRAM cache at
once; their rows in the file are freed, reused by later inserts (so the file does not grow
while deltas remove as many ids as they add), and a background thread per table gives the
file system back every 4 KiB block whose rows are all free (``fallocate`` punching a hole;
model info: ``ssd_allocated`` bytes). A file shared by workers is never changed: there the freed
rows are only reused.

Sizes come from ``ev_storage_size``: the first number is the DRAM budget in bytes for the row
caches of all tables of a version (split in proportion to each table's bytes); the second, if
given, the most bytes the SSD files may take (a load past it fails); without ``ev_storage_size``
the DRAM budget is 1 GiB. The kernel's page cache
over the files is not counted: it is shared and the kernel reclaims it.

Thread safety: lookups of one table serialize on the table's lock (the cache changes on every
miss); upserts and removals run while no lookup does (behind the update gate), and take the
lock against the table's reclaim thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import mmap
import os
import re
import shutil
import threading
from typing import Any

import numpy as np

from .. import shared_segments
from ..errors import ConfigError
from . import shared_tables
from .dram_store import (LocalVersionTables, adopt_index_and_meta, checked_values, forget_meta, index_and_meta,
                         write_meta)
from .rows import LookupStats, Narrowing, RowChunk, TableSpec, to_storage
from .hash_index import HashIndex
from .store_metrics import StoreMetrics


DEFAULT_DRAM_BYTES = 1 << 30  # DRAM row cache of a version when ev_storage_size is not given
BLOCK = 4096  # the file-system block a freed file range is given back in

log = logging.getLogger("processor.features")
_FALLOC_PUNCH = 0x01 | 0x02  # FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE (linux/falloc.h)


def punch_hole(fd: int, offset: int, length: int) -> str | None:
    """Give the file system back ``length`` bytes of ``fd`` at ``offset`` (they read as zeros
    after; the file keeps its size). None when done, else why not (no such call here, or the
    file system does not punch holes)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fallocate = libc.fallocate
    except (OSError, AttributeError) as exc:
        return f"no fallocate: {exc}"
    fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
    if fallocate(fd, _FALLOC_PUNCH, offset, length) != 0:
        code = ctypes.get_errno()
        return f"fallocate(PUNCH_HOLE): {errno.errorcode.get(code, code)}"
    return None


class TieredTable:
    """See the module doc."""

    def __init__(self, spec: TableSpec, path: str, cache_rows: int, capacity: int = 0) -> None:
        self._setup(spec, path, cache_rows, HashIndex(capacity), capacity)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        self._grow_file(max(capacity, 16))

    def _setup(self, spec: TableSpec, path: str, cache_rows: int, index: HashIndex, rows: int) -> None:
        self.spec = spec
        self.path = path
        self.row_bytes = spec.storage.itemsize * spec.dim
        self.index = index
        self.default = spec.default_vector()
        self.stats = LookupStats(extra={"cache_hits": 0, "ssd_reads": 0})
        self.narrowing = Narrowing() if spec.dtype != "float32" else None
        self.cache_rows = max(1, int(cache_rows))
        self._cache = np.zeros((self.cache_rows, spec.dim), spec.storage)
        self._cache_row = np.full(self.cache_rows, -1, np.int64)  # SSD row held by each slot
        self._ref = np.zeros(self.cache_rows, np.uint8)
        self._hand = 0
        self._slot_of = np.full(max(rows, 16), -1, np.int32)  # SSD row -> cache slot
        self.freqs: np.ndarray | None = None
        self.versions: np.ndarray | None = None
        self._lock = threading.Lock()
        self._file_rows = 0
        self._map: mmap.mmap | None = None
        self._rows_view: np.ndarray | None = None
        # over a file another worker wrote (see shared_file): rows added past its end
        self._added: np.ndarray | None = None
        self._reclaim_rows: list[np.ndarray] = []  # freed rows whose blocks may go back (see remove)
        self._reclaimer: threading.Thread | None = None
        self.reclaim_off: str | None = None  # why blocks are not given back, if they are not

    @classmethod
    def shared_file(cls, spec: TableSpec, path: str, cache_rows: int, numbers: dict[str, Any],
                    arrays: dict[str, np.ndarray]) -> TieredTable:
        """A table over the rows file the first worker of this server wrote (``workers: N``;
        :meth:`TieredStore.open_version`), with the index and metadata :func:`index_and_meta`
        gave (views of a shared segment). The file is mapped privately (copy-on-write): a delta
        writes this worker's own copies of the pages it touches, rows it adds past the file's
        end are held in DRAM, and the file never changes. Its DRAM cache is this worker's own."""
        table = cls.__new__(cls)
        rows = os.path.getsize(path) // (spec.storage.itemsize * spec.dim)
        table._setup(spec, path, cache_rows, HashIndex(), rows)
        adopt_index_and_meta(table, numbers, arrays)
        table._fd = os.open(path, os.O_RDONLY)
        table._map = mmap.mmap(table._fd, rows * table.row_bytes, flags=mmap.MAP_PRIVATE,
                               prot=mmap.PROT_READ | mmap.PROT_WRITE)
        if hasattr(table._map, "madvise"):
            table._map.madvise(mmap.MADV_RANDOM)
        table._rows_view = np.frombuffer(table._map, spec.storage).reshape(rows, spec.dim)
        table._file_rows = rows
        table._added = np.empty((0, spec.dim), spec.storage)
        return table

    def shared_arrays(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """What :meth:`shared_file` takes besides the file: the index and metadata."""
        return index_and_meta(self)

    @property
    def size(self) -> int:
        """The keys held."""
        return self.index.count

    def held_ids(self) -> np.ndarray:
        """The ids held, sorted (a copy; for tests and tools, not the request path)."""
        return np.sort(self.index.keys())

    # --- file -------------------------------------------------------------------------------

    @property
    def _row_capacity(self) -> int:
        return self._file_rows + (len(self._added) if self._added is not None else 0)

    def _grow_slot_of(self, rows: int) -> None:
        if len(self._slot_of) < rows:
            grown = np.full(rows, -1, np.int32)
            grown[: len(self._slot_of)] = self._slot_of
            self._slot_of = grown

    def _grow_file(self, rows: int) -> None:
        if rows <= self._row_capacity:
            return
        if self._added is not None:  # a shared file: added rows go to DRAM
            rows = max(rows, int(self._row_capacity * 1.5) + 16)
            grown = np.empty((rows - self._file_rows, self.spec.dim), self._added.dtype)
            grown[: len(self._added)] = self._added
            self._added = grown
            self._grow_slot_of(rows)
            return
        rows = max(rows, int(self._file_rows * 1.5) + 16)
        os.ftruncate(self._fd, rows * self.row_bytes)
        if self._map is not None:
            self._rows_view = None
            self._map.close()
        self._map = mmap.mmap(self._fd, rows * self.row_bytes, prot=mmap.PROT_READ)
        if hasattr(self._map, "madvise"):
            self._map.madvise(mmap.MADV_RANDOM)
        self._rows_view = np.frombuffer(self._map, self.spec.storage).reshape(rows, self.spec.dim)
        self._file_rows = rows
        self._grow_slot_of(rows)

    def _write_rows(self, rows: np.ndarray, values: np.ndarray) -> None:
        """Write rows to the file: contiguous runs with one pwrite each (a shared file: into
        this worker's private mapping and added rows)."""
        if self._added is not None:
            inside = rows < self._file_rows
            self._rows_view[rows[inside]] = values[inside]
            self._added[rows[~inside] - self._file_rows] = values[~inside]
            return
        order = np.argsort(rows, kind="stable")
        rows, values = rows[order], np.ascontiguousarray(values[order])
        breaks = np.flatnonzero(np.diff(rows) != 1) + 1
        starts = np.concatenate(([0], breaks))
        ends = np.concatenate((breaks, [len(rows)]))
        for a, b in zip(starts.tolist(), ends.tolist()):
            os.pwrite(self._fd, values[a:b].tobytes(), int(rows[a]) * self.row_bytes)

    # --- serving ----------------------------------------------------------------------------

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """float32 ``[len(keys), dim]``: each key's row, the default vector where absent."""
        return self.lookup_counted(keys)[0]

    def lookup_counted(self, keys: np.ndarray) -> tuple[np.ndarray, int, int, int]:
        """(:meth:`lookup`'s rows, default vectors served, DRAM cache hits, SSD reads)."""
        rows = self.index.find(keys)
        present = rows >= 0
        out = np.empty((len(rows), self.spec.dim), np.float32)
        out[~present] = self.default
        hits = reads = 0
        if present.any():
            uniq, inverse = np.unique(rows[present], return_inverse=True)
            with self._lock:
                fetched, hits = self._fetch(uniq)
            reads = len(uniq) - hits
            out[present] = fetched[inverse]  # float16 rows are widened here
        defaults = int(len(rows) - np.count_nonzero(present))
        self.stats.add(len(rows), defaults)
        return out, defaults, hits, reads

    def _fetch(self, rows: np.ndarray) -> tuple[np.ndarray, int]:
        """(rows (distinct, sorted) from the cache or the file, cache hits); misses enter the cache."""
        slots = self._slot_of[rows]
        hit = slots >= 0
        out = np.empty((len(rows), self.spec.dim), self._cache.dtype)
        if hit.any():
            hs = slots[hit]
            out[hit] = self._cache[hs]
            self._ref[hs] = 1
        miss_rows = rows[~hit]
        if miss_rows.size:
            data = self._read(miss_rows)
            out[~hit] = data
            victims = self._victims(min(miss_rows.size, self.cache_rows))
            cached = miss_rows[: victims.size]
            self._cache[victims] = data[: victims.size]
            self._cache_row[victims] = cached
            self._slot_of[cached] = victims
            self._ref[victims] = 0
        hits = int(np.count_nonzero(hit))
        self.stats.extra["cache_hits"] += hits
        self.stats.extra["ssd_reads"] += int(miss_rows.size)
        return out, hits

    def _read(self, rows: np.ndarray) -> np.ndarray:
        """Rows (sorted: the reads go forward through the file) from the file, or added ones."""
        if self._added is None or rows[-1] < self._file_rows:
            return self._rows_view[rows]
        out = np.empty((len(rows), self.spec.dim), self._added.dtype)
        inside = rows < self._file_rows
        out[inside] = self._rows_view[rows[inside]]
        out[~inside] = self._added[rows[~inside] - self._file_rows]
        return out

    def _victims(self, m: int) -> np.ndarray:
        """``m`` cache slots to reuse, by CLOCK; their old rows leave the cache."""
        size = self.cache_rows
        if m >= size:
            victims = np.arange(size)
        else:
            chosen, got = [], 0
            taken = np.zeros(size, bool)
            while got < m:
                window = min(size, max(2 * (m - got), 64))
                idx = (self._hand + np.arange(window)) % size
                free = idx[(self._ref[idx] == 0) & ~taken[idx]][: m - got]
                self._ref[idx] = 0  # second chance: the hand clears what it passes
                taken[free] = True
                chosen.append(free)
                got += free.size
                self._hand = (self._hand + window) % size
            victims = np.concatenate(chosen)
        old = self._cache_row[victims]
        self._slot_of[old[old >= 0]] = -1
        self._cache_row[victims] = -1
        return victims

    # --- updates ----------------------------------------------------------------------------

    def upsert(self, chunk: RowChunk) -> int:
        if len(chunk) == 0:
            return 0
        values = to_storage(self.spec, checked_values(self.spec, chunk), self.narrowing)
        with self._lock:  # the reclaim thread reads the index and punches the file
            rows, new = self.index.upsert(chunk.keys)
            self._grow_file(self.index.size)
            self._write_rows(rows, values)
            slots = self._slot_of[rows]  # write-through: cached copies follow the file
            cached = slots >= 0
            if cached.any():
                self._cache[slots[cached]] = values[cached]
        write_meta(self, rows, chunk, self._row_capacity)
        return new

    def remove(self, keys: np.ndarray) -> int:
        """Drop the rows of ``keys`` it holds (others are ignored): out of the index and the DRAM
        cache now; their file rows are reused by later upserts, and the blocks left wholly free
        are given back by the table's reclaim thread (own files only). Returns how many it held."""
        with self._lock:
            rows = self.index.remove(keys)
            if not len(rows):
                return 0
            slots = self._slot_of[rows]
            cached = slots >= 0
            self._cache_row[slots[cached]] = -1  # the slots are taken first by later misses
            self._ref[slots[cached]] = 0
            self._slot_of[rows] = -1
            forget_meta(self, rows)
            if self._added is None and self.reclaim_off is None:
                self._reclaim_rows.append(rows)
                if self._reclaimer is None:
                    self._reclaimer = threading.Thread(target=self._reclaim, name="ssd-reclaim", daemon=True)
                    self._reclaimer.start()
        return len(rows)

    def _reclaim(self) -> None:
        """The reclaim thread: punch the blocks of freed rows while some are pending."""
        while True:
            with self._lock:
                pending, self._reclaim_rows = self._reclaim_rows, []
                if not pending or self._fd < 0:
                    self._reclaimer = None
                    return
                self._punch(np.unique(np.concatenate(pending)))

    def _punch(self, rows: np.ndarray) -> None:
        """Give back the blocks holding ``rows`` (freed) whose rows are all free (under the lock)."""
        rb, file_rows = self.row_bytes, self._file_rows
        free = np.zeros(file_rows + 1, bool)
        held_free = self.index.free_rows
        free[held_free[held_free < file_rows]] = True
        running = np.concatenate(([0], np.cumsum(free[:file_rows])))
        blocks = np.unique(np.concatenate((rows * rb // BLOCK, ((rows + 1) * rb - 1) // BLOCK)))
        blocks = blocks[(blocks + 1) * BLOCK <= file_rows * rb]  # whole blocks of the file only
        first, last = blocks * BLOCK // rb, ((blocks + 1) * BLOCK - 1) // rb
        blocks = blocks[running[last + 1] - running[first] == last - first + 1]
        breaks = np.flatnonzero(np.diff(blocks) != 1) + 1
        for run in np.split(blocks, breaks):
            if not len(run):
                continue
            why = punch_hole(self._fd, int(run[0]) * BLOCK, len(run) * BLOCK)
            if why is not None:
                self.reclaim_off = why
                log.warning("feature store dram_ssd: %s: freed rows are reused, but their blocks are not "
                            "given back (%s)", self.path, why)
                return

    def wait_reclaimed(self) -> None:
        """Return once the reclaim thread has given back what was pending (tests, release)."""
        thread = self._reclaimer
        if thread is not None:
            thread.join()

    def nbytes(self) -> dict[str, int]:
        meta = sum(a.nbytes for a in (self.freqs, self.versions) if a is not None)
        out = {"dram_cache": int(self._cache.nbytes + self._cache_row.nbytes + self._ref.nbytes),
               "index": self.index.nbytes + int(self._slot_of.nbytes), "metadata": int(meta),
               "ssd": int(min(self.index.count, self._file_rows) * self.row_bytes),
               "ssd_allocated": int(os.fstat(self._fd).st_blocks * 512) if self._fd >= 0 else 0}
        if self._added is not None:
            out["dram_added_rows"] = int(self._added.nbytes)
        return out

    def buffers(self) -> list[np.ndarray]:
        """Every array of the DRAM tier, whole: the row cache and its bookkeeping, the key index,
        the SSD row -> cache slot map, metadata and rows added past a shared file (the SSD file
        itself is not memory)."""
        return [a for a in (self._cache, self._cache_row, self._ref, self._slot_of, *self.index.buffers(),
                            self.freqs, self.versions, self._added) if a is not None]

    def close(self, remove_file: bool = True) -> None:
        """Unmap and close the file; remove it unless ``remove_file`` is False (a file the
        first worker wrote for all: :class:`~.shared_tables.SharedTables` removes it)."""
        with self._lock:
            self._reclaim_rows = []  # the reclaim thread ends at its next round
        self.wait_reclaimed()
        self._rows_view = None
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a lookup result still views the map; the OS frees it later
                pass
            self._map = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if remove_file and self._added is None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "_"


class TieredStore:
    """DRAM+SSD tables; each version has its own files (load beside, swap, delete the old)."""

    kind = "dram_ssd"

    def __init__(self, root: str, dram_bytes: int, ssd_bytes: int | None = None, dtype: str = "float32") -> None:
        self.root = root
        self.dtype = dtype  # embedding_dtype: TableSpec.dtype of the versions opened here
        self.dram_bytes = int(dram_bytes)
        self.ssd_bytes = ssd_bytes
        self.metrics = StoreMetrics(self.kind)
        os.makedirs(root, exist_ok=True)

    @classmethod
    def from_config(cls, config, model_name: str) -> TieredStore:
        sizes = config.ev_storage_size or (DEFAULT_DRAM_BYTES,)
        return cls(os.path.join(config.ev_storage_path, _safe(model_name or "default")), sizes[0],
                   sizes[1] if len(sizes) > 1 else None, config.embedding_dtype)

    def open_version(self, version: str, specs: dict[str, TableSpec], source) -> LocalVersionTables:
        """The version's tables, loaded from ``source`` into files under ``<root>/<version>``.

        In a worker process (``workers: N``) the first worker of the server writes the files, in
        ``<root>/<segment name>``, and publishes the key indexes in a shared-memory segment, under
        the segment's lock (:mod:`.shared_tables`); the others wait for it and reuse both (the
        segment is the mark that the files are complete). Each worker keeps its own DRAM caches.
        The last worker's release removes the files with the segment."""
        total_bytes = sum(max(s.rows, 1) * s.storage.itemsize * s.dim for s in specs.values())
        if self.ssd_bytes is not None and total_bytes > self.ssd_bytes:
            raise ConfigError(f"ev_storage_size: version {version} needs {total_bytes} bytes of SSD, "
                              f"the limit is {self.ssd_bytes}")
        name = shared_tables.version_name(self.kind, version, specs, source, self.root)
        if name is None:
            return self._load(version, specs, source, os.path.join(self.root, _safe(version)), total_bytes)
        directory = os.path.join(self.root, name)
        built: list[LocalVersionTables] = []
        failed: list[OSError] = []

        def build():
            shutil.rmtree(directory, ignore_errors=True)  # files of a server that was stopped hard
            built.append(self._load(version, specs, source, directory, total_bytes))
            return built[0], {n: t.shared_arrays() for n, t in built[0].tables.items()}

        def wrap(arrays, shared):
            progress = None
            if built:  # the builder's tables: closed, their files kept for every worker
                for table in built[0].tables.values():
                    table.close(remove_file=False)
                progress = built.pop().progress
            tables = {n: TieredTable.shared_file(specs[n], path, cache, *arrays[n])
                      for n, (path, cache) in self._files(directory, specs, total_bytes).items()}
            vt = LocalVersionTables(self.kind, version, specs, tables, self.metrics, tier="dram_cache")
            vt.shared, vt.progress = shared, progress
            return vt

        def own_copy(vt, error):
            vt.release()  # its files are where another worker would write: removed under the lock
            failed.append(error)

        vt = shared_tables.open_shared(name, build, wrap, own_copy, directory)
        if vt is None:
            vt = self._load(version, specs, source, os.path.join(self.root, f"{_safe(version)}.{os.getpid()}"),
                            total_bytes)
            vt.shared_note = f"none: this worker holds its own files and index ({failed[0]})"
        return vt

    def _files(self, directory: str, specs: dict[str, TableSpec], total_bytes: int) -> dict[str, tuple[str, int]]:
        """Each table's rows file and DRAM cache rows (its share of the budget by bytes)."""
        out = {}
        for i, (name, spec) in enumerate(sorted(specs.items())):
            row_bytes = spec.storage.itemsize * spec.dim
            share = self.dram_bytes * (max(spec.rows, 1) * row_bytes) / max(total_bytes, 1)
            out[name] = (os.path.join(directory, f"{i}.rows"), int(share // row_bytes))
        return out

    def _load(self, version: str, specs: dict[str, TableSpec], source, directory: str,
              total_bytes: int) -> LocalVersionTables:
        tables = {name: TieredTable(specs[name], path, cache, specs[name].rows)
                  for name, (path, cache) in self._files(directory, specs, total_bytes).items()}
        vt = LocalVersionTables(self.kind, version, specs, tables, self.metrics, tier="dram_cache")
        try:
            vt.load(source)
        except BaseException:
            vt.release()
            raise
        return vt

    def describe(self) -> dict[str, Any]:
        return {"type": self.kind, "path": self.root, "dram_bytes": self.dram_bytes, "ssd_bytes": self.ssd_bytes,
                "embedding_dtype": self.dtype}

    def close(self) -> None:
        if shared_segments.active() is None:
            shutil.rmtree(self.root, ignore_errors=True)
            return
        with contextlib.suppress(OSError):  # workers: the others may still use files in it
            os.rmdir(self.root)
