"""SharedUpdateGate: the update gate of parameters that several processes map and write in place.

With ``workers > 1`` an ONNX Runtime version's parameters are one shared-memory segment, mapped
``MAP_SHARED`` by every worker (:mod:`processor.shared_segments`). A delta is then written once,
by whichever worker gets to it first, and every worker's sessions read the new rows on their
next run. This gate extends :class:`~.update_gate.UpdateGate` (threads of one process) to every
process that maps the segment:

* **Exclusion across processes**: two ``fcntl`` open-file-description (OFD) locks on bytes far
  past the segment's data. ``DATA``: a process holds it shared while any of its requests runs
  (taken by its first request in, dropped by its last one out: two system calls per busy
  period, not per request), a writer exclusive while it writes. OFD locks belong to the open
  file, so the kernel drops them when their process dies: a worker killed while it holds the
  lock (reading or writing) never blocks the others.
* **Writer preference**: a writer takes ``TURNSTILE`` exclusive, raises the ``WAITING`` word of
  the segment's state page, then waits for ``DATA``. A process that sees ``WAITING`` lets no new
  request in: once its requests in flight are done (its shared ``DATA`` lock dropped), they wait
  on ``TURNSTILE`` (shared), which the writer releases when it is done. A ``WAITING`` left by a
  writer that died is cleared by the first reader that gets ``TURNSTILE``.
* **Applied once** (:meth:`apply`): the state page records the last delta step written
  (``APPLIED``) and the step being written (``DIRTY``). A worker that gets to a delta another
  one wrote skips the write. A writer that dies mid-write leaves ``DIRTY`` set: requests that
  read the segment then fail with Unavailable (half a delta is never served) until a worker
  applies that delta again (every live worker still has it to apply, or is waiting for the
  lock to apply it; a restarted worker applies it while it loads, before its warm-up).

State page words (int64, native order): ``APPLIED`` = last step written + 1 (0: none),
``DIRTY`` = step being written + 1 (0: clean), ``WAITING`` = 1 while a writer waits or writes.

Thread-safe, as UpdateGate. The gate uses the segment's descriptor and state page; the owner
keeps the segment open while the gate is in use.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import struct
import threading
from collections.abc import Callable, Iterator

from ..errors import Unavailable
from .update_gate import UpdateGate

STATE_BYTES = 4096  # the state page at the end of a segment
APPLIED, DIRTY, WAITING = 0, 1, 2  # int64 words of the state page

log = logging.getLogger(__name__)

_DATA = 1 << 40  # lock byte offsets: past any data, so the locks never meet the mapping's use
_TURNSTILE = _DATA + 1


def _flock(kind: int, start: int) -> bytes:
    # struct flock on Linux x86-64 / aarch64: short type, short whence, off_t start, off_t len,
    # pid_t pid (0 for OFD locks), padded to 32 bytes
    return struct.pack("hhqqi4x", kind, os.SEEK_SET, start, 1, 0)


_READ_DATA, _WRITE_DATA, _FREE_DATA = (_flock(k, _DATA) for k in (fcntl.F_RDLCK, fcntl.F_WRLCK, fcntl.F_UNLCK))
_READ_TURNSTILE, _WRITE_TURNSTILE, _FREE_TURNSTILE = (
    _flock(k, _TURNSTILE) for k in (fcntl.F_RDLCK, fcntl.F_WRLCK, fcntl.F_UNLCK))


def state_words(buffer, offset: int) -> memoryview:
    """The state page's words (a writable view of ``buffer`` at ``offset``)."""
    return memoryview(buffer)[offset:offset + 64].cast("q")


