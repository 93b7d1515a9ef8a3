"""The embedding stores' native parts (``native/src/row_store.*`` in ``processor._native``).

* :func:`lookup_rows`: a :class:`~.dram_store.DramTable` lookup (the :class:`~.hash_index.HashIndex`
  probe and the row gather, float16 rows widened to float32) in one call without the GIL,
  over the table's own arrays. The Python code (``HashIndex.find`` and the numpy gather in
  :meth:`~.dram_store.DramTable.lookup_reference`) stays the reference it is tested against
  (``tests/unit/features/test_native_rows.py``) and the fallback when the extension is not built.
* :func:`lookup_many`: the same for several tables in one call (a request's lookups).
* :func:`row_cache`: a native ``RowCache`` (CLOCK, thread-safe), or None when not built.

``AVAILABLE`` says whether the extension is there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..native import MODULE

AVAILABLE = MODULE is not None and hasattr(MODULE, "lookup_many")


def lookup_rows(index, values: np.ndarray, default: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, int]:
    """(float32 ``[len(keys), dim]``: each key's row of ``values`` through ``index``, ``default``
    where absent; the number absent). ``keys`` int64, contiguous. Needs ``AVAILABLE``."""
    out = np.empty((len(keys), values.shape[1]), np.float32)
    (misses,) = MODULE.lookup_many([_lookup_args(index, values, default, keys, out)])
    return out, misses


def lookup_many(tables: Sequence[tuple[Any, np.ndarray]]) -> list[tuple[np.ndarray, int]]:
    """:func:`lookup_rows` of several ``(DramTable, keys)`` in one native call (the GIL released
    once): per table, (its rows, the number absent). Needs ``AVAILABLE``."""
    work, outs = [], []
    for table, keys in tables:
        out = np.empty((len(keys), table.values.shape[1]), np.float32)
        work.append(_lookup_args(table.index, table.values, table.default, keys, out))
        outs.append(out)
    return list(zip(outs, MODULE.lookup_many(work)))


def _lookup_args(index, values: np.ndarray, default: np.ndarray, keys: np.ndarray, out: np.ndarray) -> tuple:
    """One table's item of the native ``lookup_many``: float16 rows as their bits, an index in
    identity mode as its size."""
    stored = values.view(np.uint16) if values.dtype == np.float16 else values
    if index.identity:
        return _NO_KEYS, _NO_SLOTS, index.size, stored, default, keys, out
    return index._keys, index._slots, -1, stored, default, keys, out


def find_rows(index, keys: np.ndarray) -> np.ndarray:
    """``index.find(keys)`` in native code (identity mode excluded). Needs ``AVAILABLE``."""
    out = np.empty(len(keys), np.int64)
    MODULE.find_rows(index._keys, index._slots, np.ascontiguousarray(keys, np.int64), out)
    return out


def row_cache(capacity: int, dim: int):
    """A native ``RowCache`` of ``capacity`` float32 rows of ``dim``, or None without the extension."""
    return MODULE.RowCache(capacity, dim) if AVAILABLE else None


_NO_KEYS = np.empty(0, np.int64)
_NO_SLOTS = np.empty(0, np.int32)
