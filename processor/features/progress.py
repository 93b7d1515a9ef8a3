"""Progress of a large table load: rows done, rows/s and ETA in the log, readable by model info."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

log = logging.getLogger("processor.features")


class LoadProgress:
    """Counts rows of one load; logs at most every ``interval`` seconds. Thread-safe."""

    def __init__(self, label: str, total_rows: int, interval: float = 2.0) -> None:
        self.label = label
        self.total = max(int(total_rows), 0)
        self.done = 0
        self.interval = interval
        self.started = time.monotonic()
        self.finished: float | None = None
        self._last_log = self.started
        self._lock = threading.Lock()
        log.info("%s: loading %d rows", label, self.total)

    def add(self, rows: int) -> None:
        with self._lock:
            self.done += rows
            now = time.monotonic()
            if now - self._last_log < self.interval:
                return
            self._last_log = now
        log.info("%s", self.line())

    def finish(self) -> None:
        self.finished = time.monotonic()
        log.info("%s: loaded %d rows in %.2f s (%.0f rows/s)", self.label, self.done,
                 self.finished - self.started, self.rate())

    def rate(self) -> float:
        elapsed = (self.finished or time.monotonic()) - self.started
        return self.done / elapsed if elapsed > 0 else 0.0

    def line(self) -> str:
        rate = self.rate()
        left = max(self.total - self.done, 0)
        eta = f"{left / rate:.0f} s" if rate > 0 else "?"
        pct = 100.0 * self.done / self.total if self.total else 100.0
        return f"{self.label}: {self.done}/{self.total} rows ({pct:.1f}%), {rate:.0f} rows/s, ETA {eta}"

    def describe(self) -> dict[str, Any]:
        return {"label": self.label, "rows_done": self.done, "rows_total": self.total,
                "rows_per_s": round(self.rate(), 1), "done": self.finished is not None,
                "seconds": round((self.finished or time.monotonic()) - self.started, 3)}
