"""Lane selection policies (DeepRec's ``select_session_policy``: a lane is what DeepRec calls a session).

* ``MOD``: each calling OS thread gets a sticky id from a process-wide counter on its first call;
  it always uses lane ``id % lanes``. A fixed pool of N worker threads maps onto the lanes
  deterministically, and the mapping survives model swaps.
* ``RR``: a shared counter hands lanes out in turn.

Both are thread-safe and lock-free on the request path (``itertools.count`` is atomic under
the GIL).
"""

from __future__ import annotations

import itertools
import threading

_thread_ids = itertools.count()
_local = threading.local()


def _sticky_thread_id() -> int:
    tid = getattr(_local, "tid", None)
    if tid is None:
        tid = _local.tid = next(_thread_ids)
    return tid


class LanePolicy:
    """Picks the lane for the next call."""

    def __init__(self, policy: str, lanes: int) -> None:
        if policy not in ("MOD", "RR"):
            raise ValueError(f"unknown select_session_policy {policy!r}")
        self.policy = policy
        self.lanes = lanes
        self._counter = itertools.count()

    def pick(self) -> int:
        if self.lanes == 1:
            return 0
        if self.policy == "MOD":
            return _sticky_thread_id() % self.lanes
        return next(self._counter) % self.lanes
