"""Embedding tables in checkpoints: plain 2-D variables and the EmbeddingVariable export format.

A table ``T`` is stored in a checkpoint either

* as a plain variable ``T`` of shape ``[rows, dim]``: keys are the row indices ``0..rows-1``
  (``keyed_by="row"``), or
* in DeepRec's EmbeddingVariable export naming (``keyed_by="raw"``, keys are raw feature ids):
  ``T-keys`` int64 ``[n]``, ``T-values`` ``[n, dim]``, ``T-freqs`` and ``T-versions`` ``[n]``
  (optional), ``T-keys_filtered`` / ``T-freqs_filtered`` (ids seen in training but not admitted:
  they hold no row and are served the default vector). A partitioned table is stored as
  ``T/part_<k>-keys`` ... for k = 0, 1, ...; the parts are merged into one table ``T``.

Deltas (incremental checkpoints) use the export naming for changed rows of every table, with the
table's own keys (row ids for a plain table, raw ids for an EV table); DeepRec's
``-sparse_incr_keys`` / ``-sparse_incr_values`` are accepted too; ``T-removed_keys`` (or
``T/part_<k>-removed_keys``) names the ids the delta removes (see :mod:`processor.checkpoint.delta`).
Everything else in a delta is a dense variable, whole.

Reading is whole-tensor (the bundle reader has no cheap row ranges), one table part at a time,
then handed out in chunks.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from ..checkpoint.delta import MARKERS, REMOVED_SUFFIX, CheckpointError, Delta, VariableInfo, removed_ids
from .rows import RowChunk

_PART = re.compile(r"^(?P<table>.+)/part_(?P<k>\d+)$")
_KEY_SUFFIXES = {"-keys": "-values", "-sparse_incr_keys": "-sparse_incr_values"}
_META = ("-freqs", "-versions", "-keys_filtered", "-freqs_filtered", "-partition_offset",
         "-partition_filter_offset", "-sparse_incr_freqs", "-sparse_incr_versions")


@dataclass
class TableLayout:
    """Where one table's rows are in a checkpoint."""

    name: str
    keyed_by: str  # "row" (plain variable) or "raw" (EV export)
    dim: int
    rows: int
    parts: list[str] = field(default_factory=list)  # EV: the prefixes "T" or "T/part_k"; plain: ["T"]
    key_suffix: str = "-keys"
    filtered: int = 0


def _reader(prefix: str):
    from tensorflow.python.training import py_checkpoint_reader

    try:
        return py_checkpoint_reader.NewCheckpointReader(prefix)
    except Exception as exc:  # the reader raises several types for a corrupt bundle
        raise CheckpointError(f"cannot read checkpoint {prefix!r}: {type(exc).__name__}: {exc}") from exc


