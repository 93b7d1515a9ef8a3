"""The rows a feature store holds and serves: a table's spec, a chunk of its rows, lookup counters.

Plain data, imported by the stores (:mod:`.dram_store`, :mod:`.tiered_store`,
:mod:`.redis_store`), the checkpoint readers (:mod:`.ev_checkpoint`) and the store contract
(:mod:`.feature_store`, which re-exports them) without importing any of those.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ConfigError

# embedding_dtype -> how rows are stored (converted to float32 at lookup)
STORAGE_DTYPES = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16)}


@dataclass(frozen=True)
class TableSpec:
    """One embedding table as the model sees it.

    ``keyed_by``: ``"row"`` when keys are the gather's row indices (a plain 2-D variable in the
    checkpoint), ``"raw"`` when keys are raw feature ids (an EmbeddingVariable export).
    ``rows`` is the checkpoint's row count (a sizing hint; the table may grow).
    """

    name: str
    dim: int
    keyed_by: str = "row"
    rows: int = 0
    default: tuple[float, ...] | None = None
    dtype: str = "float32"  # embedding_dtype: how the store holds the rows (lookups give float32)

    @property
    def storage(self) -> np.dtype:
        return STORAGE_DTYPES[self.dtype]

    def default_vector(self) -> np.ndarray:
        if self.default is None:
            return np.zeros(self.dim, np.float32)
        vec = np.asarray(self.default, np.float32)
        if vec.shape != (self.dim,):
            raise ValueError(f"table {self.name!r}: default vector has {vec.size} values, dim is {self.dim}")
        return vec


@dataclass
class RowChunk:
    """Rows of one table: keys int64 [n], values float32 [n, dim], optional freqs / versions [n]."""

    keys: np.ndarray
    values: np.ndarray
    freqs: np.ndarray | None = None
    versions: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.keys)


@dataclass
class LookupStats:
    """Counters a store keeps per version (read without locks: approximate under concurrency)."""

    lookups: int = 0
    ids: int = 0
    default_served: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def add(self, ids: int, default_served: int) -> None:
        """One lookup of ``ids`` ids, ``default_served`` of them absent."""
        self.lookups += 1
        self.ids += ids
        self.default_served += default_served

    def as_dict(self) -> dict[str, Any]:
        return {"lookups": self.lookups, "ids": self.ids, "default_vectors_served": self.default_served,
                **self.extra}


@dataclass
class Narrowing:
    """What storing a table's rows as ``embedding_dtype`` float16 cost, measured while loading:
    the bytes saved against float32 and the largest absolute difference from the float32 value.
    Written by the loading thread (and deltas, behind the update gate); read by model info."""

    rows: int = 0
    bytes_saved: int = 0
    max_abs_diff: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"dtype": "float16", "rows_converted": self.rows, "bytes_saved": self.bytes_saved,
                "max_abs_diff_from_float32": self.max_abs_diff}


def to_storage(spec: TableSpec, values: np.ndarray, narrowing: Narrowing | None) -> np.ndarray:
    """``values`` (float32 ``[n, dim]``) in ``spec``'s storage dtype. For float16 the cost is
    added to ``narrowing``, and a row with a finite value past float16's range (65504) is refused:
    ConfigError naming ``embedding_dtype`` (such a value would be served as inf)."""
    if spec.dtype == "float32":
        return values
    with np.errstate(over="ignore"):
        half = values.astype(np.float16)
    overflow = np.isinf(half) & np.isfinite(values)
    if overflow.any():
        worst = float(np.max(np.abs(values[overflow])))
        raise ConfigError(f"embedding_dtype: table {spec.name!r} holds the value {worst:g}, beyond float16's "
                          f"range (65504); it would be served as inf. Use embedding_dtype 'float32' for this model")
    if narrowing is not None and len(values):
        diff = np.abs(half.astype(np.float32) - values)
        finite = np.isfinite(diff)
        narrowing.rows += len(values)
        narrowing.bytes_saved += len(values) * spec.dim * 2
        if finite.any():
            narrowing.max_abs_diff = max(narrowing.max_abs_diff, float(diff[finite].max()))
    return half


def in_keys_shape(rows: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """``rows`` ``[keys.size, dim]`` as ``keys.shape + [dim]``: what a store's lookup returns."""
    return rows.reshape(np.shape(keys) + rows.shape[1:])
