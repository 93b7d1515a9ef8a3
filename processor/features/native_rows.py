"""The embedding stores' native parts (``native/src/row_store.*`` in ``processor._native``).

* :func:`lookup_rows`: a :class:`~.dram_store.DramTable` lookup (the :class:`~.hash_index.HashIndex`
  probe and the row gather, float16 rows widened to float32) in one call without the GIL,
  over the table's own arrays. The Python code (``HashIndex.find`` and the numpy gather in
  :meth:`~.dram_store.DramTable.lookup_reference`) stays the reference it is tested against
  (``tests/unit/features/test_native_rows.py``) and the fallback when the extension is not built.
* :func:`table_set`: the same for a version's tables at once (a request's lookups), their arrays
  taken once.
* :func:`row_cache`: a native ``RowCache`` (CLOCK, thread-safe), or None when not built.
* :func:`find_slots` / :func:`place_rows`: the index probe with each key's slot, and the insert
  of new keys: a delta's upserts and removals, and rehashes (:meth:`~.hash_index.HashIndex.locate`
  and ``_place``; ``HashIndex._probe`` and ``_place_reference`` are their references).

``AVAILABLE`` says whether the extension is there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..native import MODULE

AVAILABLE = MODULE is not None and hasattr(MODULE, "TableSet")
LOCATE = AVAILABLE and hasattr(MODULE, "place_rows")  # an extension built before removals has none


def lookup_rows(index, values: np.ndarray, default: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, int]:
    """(float32 ``[len(keys), dim]``: each key's row of ``values`` through ``index``, ``default``
    where absent; the number absent). ``keys`` int64, contiguous. Needs ``AVAILABLE``."""
    rows, counts = MODULE.TableSet([_table_args(index, values, default)]).lookup([keys])
    return rows[0], int(counts[2, 0])


def table_set(tables: Sequence[Any]):
    """The native ``TableSet`` of :class:`~.dram_store.DramTable` s: ``.lookup([keys, ...])``
    gives (per table, float32 ``keys.shape + [dim]`` rows, all views of one 64-byte-aligned
    buffer; int64 ``[3, tables]``: 1, the ids and the ids absent, per table) in one call without
    the GIL. Keys of any shape, int64 (others are converted). It holds the tables' arrays as they
    are now: build a new one after an upsert. Thread-safe. Needs ``AVAILABLE``."""
    return MODULE.TableSet([_table_args(t.index, t.values, t.default) for t in tables])


def _table_args(index, values: np.ndarray, default: np.ndarray) -> tuple:
    """One table of the native ``TableSet``: float16 rows as their bits, an index in identity
    mode as its size."""
    stored = values.view(np.uint16) if values.dtype == np.float16 else values
    if index.identity:
        return _NO_KEYS, _NO_SLOTS, index.size, stored, default
    return index._keys, index._slots, -1, stored, default


def find_rows(index, keys: np.ndarray) -> np.ndarray:
    """``index.find(keys)`` in native code (identity mode excluded). Needs ``AVAILABLE``."""
    out = np.empty(len(keys), np.int64)
    MODULE.find_rows(index._keys, index._slots, np.ascontiguousarray(keys, np.int64), out)
    return out


def find_slots(index, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(``index.find(keys)``, the slot naming each row; -1 where absent) in native code
    (identity mode excluded): :meth:`~.hash_index.HashIndex.locate`. Needs ``LOCATE``."""
    keys = np.ascontiguousarray(keys, np.int64)
    rows, where = np.empty(len(keys), np.int64), np.empty(len(keys), np.int64)
    MODULE.find_slots(index._keys, index._slots, keys, rows, where)
    return rows, where


def place_rows(index, keys: np.ndarray, rows: np.ndarray) -> int:
    """Insert ``keys`` (absent, distinct) naming ``rows`` into ``index``'s slots in native code
    (``HashIndex._place`` is the reference); how many removed keys' slots they took. Needs
    ``LOCATE``."""
    taken = MODULE.place_rows(np.ascontiguousarray(keys, np.int64), np.ascontiguousarray(rows, np.int64),
                              index._slots)
    if taken < 0:
        raise RuntimeError("hash index: no free slot (its load must stay below 0.8)")
    return int(taken)


def row_cache(capacity: int, dim: int):
    """A native ``RowCache`` of ``capacity`` float32 rows of ``dim``, or None without the extension."""
    return MODULE.RowCache(capacity, dim) if AVAILABLE else None


_NO_KEYS = np.empty(0, np.int64)
_NO_SLOTS = np.empty(0, np.int32)
