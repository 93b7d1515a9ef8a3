"""One model's inference pool: its threads and the bound on the requests waiting for them.

Every edge (HTTP, gRPC; our wire format, TF Serving's, KServe v2) runs a model's work that does
not run in place here (``ServingRuntime.dispatch``), so a model's admission is the same whichever
edge a request came over, and a slow model's queue holds only its own requests.

``max_queued`` (the model entry's ``max_queued_requests``; None: unbounded): a request that
finds that many requests already waiting for a thread is refused at once with
:class:`QueueFull` (503 / UNAVAILABLE, ``Retry-After: 1``), before any work, rather than wait
behind them. A request counts from its admission until its work has run (or the pool shut down).

Thread-safe: requests are admitted from every edge's event loop and finish on the pool.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from processor.errors import Unavailable

RETRY_AFTER_SECONDS = 1


class QueueFull(Unavailable):
    """503 / UNAVAILABLE: the model's queue is full; ``retry_after`` seconds is a hint."""

    retry_after = RETRY_AFTER_SECONDS


class ModelPool:
    """See the module doc."""

    def __init__(self, name: str, threads: int, max_queued: int | None = None) -> None:
        self.name = name
        self.threads = threads
        self.max_queued = max_queued
        self.executor = ThreadPoolExecutor(threads, thread_name_prefix=f"sp-infer-{name}")
        self._pending = 0  # admitted, work not yet done: running + waiting
        self._lock = threading.Lock()

    @property
    def pending(self) -> int:
        """Requests admitted whose work has not finished (running and waiting)."""
        return self._pending

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the pool, the caller's context copied; QueueFull when
        ``max_queued`` requests already wait."""
        with self._lock:
            if self.max_queued is not None and self._pending - self.threads >= self.max_queued:
                raise QueueFull(f"model {self.name}: {self._pending - self.threads} requests are waiting "
                                f"for its {self.threads} inference threads (max_queued_requests "
                                f"{self.max_queued}); retry later")
            self._pending += 1
        ctx = contextvars.copy_context()
        try:
            future = self.executor.submit(self._job, ctx, fn, args)
        except BaseException:
            self._done()
            raise
        return await asyncio.wrap_future(future)

    def _job(self, ctx: contextvars.Context, fn: Callable[..., Any], args: tuple) -> Any:
        # counted down where the work ends, not where the caller stops waiting: a caller the
        # drain timeout cancels leaves its work running, and it still holds a thread
        try:
            return ctx.run(fn, *args)
        finally:
            self._done()

    def _done(self) -> None:
        with self._lock:
            self._pending -= 1

    def retire(self) -> None:
        """Stop taking work; what waits still runs, then the threads end (a model's pool that a
        live reload replaced or removed)."""
        self.executor.shutdown(wait=False)

    def shutdown(self) -> None:
        """Stop taking work; what waits is cancelled (never run, so never counted down)."""
        self.executor.shutdown(wait=False, cancel_futures=True)
