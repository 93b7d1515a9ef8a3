"""RowBudget: one model's batching queue capacity, in rows, shared by all its queues.

A model has one budget of ``max_enqueued_batches * max_batch_size`` rows. Every queue of the
model (the native queue of each version's SessionGroup and the reference
:class:`~processor.batching.batcher.Batcher`) takes a request's rows from it when the request
is queued and gives them back when its batch starts to run; a request whose rows do not fit is
refused (Unavailable). So the bound holds per model, not per queue.

:func:`new_budget` gives the native one (``native/src/batcher.h``, lock-free, which the native
queues can take from without the GIL) when the extension is built, else :class:`RowBudget`,
the reference with the same interface. Thread-safe.
"""

from __future__ import annotations

import threading

from .. import native


class RowBudget:
    """See the module doc: ``try_take(rows) -> bool``, ``give(rows)``, ``used``, ``capacity``."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._used = 0
        self._lock = threading.Lock()

    def try_take(self, rows: int) -> bool:
        """Take ``rows`` if they fit in what is left; False (nothing taken) if not."""
        with self._lock:
            if rows > self.capacity - self._used:
                return False
            self._used += rows
            return True

    def give(self, rows: int) -> None:
        """Give back rows taken."""
        with self._lock:
            self._used -= rows

    @property
    def used(self) -> int:
        return self._used


def new_budget(capacity: int):
    """The native budget when the extension is built, else the reference."""
    return native.MODULE.RowBudget(capacity) if native.MODULE is not None else RowBudget(capacity)
