"""ContextCache: the context part's results (boundary tensors) of recent contexts, across requests.

A ranking service sees the same user again within seconds (the next page, a refresh): its
context part's results are the same as long as the weights are. One cache per served version
(its :class:`~processor.context.runner.ContextRunner`), so a new version starts empty; a delta
empties it (:meth:`ContextCache.clear`, called under the update gate held exclusive, so no
request computing with the old weights is still running) and bumps its generation, and a result
computed under an older generation is never stored (:meth:`put` checks), so a stale boundary
tensor is never served.

* Key: the context inputs' exact contents (alias, dtype, shape and bytes; string inputs by
  their values), so two contexts share an entry only when they are equal. The entry's bytes
  count the key too.
* Bounds: ``max_entries`` (least recently used dropped first) and ``ttl_ms`` (an older entry is
  a miss, and dropped).
* Workers sharing their weights (ONNX Runtime with ``workers`` > 1): another worker may write a
  delta into the shared parameters before this process applies it; the runner passes the update
  gate's weights stamp (the segment's last written delta) to :meth:`follow` on every lookup,
  which clears the cache when it changed.
* Counters (:meth:`stats`): hits, misses, entries, bytes, evictions, expired, invalidations.

Thread-safe: one lock around each O(1) dict operation; values are tuples of arrays that no one
writes (the runner tiles copies of them).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

Key = tuple


class ContextCache:
    """See the module doc. ``clock``: seconds, monotonic (tests give their own)."""

    def __init__(self, max_entries: int, ttl_ms: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = max_entries
        self.ttl = ttl_ms / 1000.0 if ttl_ms is not None else None
        self._clock = clock
        self._lock = threading.Lock()
        # key -> (stored at, generation, value, bytes)
        self._entries: OrderedDict[Key, tuple[float, int, tuple[np.ndarray, ...], int]] = OrderedDict()
        self.generation = 0  # bumped by clear(): results computed before are not stored
        self._stamp = 0  # the weights stamp the entries were computed under (follow)
        self._bytes = 0
        self._counts = {"hits": 0, "misses": 0, "evictions": 0, "expired": 0, "invalidations": 0}

    @staticmethod
    def key(feeds: dict[str, np.ndarray], aliases: tuple[str, ...]) -> Key:
        """The key of a context: its inputs ``aliases`` of ``feeds`` by exact content."""
        parts = []
        for alias in aliases:
            array = feeds[alias]
            data = tuple(array.ravel().tolist()) if array.dtype == object else np.ascontiguousarray(array).tobytes()
            parts.append((alias, array.dtype.str, array.shape, data))
        return tuple(parts)

    def get(self, key: Key) -> tuple[np.ndarray, ...] | None:
        """The stored value of ``key`` (counted a hit), or None (a miss: absent or expired)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                if self.ttl is not None and self._clock() - entry[0] > self.ttl:
                    self._drop(key)
                    self._counts["expired"] += 1
                else:
                    self._entries.move_to_end(key)
                    self._counts["hits"] += 1
                    return entry[2]
            self._counts["misses"] += 1
            return None

    def put(self, key: Key, value: tuple[np.ndarray, ...], generation: int) -> bool:
        """Store ``value``, computed while the cache's generation was ``generation``; nothing is
        stored (False) if a clear came since. Drops the least recently used beyond the bound."""
        size = sum(a.nbytes for a in value) + _key_bytes(key)
        with self._lock:
            if generation != self.generation:
                return False
            if key in self._entries:
                self._drop(key)
            self._entries[key] = (self._clock(), generation, value, size)
            self._bytes += size
            while len(self._entries) > self.max_entries:
                self._drop(next(iter(self._entries)))
                self._counts["evictions"] += 1
            return True

    def clear(self) -> None:
        """Drop every entry and refuse results computed before (a delta landed)."""
        with self._lock:
            self._clear()

    def follow(self, stamp: int) -> None:
        """Clear when ``stamp`` (the update gate's :meth:`weights_stamp`) differs from the last
        one seen: another process wrote the weights, before this one's own delta clears it."""
        if stamp != self._stamp:
            with self._lock:
                if stamp != self._stamp:
                    self._stamp = stamp
                    self._clear()

    def _clear(self) -> None:
        self.generation += 1
        self._entries.clear()
        self._bytes = 0
        self._counts["invalidations"] += 1

    def _drop(self, key: Key) -> None:
        self._bytes -= self._entries.pop(key)[3]

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"max_entries": self.max_entries,
                    "ttl_ms": round(self.ttl * 1000) if self.ttl is not None else None,
                    "entries": len(self._entries), "bytes": self._bytes, **self._counts}


def _key_bytes(key: Key) -> int:
    return sum(len(data) if isinstance(data, bytes) else 8 * len(data) for _, _, _, data in key)
