"""BatchedCall: a wire request an event loop queued on its batching model's native queue
(``DataPlane.submit``), and the version it holds until its answer is taken."""

from __future__ import annotations

from ..request import PredictResult


class BatchedCall:
    """A call ``DataPlane.submit`` queued: it holds the served version (its handle)
    and the group's gate until :meth:`result` or :meth:`release`, exactly once (see
    ``processor.batching.model_batching.QueuedCall``). Used by one event loop."""

    __slots__ = ("_handle", "_group", "_queued", "ticket")

    def __init__(self, handle, group, queued) -> None:
        self._handle = handle
        self._group = group
        self._queued = queued
        self.ticket = queued.ticket

    def result(self) -> PredictResult | None:
        """The call's result once ``ticket.done``; None: the queue handed it back (run
        ``DataPlane.predict`` on a thread). Raises the refusal (expired)."""
        try:
            out = self._queued.answer()
        finally:
            self._handle.release()
        return None if out is None else PredictResult(out, self._group.version, self._group.signature)

    def release(self) -> None:
        """For a caller that stopped waiting: release what the call holds (once ``ticket.done``)."""
        self._queued.release()
        self._handle.release()
