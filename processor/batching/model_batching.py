"""ModelBatching: one model's batching, composed once by its ServedModel.

It holds the model's settings, its one :class:`~processor.batching.budget.RowBudget` (the
queue bound, ``max_enqueued_batches * max_batch_size`` rows, for all its queues), the reference
:class:`~processor.batching.batcher.Batcher` and its counters. Each version's SessionGroup opens
its native queue through :meth:`open_queue`, on the same budget (a batch never mixes versions,
so there is one native queue per served version; it has no capacity of its own).

Wire requests have one way in, :meth:`serve_many` (:meth:`serve` is it for one request), used
by ``DataPlane.predict`` and ``predict_many`` alike:

1. with the group's update gate held, every request is queued on the group's native queue
   before any is awaited, so they merge with each other and with concurrent calls; then each
   ticket is awaited (a delta waits for these batches);
2. what the native queue does not take, or hands back (a merged call that failed, outputs not
   per row), is decoded and queued on the reference Batcher (with the gate released: its merged
   call enters the gate itself), which gives the reference results, errors and failure
   isolation; then those are awaited.

Refusals are the reference's errors (Unavailable when full or closing, DeadlineExceeded when
the deadline passed first).

Event loops queue without a thread (:meth:`ModelBatching.queue`): the request goes on the native
queue with the gate held and a notify fd (an eventfd the batch thread writes once the ticket is
answered); the loop awaits that fd, then takes the answer from the :class:`QueuedCall`. What
the native queue does not take, or hands back, the caller serves with :meth:`serve` on a thread.
Thread-safe.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import ProcessorError, result_or_error
from . import native_queue
from .batcher import Batcher
from .budget import new_budget
from .settings import BatchingConfig

Wire = bytes | bytearray | memoryview


class ModelBatching:
    """See the module doc. The constructor only builds; :meth:`start` starts the reference
    batcher's threads (the first queued request does too); :meth:`close` drains it."""

    def __init__(self, model: str, settings: BatchingConfig) -> None:
        self.model = model
        self.settings = settings
        self.budget = new_budget(settings.queue_rows)
        self.batcher = Batcher(model, settings, self.budget)

    def start(self) -> None:
        self.batcher.start()

    def open_queue(self, backend, codec) -> Any | None:
        """A native queue for one version (see :func:`.native_queue.open_queue`) on the model's
        budget, or None where there is none."""
        return native_queue.open_queue(backend, codec, self.settings, self.budget)

    def serve(self, group, data: Wire, deadline: float | None = None) -> bytes:
        """One serialized PredictRequest on ``group`` (whose handle the caller holds): the
        PredictResponse bytes; raises ProcessorError."""
        (result,) = self.serve_many(group, (data,), deadline)
        if isinstance(result, ProcessorError):
            raise result
        return result

    def serve_many(self, group, requests: Sequence[Wire],
                   deadline: float | None = None) -> list[bytes | ProcessorError]:
        """Each serialized PredictRequest on ``group``, all queued before any is awaited (see the
        module doc): one response (bytes) or error per request, in order."""
        results: list[Any] = [None] * len(requests)
        queue = group.batch_queue
        if queue is not None:
            native_deadline = deadline or 0.0
            gate = group.gate
            gate.enter_shared()
            try:
                for i, data in enumerate(requests):
                    results[i] = result_or_error(self._submit_native, queue, data, native_deadline)
                for i, ticket in enumerate(results):
                    if ticket is not None and not isinstance(ticket, (bytes, ProcessorError)):
                        results[i] = result_or_error(self._await_native, ticket)
            finally:
                gate.exit_shared()
        for i, data in enumerate(requests):  # not taken, or handed back: the reference
            if results[i] is None:
                results[i] = result_or_error(self._submit_reference, group, data, deadline)
        for i, queued in enumerate(results):
            if isinstance(queued, _Queued):
                results[i] = result_or_error(self._await_reference, group, queued)
        return results

    def queue(self, group, data: Wire, deadline: float | None, notify_fd: int) -> QueuedCall | None:
        """``data`` queued on ``group``'s native queue (the caller holds its handle) without
        waiting (see the module doc): the QueuedCall, or None where nothing was queued (no
        native queue, an update running or waiting, a request the queue does not take). Raises
        the refusal (full, closing, expired)."""
        queue = group.batch_queue
        if queue is None or not group.gate.try_enter_shared():  # a loop must not wait for a delta
            return None
        try:
            ticket = self._submit_native(queue, data, deadline or 0.0, notify_fd)
        except BaseException:
            group.gate.exit_shared()
            raise
        if ticket is None:
            group.gate.exit_shared()
            return None
        return QueuedCall(self, group.gate, ticket)

    def _submit_native(self, queue, data: Wire, deadline: float, notify_fd: int = -1):
        """A native ticket, or None (not taken); raises the refusal."""
        queued = queue.submit(data, deadline, notify_fd)
        if isinstance(queued, str):
            raise self.batcher.refusal(queued)
        return queued

    def _await_native(self, ticket) -> bytes | None:
        """The ticket's response, or None (handed back); raises the refusal (expired)."""
        out = ticket.wait()
        if isinstance(out, str):
            raise self.batcher.refusal(out)
        return out

    def _submit_reference(self, group, data: Wire, deadline: float | None) -> _Queued:
        feeds, keys, aliases = group.codec.decode(data)
        return _Queued(keys, self.batcher.submit(group, feeds, aliases, deadline))

    def _await_reference(self, group, queued: _Queued) -> bytes:
        request = queued.request
        arrays = request if isinstance(request, list) else self.batcher.wait(request)
        return group.codec.encode(queued.keys, arrays)

    def close(self, timeout: float | None = None) -> bool:
        """Drain the reference queue (:meth:`Batcher.close`); each version's native queue drains
        when its group closes."""
        return self.batcher.close(timeout)

    def describe(self, native: dict | None = None) -> dict[str, Any]:
        """Settings and counters (see :meth:`Batcher.describe`)."""
        return self.batcher.describe(native)


class _Queued:
    """A request on the reference queue: its response keys and its queued request (or its
    outputs, when it ran alone at once)."""

    __slots__ = ("keys", "request")

    def __init__(self, keys: tuple[str, ...], request) -> None:
        self.keys = keys
        self.request = request


class QueuedCall:
    """A wire request on a native queue (:meth:`ModelBatching.queue`), the group's gate held
    for it. ``ticket.done`` turns true once its batch ran; then :meth:`answer`. The gate is
    released exactly once: by :meth:`answer`, or by :meth:`release` for a caller that stops
    waiting (call it once the ticket is done: the queue reads the request until then)."""

    __slots__ = ("_batching", "_gate", "ticket")

    def __init__(self, batching: ModelBatching, gate, ticket) -> None:
        self._batching = batching
        self._gate = gate
        self.ticket = ticket

    def answer(self) -> bytes | None:
        """The PredictResponse bytes, or None: handed back (serve it with
        :meth:`ModelBatching.serve` on a thread); raises the refusal (expired). Never blocks
        once ``ticket.done``."""
        try:
            return self._batching._await_native(self.ticket)
        finally:
            self.release()

    def release(self) -> None:
        gate, self._gate = self._gate, None
        if gate is not None:
            gate.exit_shared()
