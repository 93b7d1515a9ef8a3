"""The rows a feature store holds and serves: a table's spec, a chunk of its rows, lookup counters.

Plain data, imported by the stores (:mod:`.dram_store`, :mod:`.tiered_store`,
:mod:`.redis_store`), the checkpoint readers (:mod:`.ev_checkpoint`) and the store contract
(:mod:`.feature_store`, which re-exports them) without importing any of those.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


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

    def as_dict(self) -> dict[str, Any]:
        return {"lookups": self.lookups, "ids": self.ids, "default_vectors_served": self.default_served,
                **self.extra}