class CheckpointTables:
    """The tables (and dense tensors) of one checkpoint bundle. Not thread-safe."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._reader = _reader(prefix)
        self.shapes: dict[str, list[int]] = self._reader.get_variable_to_shape_map()

    def ev_tables(self) -> dict[str, TableLayout]:
        """Every table stored in the export naming, partitions merged, by table name."""
        found: dict[str, TableLayout] = {}
        for name, shape in self.shapes.items():
            suffix = next((s for s in _KEY_SUFFIXES if name.endswith(s)), None)
            if suffix is None:
                continue
            part = name[: -len(suffix)]
            values = part + _KEY_SUFFIXES[suffix]
            if values not in self.shapes:
                raise CheckpointError(f"checkpoint {self.prefix!r}: {name!r} has no {values!r}")
            vshape = self.shapes[values]
            if len(vshape) != 2 or vshape[0] != shape[0]:
                raise CheckpointError(f"checkpoint {self.prefix!r}: {values!r} has shape {vshape}, "
                                      f"expected [{shape[0]}, dim]")
            m = _PART.match(part)
            table = m.group("table") if m else part
            layout = found.setdefault(table, TableLayout(table, "raw", int(vshape[1]), 0, [], suffix))
            if layout.dim != vshape[1]:
                raise CheckpointError(f"checkpoint {self.prefix!r}: parts of {table!r} differ in dim")
            layout.parts.append(part)
            layout.rows += int(shape[0])
            filtered = self.shapes.get(part + "-keys_filtered")
            layout.filtered += int(filtered[0]) if filtered else 0
        for layout in found.values():
            layout.parts.sort(key=lambda p: int(m.group("k")) if (m := _PART.match(p)) else -1)
        return found

    def layout(self, table: str, ev: Mapping[str, TableLayout] | None = None) -> TableLayout | None:
        """How ``table`` is stored here, or None if it is not."""
        ev = self.ev_tables() if ev is None else ev
        if table in ev:
            return ev[table]
        shape = self.shapes.get(table)
        if shape is not None and len(shape) == 2:
            return TableLayout(table, "row", int(shape[1]), int(shape[0]), [table])
        return None

    def tensor(self, name: str) -> np.ndarray:
        return self._reader.get_tensor(name)

    def chunks(self, layout: TableLayout, chunk_rows: int = 65536) -> Iterator[RowChunk]:
        """The rows of ``layout`` in chunks (keys int64, values float32, metadata if stored)."""
        if layout.keyed_by == "row":
            values = np.asarray(self.tensor(layout.name), np.float32)
            for start in range(0, len(values), chunk_rows):
                stop = min(start + chunk_rows, len(values))
                yield RowChunk(np.arange(start, stop, dtype=np.int64), values[start:stop])
            return
        value_suffix = _KEY_SUFFIXES[layout.key_suffix]
        for part in layout.parts:
            keys = np.asarray(self.tensor(part + layout.key_suffix), np.int64).reshape(-1)
            values = np.asarray(self.tensor(part + value_suffix), np.float32)
            freqs = self._optional(part, ("-freqs", "-sparse_incr_freqs"), len(keys))
            versions = self._optional(part, ("-versions", "-sparse_incr_versions"), len(keys))
            for start in range(0, len(keys), chunk_rows):
                sl = slice(start, start + chunk_rows)
                yield RowChunk(keys[sl], values[sl], None if freqs is None else freqs[sl],
                               None if versions is None else versions[sl])

    def _optional(self, part: str, suffixes: tuple[str, ...], n: int) -> np.ndarray | None:
        for suffix in suffixes:
            if part + suffix in self.shapes:
                arr = np.asarray(self.tensor(part + suffix), np.int64).reshape(-1)
                return arr if len(arr) == n else None
        return None

    def table_names(self) -> set[str]:
        """Names that belong to some table (export-format tensors, removals); the rest are dense
        tensors."""
        names = {n for n in self.shapes if n.endswith(REMOVED_SUFFIX)}
        ev = self.ev_tables()
        for layout in ev.values():
            for part in layout.parts:
                names.update(part + s for s in (*_KEY_SUFFIXES, *_KEY_SUFFIXES.values(), *_META))
        return names & set(self.shapes)

    def removed(self) -> dict[str, np.ndarray]:
        """The ids each table's ``-removed_keys`` names (partitions merged; distinct, sorted)."""
        parts: dict[str, list[np.ndarray]] = {}
        for name in self.shapes:
            if name.endswith(REMOVED_SUFFIX):
                part = name[: -len(REMOVED_SUFFIX)]
                m = _PART.match(part)
                parts.setdefault(m.group("table") if m else part, []).append(
                    removed_ids(self.prefix, name, np.asarray(self.tensor(name))))
        return {table: np.unique(np.concatenate(ids)) for table, ids in parts.items()}

    def table_rows(self, layout: TableLayout) -> RowChunk:
        """Every row of ``layout`` in one chunk (parts joined; metadata when every part has it)."""
        parts = list(self.chunks(layout, chunk_rows=1 << 62))
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return RowChunk(np.empty(0, np.int64), np.empty((0, layout.dim), np.float32))
        meta = [None if any(getattr(c, m) is None for c in parts) else np.concatenate([getattr(c, m) for c in parts])
                for m in ("freqs", "versions")]
        return RowChunk(np.concatenate([c.keys for c in parts]), np.concatenate([c.values for c in parts]), *meta)


def delta_rows(prefix: str, tables) -> tuple[dict[str, RowChunk], dict[str, np.ndarray]]:
    """(rows, removed ids) of the tables ``tables`` names in delta ``prefix``: what a shared store
    writes (:mod:`.redis_store` reads a delta again this way when it recovers)."""
    ckpt = CheckpointTables(prefix)
    ev = ckpt.ev_tables()
    rows = {name: ckpt.table_rows(ev[name]) for name in tables if name in ev}
    removed = {name: ids for name, ids in ckpt.removed().items() if name in tables}
    return rows, removed


