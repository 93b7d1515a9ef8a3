"""CpuMeter: whether the server is busy now, for work that must yield to requests.

Shadow copies (processor/shadow.py) are shed while it is. Busy, over the last window:

* the machine's CPUs: the share of CPU time ``/proc/stat`` counts as not idle is at least
  ``threshold`` (whole-machine time, not this process's: on cores shared with a load generator,
  a sidecar or another worker, a copy takes its CPU from them as much as from our requests); or
* one of the event-loop threads that answer requests (:meth:`CpuMeter.watch`) ran at least
  ``loop_threshold`` of a core (``/proc/self/task/<tid>/stat``). An event loop is one thread
  holding the GIL: it saturates long before the cores do, and a copy's own Python work takes
  the GIL from it, so the copies must stop before it is full.

Not the requests in flight, which stay at one on a loop that answers each request in place.
Sampled at most once a window (a few small file reads), so a caller may ask per request. Where
the files cannot be read, never busy. Thread-safe (a benign race: two callers may both sample).
"""

from __future__ import annotations

import os
import time

STAT = "/proc/stat"
_HZ = os.sysconf("SC_CLK_TCK")  # jiffies a second


def _thread_jiffies(tid: int) -> int | None:
    """User + system jiffies of this process's thread ``tid``, or None where unreadable."""
    try:
        with open(f"/proc/self/task/{tid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])  # utime, stime (the 14th and 15th of the line)


def _cpu_times() -> tuple[int, int] | None:
    """(idle, total) jiffies of all CPUs, or None where unreadable."""
    try:
        with open(STAT, "rb") as f:
            fields = f.readline().split()
    except OSError:
        return None
    values = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return values[3] + values[4], sum(values)


class CpuMeter:
    """See the module doc."""

    def __init__(self, threshold: float = 0.8, loop_threshold: float = 0.6, window: float = 0.2) -> None:
        self.threshold = threshold
        self.loop_threshold = loop_threshold
        self.window = window
        self._sampled_at = time.monotonic()
        self._last = _cpu_times()
        self._threads: dict[int, int | None] = {}  # watched tid -> its jiffies at the last sample
        self._busy = False

    def watch(self, tid: int) -> None:
        """Count thread ``tid`` (a ``threading.get_native_id()``: an event loop's) as one whose
        own load makes the server busy."""
        self._threads = {**self._threads, tid: _thread_jiffies(tid)}

    def busy(self) -> bool:
        now = time.monotonic()
        elapsed = now - self._sampled_at
        if elapsed >= self.window:
            current = _cpu_times()
            last, self._last, self._sampled_at = self._last, current, now
            busy = False
            if current is not None and last is not None and current[1] > last[1]:
                busy = 1.0 - (current[0] - last[0]) / (current[1] - last[1]) >= self.threshold
            threads = {}
            for tid, before in self._threads.items():
                jiffies = threads[tid] = _thread_jiffies(tid)
                if jiffies is not None and before is not None:
                    busy = busy or (jiffies - before) / _HZ / elapsed >= self.loop_threshold
            self._threads = threads
            self._busy = busy
        return self._busy
