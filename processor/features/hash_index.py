"""HashIndex: int64 key -> row number, open addressing in two numpy arrays.

The embedding stores keep their rows in dense arrays (row ``r`` of a values array); this index
maps a feature id to its row. Layout, chosen for small per-key overhead and vectorized batch
operations (no Python object per key):

* ``_keys``  int64 ``[row capacity]``: the key of each row, in insertion order;
* ``_slots`` int32 (int64 past 2**31 rows) ``[S]``: a row number, -1 (empty) or -2 (the slot
  of a removed key: a probe goes on past it, as past another key's slot), linear probing from
  ``(mix64(key) >> 32) * S >> 32`` (any S, not only powers of two); sized for a load of 0.7 and
  rehashed to that load when keys and removed keys' slots pass 0.8 (a rehash drops the -2s).

Overhead per key: 8 bytes of key plus 4 / load bytes of slot: 13.0 to 14.7 bytes, whatever the
number of keys (power-of-two tables would swing between 13.3 and 18.7).

**Removal** (:meth:`HashIndex.remove`, a delta's removed ids): the key's slot becomes -2 and its
row is freed; later inserts take freed rows first (lowest first), so a table whose deltas
remove as many ids as they add keeps its row count: the values arrays the stores keep by row
do not grow. ``size`` is the rows given out (freed ones included: the arrays' length),
``count`` the keys held.

Batch operations run probe rounds over all pending keys at once: the first round probes each
key's home slot, later rounds look at the next 16 slots of every key still pending in one 2-D
gather, so a batch takes few rounds even though linear probing has long tails.

**Identity mode.** While the keys are exactly ``0 .. n-1`` in row order (the rows of a plain 2-D
variable), no arrays exist: ``find`` is a range check and the overhead is 0 bytes a key. The
first insert that breaks the pattern builds the arrays.

Thread safety: :meth:`find` may run in any number of threads at once, but not at the same time
as :meth:`upsert` / :meth:`insert_new` / :meth:`remove` (the stores guarantee this).
"""

from __future__ import annotations

import numpy as np

from . import native_rows

_MAX_LOAD = 0.8
_TARGET_LOAD = 0.7
_MIN_SLOTS = 16
_WIDTH = 16  # slots a pending key looks at per later probe round
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_EMPTY = -1
_REMOVED = -2  # a removed key's slot (native/src/row_store.h: kRemovedSlot)


def mix64(keys: np.ndarray, salt: int = 0) -> np.ndarray:
    """SplitMix64 finaliser of ``keys`` (any int64/uint64 array), as uint64; elementwise."""
    z = np.ascontiguousarray(keys).astype(np.int64, copy=False).view(np.uint64)
    z = z + (_GOLDEN + np.uint64(salt & 0xFFFFFFFFFFFFFFFF))
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


