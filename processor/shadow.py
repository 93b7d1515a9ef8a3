"""ShadowRunner: copies of a model's calls run on its shadow version, off the response path.

The request thread only offers a copy (:meth:`ShadowRunner.offer`: a draw against the shadow's
``fraction``, a copy of a wire request given as a view of the caller's buffer, a non-blocking
put); one daemon thread runs the copies, at the lowest CPU priority the OS gives a thread
(``nice`` 19), so on busy cores the primary's requests run first and the copies wait. At most
``max_queued`` copies wait: more are dropped and counted, never queued and never waited for. And
while ``busy()`` says the server is busy (the server: its machine's CPUs are busy,
``server/cpu_meter.py``), a copy is shed, counted, both when it is offered and when its turn to run comes: the
copies' own Python work holds the GIL, which a lower CPU priority does not give back to the
primary's requests, so under load they must not run at all. A shadow never delays a primary
answer and is the first thing shed when the server is busy. A
copy's answer goes to the caller's ``on_answer`` (the DataPlane logs it, marked as shadow),
never to a client.

Counters (:meth:`stats`): offered, ran, failed, dropped (the queue was full), shed (the server
was busy), and the seconds the copies ran.
Thread-safe: any thread may offer; :meth:`close` stops the thread after the copies queued.
"""

from __future__ import annotations

import logging
import os
import queue
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from .request import PredictCall

log = logging.getLogger(__name__)

_WIRE_VIEWS = (bytearray, memoryview)
_STOP = object()


class ShadowRunner:
    """See the module doc. ``run(call)``: runs a copy (the DataPlane binds its shadow predict
    here); its exceptions are counted as failures and logged at debug level."""

    def __init__(self, model: str, run: Callable[[PredictCall], Any] | None = None) -> None:
        self.model = model
        self.run = run
        self.busy: Callable[[], bool] | None = None  # the server's load signal (None: never busy)
        self._queue: queue.SimpleQueue | None = None  # unbounded: offer bounds it (max_queued)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False
        self.counts = {"offered": 0, "ran": 0, "failed": 0, "dropped": 0, "shed": 0}
        self.run_seconds = 0.0

    def consider(self, routing, call: PredictCall, answered: int, serves: Callable[[int], bool]) -> bool:
        """Offer a copy of ``call``, answered by version ``answered``, when its model's ``routing``
        (a :class:`~processor.routing.Routing`) has a shadow, the call named no version, another
        version answered it and the shadow's version is served (``serves``); never raises."""
        number = routing.shadow
        if number is None or call.version is not None or call.label is not None or answered == number:
            return False
        if not serves(number):
            return False
        shadow = routing.settings.shadow
        return self.offer(call, number, shadow.fraction, shadow.max_queued)

    def offer(self, call: PredictCall, number: int, fraction: float, max_queued: int) -> bool:
        """Queue a copy of ``call`` for version ``number`` with probability ``fraction``; False
        when not drawn, dropped (``max_queued`` copies wait already) or closed. Never blocks."""
        if fraction < 1.0 and random.random() >= fraction:
            return False
        self.counts["offered"] += 1
        if self._is_busy():
            return False
        pending = self._queue if self._queue is not None else self._start()
        if pending is None:
            return False
        if pending.qsize() >= max_queued:
            self.counts["dropped"] += 1
            return False
        inputs = call.inputs
        if inputs.__class__ in _WIRE_VIEWS:  # the caller may reuse its buffer once answered
            inputs = bytes(inputs)
        pending.put_nowait(call._replace(inputs=inputs, version=number, label=None, deadline=None))
        return True

    def _start(self) -> queue.Queue | None:
        with self._lock:
            if self._closed:
                return None
            if self._queue is None:
                self._queue = queue.SimpleQueue()
                self._thread = threading.Thread(target=self._loop, args=(self._queue,), daemon=True,
                                                name=f"sp-shadow-{self.model}")
                self._thread.start()
            return self._queue

    def _loop(self, pending: queue.SimpleQueue) -> None:
        try:  # Linux: a thread's own nice value (its TID as the "process")
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except (AttributeError, OSError):
            pass
        while True:
            call = pending.get()
            if call is _STOP:
                return
            if self._is_busy():
                continue
            started = time.perf_counter()
            try:
                self.run(call)
                self.counts["ran"] += 1
            except Exception as exc:  # a shadow's failure never reaches a client: counted
                self.counts["failed"] += 1
                log.debug("model %s: shadow call on version %s failed: %s", self.model, call.version, exc)
            finally:
                self.run_seconds += time.perf_counter() - started

    def _is_busy(self) -> bool:
        busy = self.busy
        if busy is not None and busy():
            self.counts["shed"] += 1
            return True
        return False

    def stats(self) -> dict[str, Any]:
        pending = self._queue
        return {**self.counts, "queued": pending.qsize() if pending is not None else 0,
                "run_seconds": round(self.run_seconds, 6)}

    def close(self, timeout: float = 5.0) -> None:
        """Run what is queued (for at most ``timeout`` seconds), then stop the thread."""
        with self._lock:
            self._closed = True
            pending, thread = self._queue, self._thread
        if pending is not None and thread is not None:
            pending.put(_STOP)
            thread.join(timeout)
