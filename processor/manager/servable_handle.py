"""ServableHandle: a refcounted reference to a SessionGroup.

A request acquires the handle for its whole duration; a swap retires the old handle, and the
group is closed by whoever drops the last reference (the swapper if nothing is in flight, else
the last request) and the allocator trimmed; its reference cycles (frozen ones too) are
collected shortly after, once nothing reaches it, so that its memory is returned. So a version
is freed only after its last request ends, and never while one runs. Thread-safe.
"""

from __future__ import annotations

import threading

from .. import memory
from ..engine.session_group import SessionGroup


class ServableHandle:
    """See the module doc."""

    def __init__(self, group: SessionGroup) -> None:
        self.group = group
        self._lock = threading.Lock()
        self._refs = 0
        self._retired = False

    def acquire(self) -> bool:
        """Take a reference; False if the handle is already retired."""
        with self._lock:
            if self._retired:
                return False
            self._refs += 1
            return True

    def release(self) -> None:
        with self._lock:
            self._refs -= 1
            close = self._retired and self._refs == 0
        if close:
            self._close()

    def retire(self) -> None:
        """No new references; close the group once the in-flight ones are released."""
        with self._lock:
            if self._retired:
                return
            self._retired = True
            close = self._refs == 0
        if close:
            self._close()

    def _close(self) -> None:
        self.group.close()
        memory.trim()  # the allocator hands the freed version's pages back to the system
        memory.reclaim_soon()  # and what of the version sits in a cycle, once it is unreachable
