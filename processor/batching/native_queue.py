"""The native batching queue of one SessionGroup (``native/src/batcher.h``).

Request threads queue their request bytes (``submit(data, deadline)`` -> a ticket) and wait on
the ticket without the GIL (``ticket.wait()``), so one thread may queue many requests before it
waits; the queue's own threads run each batch, on lane ``thread index % lanes``:

* on the ONNX Runtime native engine (``Backend.native_engine``): converted, concatenated, run,
  split and encoded without Python;
* otherwise through :class:`BatchRunner` (one Python call per batch, not per request): decode,
  concatenate, one ``Backend.run``, split, encode.

One queue per version (a batch never mixes versions; the plan and engine are the version's),
with no capacity of its own: it takes its rows from the model's
:class:`~processor.batching.budget.RowBudget`, shared with the model's other queues. What the
queue does not take (invalid and rare requests, requests that cannot merge, a batch whose merged
call failed) comes back "not taken"; :class:`~processor.batching.model_batching.ModelBatching`
then runs it through :class:`~processor.batching.batcher.Batcher`, the reference, which gives
the exact results, errors and failure isolation. Callers hold the group's update gate while they
wait, so a batch never straddles a delta; for the same reason the runner calls the backend
directly (entering the gate again could wait behind a queued update that waits for these very
callers).

Thread-safe.
"""

from __future__ import annotations

from typing import Any

from .. import native
from ..errors import ProcessorError
from . import merge, stats
from .settings import BatchingConfig


def open_queue(backend, codec, settings: BatchingConfig, budget) -> Any | None:
    """A native queue for ``codec``'s requests on ``backend`` taking its rows from ``budget``
    (a native RowBudget; see the module doc): ``submit(data, deadline)``, ``stats()``,
    ``close()``. None: no native extension, or ``pad_variable_length_inputs`` (the native queue
    merges equal shapes only; the reference pads)."""
    if native.MODULE is None or codec.native_plan is None or settings.pad_variable_length_inputs:
        return None
    engine = backend.native_engine
    runner = None if engine is not None else BatchRunner(backend, codec, settings)
    return native.MODULE.Batcher(
        codec.native_plan, engine, runner, budget, backend.lanes, settings.max_batch_size,
        settings.batch_timeout_micros, settings.num_batch_threads,
        list(settings.allowed_batch_sizes), [float(b) for b in stats.size_bounds(settings.max_batch_size)],
        list(stats.WAIT_BOUNDS))


class BatchRunner:
    """Runs one batch of the native queue through ``Backend.run``; see the module doc.

    Called on the queue's threads with the GIL held. ``requests`` are read-only views of the
    callers' buffers, valid during the call only (decoding copies). Answers each with response
    bytes, or all with None when the merged call fails or its outputs are not per row.
    """

    def __init__(self, backend, codec, settings: BatchingConfig) -> None:
        self._backend = backend
        self._codec = codec
        self._settings = settings

    def __call__(self, requests: list[memoryview], lane: int) -> list[bytes | None]:
        codec = self._codec
        answers: list[bytes | None] = [None] * len(requests)
        decoded, rows, where = [], [], []
        for i, data in enumerate(requests):
            try:
                feeds, keys, aliases = codec.decode(data)
            except ProcessorError:
                continue  # the reference path reports it
            n = merge.request_rows(feeds)
            if n is None:
                continue
            decoded.append((feeds, keys, aliases))
            rows.append(n)
            where.append(i)
        if not decoded:
            return answers
        aliases = decoded[0][2]  # one kind per batch: the same outputs
        total = sum(rows)
        padded = self._settings.padded_rows(total)
        try:
            outputs = self._backend.run(lane, merge.merge([d[0] for d in decoded], padded, False), aliases)
        except Exception:  # each request runs again on the reference path, alone if need be
            return answers
        parts = merge.split(outputs, rows, padded)
        if parts is None:
            return answers
        for i, (_, keys, _), arrays in zip(where, decoded, parts):
            answers[i] = codec.encode(keys, arrays)  # row slices of C-ordered outputs: contiguous
        return answers
