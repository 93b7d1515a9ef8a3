"""The memory the server lets TF Serving JSON requests use at once (``json_decode_memory_bytes``).

A JSON request holds, from the moment its size is known (``Content-Length``, or as a chunked
body arrives) until its reply is ready:

* ``FACTOR`` times its body size: the body, the runs being parsed, the response (measured:
  under 1.6 x the body at the peak besides the arrays, see tests/e2e/test_server_json_limits.py);
* the bytes of its input arrays, charged by the decoder as it allocates them (numbers at their
  itemsize; strings as the bytes objects they become, about 33 bytes plus their length each).

A request that would take the total over the budget is refused at once (before its body is
read, or while it is decoded):

* ``503`` with ``Retry-After`` when other requests hold the memory (it fits once they are done);
* ``413`` when it could never fit (it alone needs more than the whole budget).

Thread-safe (a lock): holds are taken on the event loop and charged from the model's threads.
"""

from __future__ import annotations

import threading

from processor.errors import PayloadTooLarge, Unavailable

FACTOR = 2  # bytes held per body byte
DEFAULT_BUDGET = 1 << 30
RETRY_AFTER_SECONDS = 1


class MemoryBusy(Unavailable):
    """503: the decode budget is held by other requests; ``retry_after`` seconds is a hint."""

    retry_after = RETRY_AFTER_SECONDS


class MemoryBudget:
    """See the module doc. ``capacity``: bytes; 0 turns admission off."""

    def __init__(self, capacity: int, factor: int = FACTOR) -> None:
        self.capacity = capacity
        self.factor = factor
        self.used = 0
        self.peak = 0
        self._lock = threading.Lock()

    def hold(self) -> Hold:
        return Hold(self)

    def _take(self, nbytes: int, total: int, body: int) -> None:
        if not self.capacity:
            return
        if total > self.capacity:
            raise PayloadTooLarge(
                f"a JSON request of {body} bytes needs about {total} bytes to decode, more than the "
                f"server's whole decode budget of {self.capacity} bytes (json_decode_memory_bytes); "
                f"send fewer examples per request")
        with self._lock:
            if self.used + nbytes > self.capacity:
                raise MemoryBusy(
                    f"the server is decoding other large JSON requests ({self.used} of "
                    f"{self.capacity} bytes of json_decode_memory_bytes in use); retry shortly")
            self.used += nbytes
            self.peak = max(self.peak, self.used)

    def _give(self, nbytes: int) -> None:
        if nbytes and self.capacity:
            with self._lock:
                self.used -= nbytes


class Hold:
    """One request's share of the budget; grows with :meth:`need`, returned on exit."""

    def __init__(self, budget: MemoryBudget) -> None:
        self.budget = budget
        self.held = 0
        self.body = 0
        self.arrays = 0

    def need(self, body_bytes: int) -> None:
        """The request's body is ``body_bytes`` long (so far): hold ``factor`` times that."""
        if body_bytes <= self.body:
            return
        want = body_bytes * self.budget.factor + self.arrays
        self.budget._take(want - self.held, want, body_bytes)
        self.held, self.body = want, body_bytes

    def charge(self, nbytes: int) -> None:
        """The request's decoder allocates ``nbytes`` more for its arrays."""
        self.budget._take(nbytes, self.held + nbytes, self.body)
        self.held += nbytes
        self.arrays += nbytes

    def release(self) -> None:
        held, self.held, self.body, self.arrays = self.held, 0, 0, 0
        self.budget._give(held)

    def __enter__(self) -> Hold:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


