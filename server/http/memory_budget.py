"""The memory the server lets JSON requests (TF Serving REST, KServe v2) use at once
(``json_decode_memory_bytes``).

A JSON request holds, from the moment its size is known (``Content-Length``, or as a chunked
body arrives) until its reply is ready:

* ``FACTOR`` times its body size: the body, the runs being parsed, the response (measured:
  under 1.6 x the body at the peak besides the arrays, see tests/e2e/test_server_json_limits.py);
* the bytes of its input arrays, charged by the decoder as it allocates them (numbers at their
  itemsize; strings as the bytes objects they become, about 33 bytes plus their length each).

A body parsed whole by orjson rather than a run at a time (larger than
:data:`~server.http.json_stream.SMALL_BODY`: :func:`server.http.json_stream.parse_whole`) holds
``WHOLE_FACTOR`` times its size instead, its arrays counted inside that (charged beyond it only):
every value of the body is a Python object at once. It is parsed whole only when that fits now
(:meth:`Hold.try_whole`), else a run at a time within its ``FACTOR``.

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
# bytes held per body byte of a body parsed whole: orjson's Python objects (measured 3 to 19 x
# the body across body shapes: 5 x for columns of floats, 11 x for rows of one float, 16-19 x
# for rows of one-key objects and short strings), the body itself and the numeric arrays made
# from them
WHOLE_FACTOR = 24
DEFAULT_BUDGET = 1 << 30
RETRY_AFTER_SECONDS = 1


class MemoryBusy(Unavailable):
    """503: the decode budget is held by other requests; ``retry_after`` seconds is a hint."""

    retry_after = RETRY_AFTER_SECONDS


class MemoryBudget:
    """See the module doc. ``capacity``: bytes; 0 turns admission off."""

    def __init__(self, capacity: int, factor: int = FACTOR, whole_factor: int = WHOLE_FACTOR) -> None:
        self.capacity = capacity
        self.factor = factor
        self.whole_factor = whole_factor
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

    def _try_take(self, nbytes: int, total: int) -> bool:
        """:meth:`_take` that answers False (nothing taken) where it would raise."""
        if total > self.capacity:
            return False
        with self._lock:
            if self.used + nbytes > self.capacity:
                return False
            self.used += nbytes
            self.peak = max(self.peak, self.used)
        return True

    def _give(self, nbytes: int) -> None:
        if nbytes and self.capacity:
            with self._lock:
                self.used -= nbytes


class Hold:
    """One request's share of the budget; grows with :meth:`need`, :meth:`try_whole` and
    :meth:`charge`, returned on exit."""

    def __init__(self, budget: MemoryBudget) -> None:
        self.budget = budget
        self.held = 0
        self.body = 0
        self.arrays = 0
        self.whole = False  # the body is parsed whole: whole_factor times it held

    def _want(self, body: int, arrays: int) -> int:
        """What a request of ``body`` bytes whose decoder made ``arrays`` bytes holds."""
        want = body * self.budget.factor + arrays
        return max(want, body * self.budget.whole_factor) if self.whole else want

    def need(self, body_bytes: int) -> None:
        """The request's body is ``body_bytes`` long (so far): hold ``factor`` times that."""
        if body_bytes <= self.body:
            return
        want = self._want(body_bytes, self.arrays)
        self.budget._take(want - self.held, want, body_bytes)
        self.held, self.body = want, body_bytes

    def try_whole(self, body_bytes: int) -> bool:
        """Hold ``whole_factor`` times ``body_bytes`` (the body is parsed whole) if the budget
        has room for it now; False, nothing changed, if not (over the whole budget, other
        requests holding it, or no budget: capacity 0)."""
        budget = self.budget
        if not budget.capacity:
            return False
        body = max(body_bytes, self.body)
        want = max(body * budget.factor + self.arrays, body * budget.whole_factor)
        if want > self.held and not budget._try_take(want - self.held, want):
            return False
        self.held, self.body, self.whole = max(want, self.held), body, True
        return True

    def charge(self, nbytes: int) -> None:
        """The request's decoder allocates ``nbytes`` more for its arrays (a body parsed whole:
        counted inside its ``whole_factor``, beyond it only)."""
        want = self._want(self.body, self.arrays + nbytes)
        if want > self.held:
            self.budget._take(want - self.held, want, self.body)
            self.held = want
        self.arrays += nbytes

    def release(self) -> None:
        held, self.held, self.body, self.arrays, self.whole = self.held, 0, 0, 0, False
        self.budget._give(held)

    def __enter__(self) -> Hold:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


