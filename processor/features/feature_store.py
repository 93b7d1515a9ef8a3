"""FeatureStore: embedding rows by int64 key, for one model, across its versions.

Terms:

* a **table** is an embedding table: rows of width ``dim`` keyed by int64 ids (held as
  ``embedding_dtype``, float32 or float16; served as float32), with
  EmbeddingVariable semantics: it is not fixed-size (an upsert of an unseen id adds a row), an
  id the store does not hold is served the table's **default vector** (zeros unless a row is
  given), and rows carry the ``freq`` / ``version`` metadata of the checkpoint when it has them;
* a **version** is one full checkpoint's tables (plus the deltas applied on top). A new full
  version is loaded *beside* the served one (:meth:`FeatureStore.open_version`) and served by
  the new SessionGroup; the old one is released when its group is freed.

Store types (``feature_store_type`` / ``ev_storage_type``): :class:`~.dram_store.DramStore`
(in-process DRAM), :class:`~.tiered_store.TieredStore` (DRAM cache over an SSD file),
:class:`~.redis_store.RedisStore` (one Redis or a Redis Cluster shared by many processes).

Contract of :class:`VersionTables` (what the engine calls):

* ``lookup`` is the hot path: many (table, keys) requests in one call, answered with one
  ``[len(keys), dim]`` float32 array each; thread-safe; raises
  :class:`~processor.errors.Unavailable` (503) when a remote store cannot answer; counted in
  the store's :class:`~.store_metrics.StoreMetrics`;
* ``stage_delta`` writes a delta's rows where every process sees them (shared stores), off the
  request path; ``apply_delta`` writes rows that live in this process, while no lookup runs (the
  SessionGroup's update gate guarantees it). Both take the ids the delta removes (``removed``,
  applied before its rows: a removed id is then served the default vector, as an id never seen)
  and ``apply_delta`` of the DRAM and DRAM+SSD stores ``expire_before`` (``row_ttl_steps``: rows
  whose version is below it go too);
* ``held_ids`` lists the ids a table holds (a scan, for tests and tools);
* ``release`` frees what this process holds for the version (called once, after the last lookup).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .rows import RowChunk, TableSpec
from .store_metrics import StoreMetrics

if TYPE_CHECKING:
    from ..config import ModelConfig
    from .ev_checkpoint import TableSource


class VersionTables(Protocol):
    """One model version's tables in a store. See the module doc."""

    version: str
    specs: dict[str, TableSpec]

    def lookup(self, requests: Sequence[tuple[str, np.ndarray]]) -> list[np.ndarray]:
        """Rows for each (table, int64 keys) request: float32 ``keys.shape + [dim]`` each (keys
        of any shape: a request's key tensors as the graph computes them)."""
        ...

    def stage_delta(self, rows: dict[str, RowChunk], step: int, source: TableSource | None,
                    removed: dict[str, np.ndarray] | None = None) -> None:
        """Delete ``removed``'s ids and write rows that other processes must see too (shared
        stores); a no-op for local ones."""
        ...

    def apply_delta(self, rows: dict[str, RowChunk], step: int, removed: dict[str, np.ndarray] | None = None,
                    expire_before: int | None = None) -> None:
        """Remove ``removed``'s ids, then write rows held in this process (and forget cached
        ones); called with no lookup in flight. ``expire_before``: see the module doc."""
        ...

    def held_ids(self, table: str) -> np.ndarray:
        """The ids ``table`` holds, sorted (a scan: tests and tools, not the request path)."""
        ...

    def describe(self) -> dict[str, Any]:
        ...

    def memory(self) -> dict[str, int]:
        """The bytes the version holds in this process's memory, by part (``tables``,
        ``caches``, ``shared`` of :data:`processor.memory.PARTS`); cheap (from sizes, no walk
        of the rows): model info and metrics call it."""
        ...

    def release(self) -> None:
        ...


class FeatureStore(Protocol):
    """A model's embedding storage, alive as long as the model. Thread-safe.

    ``dtype``: how its versions hold rows (``embedding_dtype``; :attr:`TableSpec.dtype`);
    ``metrics``: its :class:`~.store_metrics.StoreMetrics`, filled by every lookup."""

    kind: str
    dtype: str
    metrics: StoreMetrics

    def open_version(self, version: str, specs: dict[str, TableSpec], source: TableSource) -> VersionTables:
        """Make ``version``'s tables servable (loading them from ``source`` if needed)."""
        ...

    def describe(self) -> dict[str, Any]:
        ...

    def close(self) -> None:
        ...


def store_kind(config: ModelConfig) -> str | None:
    """Which store serves embeddings for ``config``; None: the tables stay TensorFlow variables.

    ``redis`` / ``cluster_redis`` -> Redis; otherwise ``ev_storage_type`` 12 -> DRAM+SSD,
    1 -> DRAM; 0 -> None (the engine may still pick DRAM for an EmbeddingVariable checkpoint).
    """
    if config.feature_store_type in ("redis", "cluster_redis"):
        return config.feature_store_type
    if config.ev_storage_type == 12:
        return "dram_ssd"
    if config.ev_storage_type == 1:
        return "dram"
    return None


def open_feature_store(config: ModelConfig, model_name: str, kind: str | None = None) -> FeatureStore | None:
    """The store for ``config`` (see :func:`store_kind`), or ``kind`` when given."""
    kind = kind or store_kind(config)
    if kind is None:
        return None
    if kind == "dram":
        from .dram_store import DramStore

        return DramStore(config.embedding_dtype)
    if kind == "dram_ssd":
        from .tiered_store import TieredStore

        return TieredStore.from_config(config, model_name)
    from .redis_store import RedisStore

    return RedisStore.from_config(config, model_name)
