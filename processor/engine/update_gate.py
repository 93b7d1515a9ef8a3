"""UpdateGate: lets requests run together and a parameter update run alone.

Requests enter shared; an update enters exclusive, waits for the requests in flight, and holds
new ones back only while it writes (milliseconds for a delta). So every request sees the
parameters entirely before or entirely after an update, never a mix. Writer-preferring: a
waiting update is not starved by a stream of requests. Thread-safe.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator


class UpdateGate:
    """See the module doc."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._readers = 0
        self._writer = False
        self._waiting_writers = 0

    def enter_shared(self) -> None:
        """Enter as a request (pair with :meth:`exit_shared`); the request path's plain form.

        Uses the lock itself (a C call) rather than the Condition's Python ``with`` on the path
        every request takes; the Condition is only for waiting.
        """
        with self._lock:
            if not (self._writer or self._waiting_writers):
                self._readers += 1
                return
            while self._writer or self._waiting_writers:
                self._cond.wait()
            self._readers += 1

    def try_enter_shared(self) -> bool:
        """:meth:`enter_shared` when it would not wait (no update running or waiting), else False
        at once: for an event loop, which must not block while an update runs."""
        with self._lock:
            if self._writer or self._waiting_writers:
                return False
            self._readers += 1
            return True

    def exit_shared(self) -> None:
        with self._lock:
            self._readers -= 1
            if not self._readers and self._waiting_writers:
                self._cond.notify_all()

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        self.enter_shared()
        try:
            yield
        finally:
            self.exit_shared()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._waiting_writers += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._waiting_writers -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()

    def apply(self, step: int, write: Callable[[], None]) -> bool:
        """Under :meth:`exclusive`: ``write()`` delta ``step``; returns True (it wrote). The
        cross-process gate (:mod:`.shared_update_gate`) skips a delta another process wrote."""
        write()
        return True

    def weights_stamp(self) -> int:
        """A number that changes whenever another process writes the weights this gate guards
        (what caches of results computed from them follow: :mod:`processor.context.cache`);
        always 0 here: only this process writes, and its writes go through :meth:`apply`."""
        return 0