class HashIndex:
    """See the module doc. ``capacity`` sizes the arrays for that many keys up front."""

    def __init__(self, capacity: int = 0) -> None:
        self.size = 0  # rows given out, freed ones included
        self._capacity = max(capacity, 0)
        self.identity = True  # keys == arange(size): no arrays (see the module doc)
        self._keys = np.empty(0, np.int64)
        self._slots = np.empty(0, np.int32)
        self._free = np.empty(0, np.int64)  # freed rows, ascending: taken first by inserts
        self._removed_slots = 0  # slots marked _REMOVED (they count towards the load)

    @classmethod
    def adopt(cls, size: int, identity: bool, keys: np.ndarray, slots: np.ndarray,
              free: np.ndarray | None = None, removed_slots: int = 0) -> HashIndex:
        """An index over existing arrays (:meth:`arrays`' output, e.g. views of a shared-memory
        segment), taken as they are, not copied. A later insert or removal writes into ``keys``
        and ``slots`` in place or replaces the arrays with new ones when they must grow (``keys``
        holds exactly ``size`` keys: the first new key past the freed rows grows it)."""
        index = cls(size)
        index.size = int(size)
        index.identity = bool(identity)
        if not identity:
            index._keys, index._slots = keys, slots
            index._free = np.array(free if free is not None else (), np.int64)
            index._removed_slots = int(removed_slots)
        return index

    def arrays(self) -> tuple[dict[str, int | bool], dict[str, np.ndarray]]:
        """(size, mode and removed slots, the arrays that hold the index: the keys of its rows,
        the slots and the freed rows; none in identity mode): what :meth:`adopt` takes back."""
        if self.identity:
            return {"size": self.size, "identity": True}, {}
        return ({"size": self.size, "identity": False, "removed_slots": self._removed_slots},
                {"keys": self._keys[: self.size], "slots": self._slots, "free": self._free})

    @property
    def count(self) -> int:
        """The keys held (``size`` less the freed rows)."""
        return self.size - len(self._free)

    @property
    def free_rows(self) -> np.ndarray:
        """The freed rows not taken again yet, ascending (do not modify)."""
        return self._free

    # --- sizing -----------------------------------------------------------------------------

    @staticmethod
    def _slot_count(keys: int) -> int:
        return max(_MIN_SLOTS, int(keys / _TARGET_LOAD) + 1)

    def _home(self, keys: np.ndarray) -> np.ndarray:
        """The first slot probed for each key: multiply-shift onto [0, S)."""
        return ((mix64(keys) >> np.uint64(32)) * np.uint64(len(self._slots)) >> np.uint64(32)).astype(np.int64)

    @staticmethod
    def _empty_slots(count: int) -> np.ndarray:
        return np.full(count, -1, np.int32 if count < 2**31 - 1 else np.int64)

    def buffers(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The arrays holding the index, whole (room for more keys included; empty in identity
        mode): what it costs in memory."""
        return self._keys, self._slots, self._free

    @property
    def nbytes(self) -> int:
        return int(sum(b.nbytes for b in self.buffers()))

    def keys(self) -> np.ndarray:
        """The keys held, in row order (freed rows left out; do not modify)."""
        if self.identity:
            return np.arange(self.size, dtype=np.int64)
        if not len(self._free):
            return self._keys[: self.size]
        return self._keys[self._live_rows()]

    def keys_of_rows(self, rows: np.ndarray) -> np.ndarray:
        """The keys of ``rows`` (rows held)."""
        return np.asarray(rows, np.int64) if self.identity else self._keys[rows]

    def _live_rows(self) -> np.ndarray:
        live = np.ones(self.size, bool)
        live[self._free] = False
        return np.flatnonzero(live)

    def _materialize(self, total_keys: int) -> None:
        """Leave identity mode: build the arrays for the keys 0..size-1 and room for more."""
        self.identity = False
        self._keys = np.empty(0, np.int64)
        self._slots = np.empty(0, np.int32)
        size, self.size = self.size, 0
        self.reserve(max(total_keys, size, self._capacity))
        if size:
            self._keys[:size] = np.arange(size, dtype=np.int64)
            self._place(self._keys[:size], np.arange(size, dtype=np.int64))
        self.size = size

    def reserve(self, total_keys: int) -> None:
        """Make room for ``total_keys`` keys without further growth."""
        if self.identity:
            self._capacity = max(self._capacity, total_keys)
            return
        if total_keys > len(self._keys):
            grown = np.empty(total_keys, np.int64)
            grown[: self.size] = self._keys[: self.size]
            self._keys = grown
        if total_keys > _MAX_LOAD * len(self._slots) or len(self._slots) == 0:
            self._rehash(self._slot_count(total_keys))

    def _rehash(self, slot_count: int) -> None:
        """New slots (``slot_count`` of them) holding every key held; removed keys' slots go."""
        self._slots = self._empty_slots(slot_count)
        self._removed_slots = 0
        rows = self._live_rows() if len(self._free) else np.arange(self.size, dtype=np.int64)
        if rows.size:
            self._place(self._keys[rows], rows)

    # --- lookups ----------------------------------------------------------------------------

    def find(self, keys: np.ndarray) -> np.ndarray:
        """Row of each key (int64), -1 where the key is absent."""
        q = np.ascontiguousarray(keys, dtype=np.int64).reshape(-1)
        if self.identity:
            return np.where((q >= 0) & (q < self.size), q, -1)
        return self._probe(q)[0]

    def locate(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row of each key, the slot naming it; -1 where the key is absent), not in identity
        mode: what a delta's upserts and removals probe, in native code when it is built (a
        probe of 10,000 keys of a million: ~2 ms against ~15 to 30 in numpy), else :meth:`_probe`."""
        q = np.ascontiguousarray(keys, dtype=np.int64).reshape(-1)
        if native_rows.LOCATE and self.count and q.size:
            return native_rows.find_slots(self, q)
        return self._probe(q)

    def _probe(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row of each key, the slot naming it; -1 where the key is absent), not in identity
        mode: the reference of :meth:`locate`'s native probe."""
        out = np.full(q.size, -1, np.int64)
        where = np.full(q.size, -1, np.int64)
        if self.count == 0 or q.size == 0:
            return out, where
        slots, stored = self._slots, self._keys
        count = len(slots)
        # Round 1: each key's home slot (most keys end here).
        pos = self._home(q)
        s = slots[pos].astype(np.int64, copy=False)
        occupied = s >= 0
        hit = occupied.copy()
        hit[occupied] = stored[s[occupied]] == q[occupied]
        out[hit] = s[hit]
        where[hit] = pos[hit]
        idx = np.flatnonzero((s != _EMPTY) & ~hit)  # a removed key's slot: go on
        pos = pos[idx] + 1
        pos[pos >= count] -= count
        # Later rounds: the next _WIDTH slots of every pending key at once.
        steps = np.arange(_WIDTH)
        while idx.size:
            window = pos[:, None] + steps
            window[window >= count] -= count
            s = slots[window].astype(np.int64, copy=False)
            occupied = s >= 0
            match = np.zeros(s.shape, bool)
            match[occupied] = stored[s[occupied]] == np.broadcast_to(q[idx][:, None], s.shape)[occupied]
            stop = match | (s == _EMPTY)
            done = stop.any(axis=1)
            first = stop.argmax(axis=1)
            found = done & match[np.arange(idx.size), first]
            rows_found = np.flatnonzero(found)
            out[idx[found]] = s[rows_found, first[found]]
            where[idx[found]] = window[rows_found, first[found]]
            go_on = ~done
            idx = idx[go_on]
            pos = pos[go_on] + _WIDTH
            pos[pos >= count] -= count
        return out, where

    # --- inserts ----------------------------------------------------------------------------

    def insert_new(self, keys: np.ndarray) -> np.ndarray:
        """Add distinct keys known to be absent; return their rows: freed rows first (lowest
        first), then new ones past ``size``."""
        keys = np.ascontiguousarray(keys, dtype=np.int64).reshape(-1)
        m = keys.size
        reused = min(m, len(self._free))
        rows = np.concatenate((self._free[:reused], np.arange(self.size, self.size + m - reused, dtype=np.int64)))
        if m == 0:
            return rows
        total = self.size + m - reused
        if self.identity:  # no freed rows here: a removal leaves identity mode
            if np.array_equal(keys, rows):
                self.size = total
                return rows
            self._materialize(total)
        # Grown or rehashed before the freed rows are taken: a rehash places the keys held only.
        if total > len(self._keys):
            self.reserve(max(total, int(len(self._keys) * 1.5) + 16))
        if self.count + m + self._removed_slots > _MAX_LOAD * len(self._slots):
            self._rehash(self._slot_count(max(total, self.count + m)))
        self._free = self._free[reused:]
        self._keys[rows] = keys
        self._place(keys, rows)
        self.size = total
        return rows

    def upsert(self, keys: np.ndarray) -> tuple[np.ndarray, int]:
        """Row of each key, inserting the absent ones; returns (rows, number of new keys)."""
        keys = np.ascontiguousarray(keys, dtype=np.int64).reshape(-1)
        rows = self.find(keys) if self.identity else self.locate(keys)[0]
        missing = rows < 0
        if not missing.any():
            return rows, 0
        new_keys, inverse = np.unique(keys[missing], return_inverse=True)
        new_rows = self.insert_new(new_keys)
        rows[missing] = new_rows[inverse]
        return rows, int(new_keys.size)

    # --- removals ---------------------------------------------------------------------------

    def remove(self, keys: np.ndarray) -> np.ndarray:
        """Remove the keys held among ``keys`` (absent ones and repeats are ignored); return
        their rows, now free (distinct, ascending). In identity mode the arrays are built first
        (the keys are no longer ``0 .. n-1``)."""
        q = np.unique(np.ascontiguousarray(keys, dtype=np.int64).reshape(-1))
        if self.identity:
            if not np.any((q >= 0) & (q < self.size)):
                return np.empty(0, np.int64)
            self._materialize(self.size)
        rows, where = self.locate(q)
        held = rows >= 0
        rows, where = rows[held], where[held]
        if rows.size:
            self._slots[where] = _REMOVED
            self._removed_slots += int(rows.size)
            self._free = np.union1d(self._free, rows)
        return np.sort(rows)

    def _place(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """Give ``keys`` (absent, distinct) slots naming ``rows``: in native code when it is built
        (a rehash of a million keys: tens of milliseconds against about a second in numpy),
        else :meth:`_place_reference`."""
        if native_rows.LOCATE and keys.size:
            self._removed_slots -= native_rows.place_rows(self, keys, rows)
            return
        self._place_reference(keys, rows)

    def _place_reference(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """:meth:`_place` in numpy, all pending keys a probe round at a time (a key colliding
        with another may take another slot than the native one: both are found the same)."""
        slots = self._slots
        count = len(slots)
        pos = self._home(keys)
        pending = np.arange(keys.size)
        while pending.size:
            free = slots[pos] < 0
            free_at = np.flatnonzero(free)
            if free_at.size:
                # Several pending keys may probe the same empty slot: the first one takes it.
                taken_pos, first = np.unique(pos[free_at], return_index=True)
                winners = free_at[first]
                self._removed_slots -= int(np.count_nonzero(slots[taken_pos] == _REMOVED))
                slots[taken_pos] = rows[pending[winners]]
                placed = np.zeros(pending.size, bool)
                placed[winners] = True
                keep = ~placed
                pending, pos = pending[keep], pos[keep]
            if pending.size:
                pos = pos + 1
                pos[pos == count] = 0