class SharedUpdateGate(UpdateGate):
    """See the module doc. ``fd``: this process's own descriptor of the segment file (one open
    file description per gate); ``words``: :func:`state_words` of the segment; ``name`` for
    error messages."""

    def __init__(self, fd: int, words: memoryview, name: str) -> None:
        super().__init__()
        self._fd = fd
        self._words = words
        self._name = name
        self._written = 0  # deltas this gate wrote (the others' it skipped)
        self._parked = 0  # requests of this process waiting for another process's writer
        self._turnstile = threading.Lock()  # one thread per process at the turnstile (OFD locks are per file)

    def _fcntl(self, request: bytes) -> None:
        fcntl.fcntl(self._fd, fcntl.F_OFD_SETLKW, request)

    # --- requests -------------------------------------------------------------------------------

    def enter_shared(self) -> None:
        with self._lock:
            if not (self._writer or self._waiting_writers or self._words[WAITING]):
                self._admit()
                return
        self._enter_slow()

    def try_enter_shared(self) -> bool:
        """:meth:`enter_shared` when no update runs or waits in any process, else False at once
        (an event loop must not wait for a delta); Unavailable as :meth:`enter_shared`."""
        with self._lock:
            if self._writer or self._waiting_writers or self._words[WAITING]:
                return False
            self._admit()
            return True

    def _admit(self) -> None:
        """Count one request in (the thread lock held); the first takes ``DATA`` shared."""
        if not self._readers:
            self._fcntl(_READ_DATA)  # waits only for a writer that raised WAITING after the check
        self._readers += 1
        dirty = self._words[DIRTY]
        if dirty:
            self._leave()
            raise Unavailable(f"the parameters in {self._name} hold part of delta {dirty - 1}: the worker "
                              f"writing it stopped; they serve again once a worker applies it")

    def _enter_slow(self) -> None:
        while True:
            with self._cond:
                while self._writer or self._waiting_writers:
                    self._cond.wait()
                if not self._words[WAITING]:
                    self._admit()
                    return
                if self._readers:  # ours in flight hold DATA, the writer waits for them: wait too
                    self._parked += 1
                    try:
                        self._cond.wait(0.05)
                    finally:
                        self._parked -= 1
                    continue
            self._wait_for_writer()

    def _wait_for_writer(self) -> None:
        """Wait (no thread lock held) until no process holds ``TURNSTILE`` exclusive; clear a
        ``WAITING`` its holder left when it died."""
        with self._turnstile:
            self._fcntl(_READ_TURNSTILE)
            try:
                if self._words[WAITING]:  # no writer holds the turnstile: one died waiting or writing
                    self._words[WAITING] = 0
            finally:
                self._fcntl(_FREE_TURNSTILE)

    def exit_shared(self) -> None:
        with self._lock:
            self._leave()

    def _leave(self) -> None:
        self._readers -= 1
        if not self._readers:
            self._fcntl(_FREE_DATA)
            if self._waiting_writers or self._parked:
                self._cond.notify_all()

    # --- updates --------------------------------------------------------------------------------

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with super().exclusive():  # this process's requests first: its DATA lock is free then
            with self._turnstile:
                self._fcntl(_WRITE_TURNSTILE)
                try:
                    self._words[WAITING] = 1
                    self._fcntl(_WRITE_DATA)  # every other process's requests done
                    try:
                        yield
                    finally:
                        self._words[WAITING] = 0
                        self._fcntl(_FREE_DATA)
                finally:
                    self._fcntl(_FREE_TURNSTILE)

    def apply(self, step: int, write: Callable[[], None]) -> bool:
        """Under :meth:`exclusive`: ``write()`` delta ``step`` unless a worker has (returns
        whether it wrote). While it writes, ``DIRTY`` says so; an exception leaves it set."""
        words = self._words
        if words[APPLIED] >= step + 1 and not words[DIRTY]:
            log.info("delta %d: already in %s (written by another worker)", step, self._name)
            return False
        words[DIRTY] = step + 1
        write()
        words[APPLIED] = max(words[APPLIED], step + 1)
        words[DIRTY] = 0
        self._written += 1
        log.info("delta %d: written into %s for every worker", step, self._name)
        return True

    def weights_stamp(self) -> int:
        """The segment's last delta written, by any worker (``APPLIED``): another worker's write
        changes it before this process applies that delta itself."""
        return self._words[APPLIED]

    def state(self) -> dict[str, int | None]:
        """The segment's delta state (the last step written, the step half-written if any) and
        how many deltas this process wrote."""
        applied, dirty = self._words[APPLIED], self._words[DIRTY]
        return {"applied_delta": applied - 1 if applied else None,
                "half_written_delta": dirty - 1 if dirty else None, "deltas_written_here": self._written}