@dataclass
class TableSource:
    """Where a version's tables come from: its full checkpoint, plus the newest applied delta.

    ``step``: the full's step; ``stamp_versions``: a row the checkpoint gives no version (the
    step of its last update) gets its checkpoint's step (``row_ttl_steps`` needs one per row)."""

    full_prefix: str
    delta_prefix: str = ""
    delta_step: int = -1
    step: int = -1
    stamp_versions: bool = False

    def rows(self, specs: Mapping[str, object], chunk_rows: int = 65536) -> Iterator[tuple[str, RowChunk]]:
        """(table, chunk) for every table of ``specs``: the full's rows but those the delta
        removes, then the delta's."""
        full = CheckpointTables(self.full_prefix)
        ev = full.ev_tables()
        delta = CheckpointTables(self.delta_prefix) if self.delta_prefix else None
        removed = delta.removed() if delta is not None else {}
        for table in specs:
            layout = full.layout(table, ev)
            if layout is None:
                raise CheckpointError(f"checkpoint {self.full_prefix!r} holds no table {table!r}")
            gone = removed.get(table)
            for chunk in full.chunks(layout, chunk_rows):
                if gone is not None and len(gone):
                    keep = ~np.isin(chunk.keys, gone)
                    chunk = RowChunk(chunk.keys[keep], chunk.values[keep],
                                     *(None if m is None else m[keep] for m in (chunk.freqs, chunk.versions)))
                yield table, self._stamped(chunk, self.step)
        if delta is not None:
            dev = delta.ev_tables()
            for table in specs:
                if table in dev:
                    for chunk in delta.chunks(dev[table], chunk_rows):
                        yield table, self._stamped(chunk, self.delta_step)

    def _stamped(self, chunk: RowChunk, step: int) -> RowChunk:
        if not self.stamp_versions or chunk.versions is not None:
            return chunk
        return RowChunk(chunk.keys, chunk.values, chunk.freqs, np.full(len(chunk), max(step, 0), np.int64))

    def row_count(self, specs: Mapping[str, object]) -> int:
        full = CheckpointTables(self.full_prefix)
        ev = full.ev_tables()
        total = 0
        for table in specs:
            layout = full.layout(table, ev)
            total += layout.rows if layout else 0
        return total


class StoreDelta(Delta):
    """A delta whose table rows go to a FeatureStore: ``rows[table] = (keys, values)`` with the
    table's own keys (no row-range check), ``chunks`` the same rows with their metadata."""

    def __init__(self, step: int) -> None:
        super().__init__(step)
        self.chunks: dict[str, RowChunk] = {}


def read_store_delta(prefix: str, step: int, tables: Mapping[str, int],
                     dense: Mapping[str, VariableInfo]) -> StoreDelta:
    """Read a delta for a store-served model; check it; raise CheckpointError.

    ``tables``: store-served table -> dim; ``dense``: the variables TensorFlow still holds.
    """
    ckpt = CheckpointTables(prefix)
    delta = StoreDelta(step)
    ev = ckpt.ev_tables()
    removed = ckpt.removed()
    for table in (*ev, *removed):
        if table not in tables:
            if table in dense:
                raise CheckpointError(f"delta {prefix!r}: rows for {table!r}, which is not an embedding "
                                      f"table served from the feature store")
            raise CheckpointError(f"delta {prefix!r}: table {table!r} is not a table of the model")
    for table, layout in ev.items():
        if layout.dim != tables[table]:
            raise CheckpointError(f"delta {prefix!r}: {table!r} rows have dim {layout.dim}, "
                                  f"the model's is {tables[table]}")
        chunk = delta.chunks[table] = ckpt.table_rows(layout)
        delta.rows[table] = (chunk.keys, chunk.values)
    delta.removed = removed
    used = ckpt.table_names()
    for name in ckpt.shapes:
        if name in MARKERS:
            delta.set_marker(name, ckpt.tensor(name))
            continue
        if name in used or name == "global_step" and name not in dense:
            continue
        info = dense.get(name)
        if info is None:
            if name in tables:
                raise CheckpointError(f"delta {prefix!r}: {name!r} is served from the feature store; "
                                      f"a delta must carry its changed rows as {name}-keys / -values")
            raise CheckpointError(f"delta {prefix!r}: tensor {name!r} is not a variable of the model")
        delta.set_dense(prefix, name, ckpt.tensor(name), info)
    delta.check_not_empty(prefix)
    return delta
