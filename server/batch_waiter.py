"""Batched requests awaited on an event loop, with no thread to wait for them.

A request to a batching model goes on its version's native queue from the edge's event loop
(``DataPlane.submit``), with this loop's eventfd as the ticket's notify fd: the batch
thread adds 1 to it once it has answered the ticket. The loop watches the fd (``add_reader``);
each wake-up (one per write, or fewer: the counter sums them) resolves the futures of the
tickets that are done. So a batched request costs no thread hop and no thread parked on it,
where the pool path costs both (a pool thread per waiting request, woken per answer).

One :class:`BatchWaiter` per event loop (HTTP's, gRPC's), used on that loop only but
:meth:`close`, which any thread may call. A caller cancelled while its ticket is pending (the
drain timeout) leaves the call here; it is released once its batch ran (the queue reads the
request until then).
"""

from __future__ import annotations

import asyncio
import logging
import os

from processor.batching.batched_call import BatchedCall
from processor.request import PredictResult

log = logging.getLogger("server")


class BatchWaiter:
    """See the module doc."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._waiting: dict[BatchedCall, asyncio.Future] = {}
        self._orphans: list[BatchedCall] = []  # cancelled callers' calls, released once done
        loop.add_reader(self.fd, self._wake)

    async def result(self, call: BatchedCall) -> PredictResult | None:
        """``call.result()`` once its batch ran (see ``BatchedCall.result``)."""
        if not call.ticket.done:
            future = self.loop.create_future()
            self._waiting[call] = future
            try:
                await future
            except asyncio.CancelledError:
                self._waiting.pop(call, None)
                if call.ticket.done:
                    call.release()
                else:
                    self._orphans.append(call)
                raise
        return call.result()

    def _wake(self) -> None:
        try:
            os.eventfd_read(self.fd)
        except BlockingIOError:  # another wake-up took the count
            pass
        waiting = self._waiting
        for call in [c for c in waiting if c.ticket.done]:
            future = waiting.pop(call)
            if not future.done():
                future.set_result(None)
        if self._orphans:
            self._release_orphans()

    def _release_orphans(self) -> None:
        """Release the cancelled callers' calls whose batch ran."""
        pending = []
        for call in self._orphans:
            if call.ticket.done:
                call.release()
            else:
                pending.append(call)
        self._orphans = pending

    @property
    def pending(self) -> int:
        """Calls queued through this waiter whose batch has not run yet (waited for or orphaned)."""
        return len(self._waiting) + len(self._orphans)

    def close(self) -> None:
        """Stop watching the fd and close it; call it once the loop serves no more requests
        (the server stopped). Orphaned calls whose batch ran are released here; while any call
        is still queued, the fd stays open (a batch thread writes it once that call is answered:
        closed, its number could be another file's by then). Any thread."""
        if self.loop.is_closed():
            self._close_here(watching=False)
        elif not self.loop.is_running() or _on_loop_thread(self.loop):
            self._close_here()
        else:
            self.loop.call_soon_threadsafe(self._close_here)

    def _close_here(self, watching: bool = True) -> None:
        if watching:
            self.loop.remove_reader(self.fd)
        self._release_orphans()
        if self.pending:
            log.warning("%d batched request(s) still queued at shutdown: their notify fd stays open",
                        self.pending)
            return
        os.close(self.fd)


def _on_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
