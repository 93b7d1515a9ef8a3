"""FeatureStore: embedding rows by int64 key: local DRAM, DRAM+SSD tiers, Redis, Redis Cluster.

See :mod:`.feature_store` for the contract, :mod:`.key_layout` for the Redis layout and
:mod:`processor.engine.tensorflow.embedding_lookup` for how a TensorFlow graph's lookups are served.
"""

from .feature_store import FeatureStore, VersionTables, open_feature_store, store_kind
from .rows import RowChunk, TableSpec

__all__ = ["FeatureStore", "RowChunk", "TableSpec", "VersionTables", "open_feature_store", "store_kind"]
