"""DrainGate: counts requests in flight and refuses new ones once draining starts (SIGTERM).

Both transports call :meth:`enter` before touching a model and :meth:`exit` after; the
shutdown path calls :meth:`start_draining` then :meth:`wait_idle`. Thread-safe.
"""

from __future__ import annotations

import threading

from processor.errors import Unavailable


class DrainGate:
    """See the module doc."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())  # not the default RLock: per request
        self._in_flight = 0
        self._draining = False

    def enter(self) -> None:
        """Count one request in; Unavailable once the server is draining."""
        with self._cond:
            if self._draining:
                raise Unavailable("server is shutting down; send the request to another replica")
            self._in_flight += 1

    def exit(self) -> None:
        with self._cond:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._cond.notify_all()

    def start_draining(self) -> None:
        with self._cond:
            self._draining = True

    def wait_idle(self, timeout: float | None) -> bool:
        """Wait until no request is in flight; False if ``timeout`` passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: self._in_flight == 0, timeout)

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def in_flight(self) -> int:
        return self._in_flight
