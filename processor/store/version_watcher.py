"""VersionWatcher: polls the store and declares the version that should be served.

It never loads: every ``interval`` seconds it calls ``discover()`` and hands the result to
``on_version`` (the ModelManager's reconcile), off the request path, on its own daemon thread.
Errors from either are logged and counted; the thread keeps polling until :meth:`stop`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from .model_version import ModelVersion

log = logging.getLogger(__name__)


class VersionWatcher:
    """See the module doc. Thread-safe: ``stop`` may be called from any thread."""

    def __init__(self, name: str, discover: Callable[[], ModelVersion],
                 on_version: Callable[[ModelVersion], None], interval: float) -> None:
        self.name = name
        self.interval = interval
        self._discover = discover
        self._on_version = on_version
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"version-watcher-{name}", daemon=True)
        self.polls = 0
        self.errors = 0
        self.last_poll: float | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.polls += 1
            self.last_poll = time.time()
            try:
                self._on_version(self._discover())
            except Exception as exc:  # keep polling whatever a round raises
                self.errors += 1
                log.warning("%s: version poll failed: %s", self.name, exc)
