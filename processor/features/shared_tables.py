"""A version's feature-store tables in one shared-memory segment (``workers: N``, issue 24).

In a worker process (:func:`processor.shared_segments.active` is not None) the DRAM store
(:mod:`.dram_store`) and the DRAM+SSD store's key index (:mod:`.tiered_store`) keep a version's
arrays once for the whole server:

* every worker loading the same version computes the same segment name (:func:`version_name`:
  a hash of the store kind, the version, the table specs, what the source reads (the
  checkpoint's files: path, size, mtime; a delta loaded with it) and the store's own key, e.g.
  its directory);
* under a lock of that name (:func:`building`) the first worker builds the tables as one
  process does (privately) and writes their arrays into the segment's file (:func:`publish`);
  then every worker, the first included, maps the segment (:func:`map_existing`) and wraps its
  arrays with ``np.frombuffer`` (:func:`unpack`), without a copy;
* the mapping is private (copy-on-write): a delta a worker applies writes its own copies of
  the pages it touches, and a table that grows replaces its arrays with private ones; the
  other workers' rows never change;
* :class:`SharedTables` is what a version holds: :meth:`SharedTables.release` (from
  ``LocalVersionTables.release``) gives the segment up; the last worker's release removes its
  file (:class:`~processor.shared_segments.Segment`).

Segment layout: ``MAGIC``, the header's length (uint64, little-endian), a JSON header (per
table: its numbers and, per array, offset / dtype / shape), then the arrays, each at a
64-byte-aligned offset (the native lookups read them as they are).

A source that does not say what it reads (no ``full_prefix``: test sources) is never shared.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import logging
import os
import shutil
import struct
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from .. import shared_segments
from .rows import TableSpec

log = logging.getLogger("processor.features")

ALIGN = 64
MAGIC = b"SPTABLES"
_HEAD = len(MAGIC) + 8


def version_name(kind: str, version: str, specs: Mapping[str, TableSpec], source: Any, *extra: str) -> str | None:
    """The segment name of ``version``'s tables, the same in every worker of this server that
    loads the same version; None outside a worker or for a source that does not say what it reads."""
    if shared_segments.active() is None:
        return None
    read = source_identity(source)
    if read is None:
        return None
    tables = [[s.name, s.dim, s.keyed_by, s.rows, s.default, s.dtype] for _, s in sorted(specs.items())]
    blob = json.dumps([kind, version, tables, read, list(extra)], sort_keys=True).encode()
    return f"{kind}-tables-{hashlib.sha256(blob).hexdigest()[:24]}"


def source_identity(source: Any) -> list | None:
    """What ``source`` (an :class:`~.ev_checkpoint.TableSource`) reads: each checkpoint's files
    (real path, size, mtime) and the delta step; None for other sources."""
    full = getattr(source, "full_prefix", None)
    if not full:
        return None
    out: list = []
    for prefix in (full, getattr(source, "delta_prefix", "")):
        if prefix:
            real = os.path.realpath(prefix)
            files = sorted(glob.glob(glob.escape(real) + ".index") + glob.glob(glob.escape(real) + ".data-*"))
            out.append([real, [[os.path.basename(f), os.stat(f).st_size, os.stat(f).st_mtime_ns] for f in files]])
    out.append(int(getattr(source, "delta_step", -1)))
    if getattr(source, "stamp_versions", False):  # the rows' versions differ (row_ttl_steps)
        out.append(["versions stamped", int(getattr(source, "step", -1))])
    return out


def _build_lock(name: str):
    path = shared_segments.segment_path(name)
    return path.with_name(path.name + ".build")


@contextlib.contextmanager
def building(name: str) -> Iterator[None]:
    """This server's lock of segment ``name`` (exclusive): who holds it builds, maps or gives up
    the version's tables; the others wait. The last release removes the lock file (a waiter that
    opened it before then takes the new one); the server's stop removes any left."""
    fd = shared_segments.lock_current(_build_lock(name))
    try:
        yield
    finally:
        os.close(fd)


def map_existing(name: str) -> shared_segments.Segment | None:
    """Segment ``name`` mapped if a worker of this server published it, else None (hold
    :func:`building`)."""
    return shared_segments.Segment.open_existing(name)


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def publish(name: str, tables: Mapping[str, tuple[dict[str, Any], dict[str, np.ndarray]]]) -> shared_segments.Segment:
    """Write ``tables`` (per table: (JSON-able numbers, arrays)) into segment ``name`` and map
    it (hold :func:`building`). OSError when the segment's directory is full."""
    header: dict[str, Any] = {}
    placed: list[tuple[int, np.ndarray]] = []
    offset = 0  # from the start of the arrays, itself aligned
    for table, (numbers, arrays) in tables.items():
        header[table] = {"numbers": numbers, "arrays": {}}
        for key, arr in arrays.items():
            arr = np.ascontiguousarray(arr)
            header[table]["arrays"][key] = [offset, arr.dtype.str, list(arr.shape)]
            placed.append((offset, arr))
            offset = _aligned(offset + arr.nbytes)
    head = json.dumps(header).encode()
    start = _aligned(_HEAD + len(head))
    size = start + max(offset, ALIGN)

    def fill(path) -> None:
        with open(path, "wb") as f:
            f.write(MAGIC + struct.pack("<Q", len(head)) + head)
            for at, arr in placed:
                f.seek(start + at)
                f.write(memoryview(arr.reshape(-1)).cast("B"))
            f.truncate(size)

    return shared_segments.Segment.open(name, size, fill)


def unpack(segment: shared_segments.Segment) -> dict[str, tuple[dict[str, Any], dict[str, np.ndarray]]]:
    """``publish``'s tables as arrays over ``segment``'s mapping (writable, copy-on-write)."""
    buffer = segment.buffer
    if bytes(buffer[: len(MAGIC)]) != MAGIC:
        raise ValueError(f"{segment.path}: not a feature-store tables segment")
    (length,) = struct.unpack("<Q", buffer[len(MAGIC): _HEAD])
    header = json.loads(bytes(buffer[_HEAD: _HEAD + length]))
    start = _aligned(_HEAD + length)
    out = {}
    for table, entry in header.items():
        arrays = {}
        for key, (offset, dtype, shape) in entry["arrays"].items():
            count = int(np.prod(shape, dtype=np.int64))
            arrays[key] = np.frombuffer(buffer, np.dtype(dtype), count, start + offset).reshape(shape)
        out[table] = (entry["numbers"], arrays)
    return out


class SharedTables:
    """A version's hold on its tables' segment: what model info shows, released once.

    ``directory``: files beside the segment that live as long as it (the DRAM+SSD rows files):
    the release that removes the segment removes them too."""

    def __init__(self, name: str, segment: shared_segments.Segment, directory: str | None = None) -> None:
        self.name = name
        self.segment: shared_segments.Segment | None = segment
        self.directory = directory
        self._described = segment.describe()
        self.nbytes = segment.size  # the mapping's bytes: the version's "shared" memory
        view = np.frombuffer(segment.buffer, np.uint8)  # for its address only (see holds)
        self._span = (view.ctypes.data, view.ctypes.data + view.nbytes)
        del view

    def holds(self, array: np.ndarray) -> bool:
        """Whether ``array``'s memory lies in the segment (a table that grew holds private
        arrays instead)."""
        start = array.__array_interface__["data"][0]
        return self._span[0] <= start < self._span[1]

    def describe(self) -> dict[str, Any]:
        return {**self._described, **({"files": self.directory} if self.directory else {})}

    def release(self) -> None:
        """Give the segment up; the last worker's release removes it, ``directory`` and the lock
        file. Idempotent."""
        segment, self.segment = self.segment, None
        if segment is None:
            return
        with building(self.name):
            segment.release()
            if not segment.path.exists():
                if self.directory is not None:
                    shutil.rmtree(self.directory, ignore_errors=True)
                _build_lock(self.name).unlink(missing_ok=True)


def open_shared(name: str, build, wrap, on_failure, directory: str | None = None):
    """``wrap(unpacked arrays, SharedTables)`` over segment ``name``: mapped if a worker
    published it, else first built (``build()`` -> (private result, tables to publish)) and
    published. When the segment cannot be written (``/dev/shm`` full; logged) it returns
    ``on_failure(private result, the OSError)``, called while the lock is held."""
    with building(name):
        segment = map_existing(name)
        if segment is None:
            private, tables = build()
            try:
                segment = publish(name, tables)
            except OSError as exc:
                log.warning("shared memory: could not write the tables segment %s (%s); this worker keeps "
                            "its own copy", name, exc)
                return on_failure(private, exc)
        shared = SharedTables(name, segment, directory)
        try:
            return wrap(unpack(segment), shared)
        except BaseException:
            segment.release()
            raise
