"""Batcher: one model's reference batching queue, between the DataPlane and the SessionGroup.

Callers (request threads) hand in requests already decoded and checked against the signature,
so a bad request fails alone, before it joins anything. A request joins the open batch of its
kind (:func:`~processor.batching.merge.batch_key`, on the same SessionGroup); a batch closes when
it reaches ``max_batch_size`` rows or ``batch_timeout_micros`` after its first request came, and
one of ``num_batch_threads`` threads runs it as one engine call: feeds concatenated (padded to an
allowed size), outputs split back per request (each request gets only the outputs it asked for).

* One version per batch: a batch holds requests of one SessionGroup (their callers hold its
  handle), and the merged call enters the group's update gate once, so a delta lands before or
  after the whole batch.
* Failure isolation: when a merged call fails, each request is run alone, so only the culprit
  fails. Requests that cannot be merged (no batch dimension, more rows than ``max_batch_size``)
  run alone on the caller's thread, with nothing queued.
* Back-pressure: a queued request takes its rows from the model's
  :class:`~processor.batching.budget.RowBudget` (``max_enqueued_batches * max_batch_size`` rows,
  shared with the model's native queues) until its batch starts; a request whose rows do not
  fit is refused at once with Unavailable (503, retryable). A request whose deadline passed
  while it waited is answered DeadlineExceeded and not run.
* The constructor only builds: the batch threads start on :meth:`start` (or the first queued
  request). :meth:`close` refuses new requests and runs everything queued before the threads
  end (drain).

Thread-safe: any number of threads may call :meth:`run` / :meth:`submit` / :meth:`wait`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import spans
from ..errors import DeadlineExceeded, ProcessorError, Unavailable, as_processor_error
from ..tracing.tracer import now_us
from . import merge
from .budget import RowBudget
from .settings import BatchingConfig
from .stats import BatchStats

log = logging.getLogger(__name__)


class Request:
    """One caller's request in the queue. Owned by the caller until :meth:`Batcher.wait` returns."""

    __slots__ = ("group", "feeds", "aliases", "rows", "deadline", "enqueued", "done", "outputs",
                 "error", "trace", "enqueued_us")

    def __init__(self, group, feeds: merge.Feeds, aliases: tuple[str, ...], rows: int,
                 deadline: float | None, trace) -> None:
        self.group = group
        self.feeds = feeds
        self.aliases = aliases
        self.rows = rows
        self.deadline = deadline
        self.trace = trace
        self.enqueued_us = now_us() if trace is not None else 0.0
        # A lock taken now and released by the batch thread: the cheapest one-shot signal.
        self.done = threading.Lock()
        self.done.acquire()
        self.outputs: list[np.ndarray] | None = None
        self.error: ProcessorError | None = None
        self.enqueued = 0.0


class _Batch:
    __slots__ = ("key", "opened", "requests", "rows")

    def __init__(self, key: tuple, opened: float) -> None:
        self.key = key
        self.opened = opened
        self.requests: list[Request] = []
        self.rows = 0


class Batcher:
    """See the module doc. ``budget``: the model's row budget (by default one of its own, of
    ``settings.queue_rows``)."""

    def __init__(self, model: str, settings: BatchingConfig, budget=None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.model = model
        self.settings = settings
        self.stats = BatchStats(settings.max_batch_size)
        self.budget = budget if budget is not None else RowBudget(settings.queue_rows)
        self._clock = clock
        self._timeout = settings.batch_timeout_micros / 1e6
        self._max_rows = settings.max_batch_size
        self._pad_variable = settings.pad_variable_length_inputs
        self._cond = threading.Condition(threading.Lock())
        self._open: dict[tuple, _Batch] = {}
        self._ready: deque[_Batch] = deque()
        self._queued_requests = 0
        self._closing = False
        # Batch kinds whose outputs turned out not to be per row: such requests run alone.
        self._unsplittable: set[tuple] = set()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Start the batch threads (once; a closed batcher starts none)."""
        with self._cond:
            self._start_locked()

    def _start_locked(self) -> None:
        if self._threads or self._closing:
            return
        self._threads = [threading.Thread(target=self._loop, args=(i,), daemon=True,
                                          name=f"sp-batch-{self.model}-{i}")
                         for i in range(self.settings.num_batch_threads)]
        for thread in self._threads:
            thread.start()

    # --- callers ----------------------------------------------------------------------------

    def run(self, group, feeds: merge.Feeds, aliases: tuple[str, ...], deadline: float | None = None,
            trace=None) -> list[np.ndarray]:
        """The outputs ``aliases`` for ``feeds`` on ``group``: merged with other requests when they
        can be, else alone. Raises ProcessorError (Unavailable when the queue is full or closing,
        DeadlineExceeded when ``deadline`` (a ``time.monotonic()`` value) passed first)."""
        request = self.submit(group, feeds, aliases, deadline, trace)
        if isinstance(request, list):
            return request
        return self.wait(request)

    def submit(self, group, feeds: merge.Feeds, aliases: tuple[str, ...], deadline: float | None = None,
               trace=None) -> Request | list[np.ndarray]:
        """Queue a request and return it for :meth:`wait`; a request that cannot be merged is run
        at once and its outputs returned instead. Raises as :meth:`run` does."""
        now = self._clock()
        if deadline is not None and now >= deadline:
            self.stats.count("expired")
            raise self.refusal("expired")
        rows = merge.request_rows(feeds)
        key = None
        if rows is not None and rows <= self._max_rows:
            key = merge.batch_key(feeds, self._pad_variable)
            if key in self._unsplittable:
                key = None
        if key is None:
            self.stats.count("run_alone")
            return _run_alone(group, feeds, aliases, trace)
        request = Request(group, feeds, aliases, rows, deadline, trace)
        request.enqueued = now
        key = (group, key)
        with self._cond:
            if self._closing:
                raise self.refusal("closed")
            if not self.budget.try_take(rows):  # the model's bound, across all its queues
                self.stats.count("rejected_queue_full")
                raise self.refusal("full")
            if not self._threads:
                self._start_locked()
            batch = self._open.get(key)
            wake = False
            if batch is not None and batch.rows + rows > self._max_rows:
                self._ready.append(self._open.pop(key))
                batch, wake = None, True
            if batch is None:
                batch = self._open[key] = _Batch(key, now)
                wake = True  # an idle batch thread starts this batch's timeout
            batch.requests.append(request)
            batch.rows += rows
            self._queued_requests += 1
            if batch.rows >= self._max_rows:
                self._ready.append(self._open.pop(key))
                wake = True
            if wake:
                self._cond.notify()
        return request

    def refusal(self, why: str) -> ProcessorError:
        """The error for a request refused by a queue (this one or the engine's): ``"full"``,
        ``"closed"`` or ``"expired"`` (its deadline passed before it ran)."""
        if why == "full":
            return Unavailable(f"model {self.model!r}: the batching queue is full (max_enqueued_batches "
                               f"{self.settings.max_enqueued_batches} x max_batch_size {self._max_rows} rows "
                               f"waiting); retry later")
        if why == "closed":
            return Unavailable(f"model {self.model!r} is shutting down; send the request to another replica")
        return DeadlineExceeded(f"model {self.model!r}: the request's deadline passed before it ran")

    @staticmethod
    def wait(request: Request) -> list[np.ndarray]:
        """Block until the request's batch ran; its outputs, or raise its error."""
        request.done.acquire()
        if request.error is not None:
            raise request.error
        return request.outputs

    # --- the batch threads ------------------------------------------------------------------

    def _loop(self, index: int) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            try:
                self._execute(batch, index)
            except BaseException as exc:  # never leave a caller waiting
                log.exception("model %s: batch thread failed", self.model)
                for request in batch.requests:
                    if request.done.locked() and request.outputs is None and request.error is None:
                        request.error = as_processor_error(exc)
                        request.done.release()

    def _next_batch(self) -> _Batch | None:
        """The next batch to run: a full one, else the oldest open one once its timeout passed
        (at once when closing); None when closing and nothing is left."""
        with self._cond:
            while True:
                if self._ready:
                    batch = self._ready.popleft()
                elif self._open:
                    batch = min(self._open.values(), key=lambda b: b.opened)
                    remaining = batch.opened + self._timeout - self._clock()
                    if remaining > 0 and not self._closing:
                        self._cond.wait(remaining)
                        continue
                    del self._open[batch.key]
                elif self._closing:
                    return None
                else:
                    self._cond.wait()
                    continue
                self._queued_requests -= len(batch.requests)
                self.budget.give(batch.rows)
                if self._ready or self._open:
                    self._cond.notify()  # more work: let another idle thread look
                return batch

    def _execute(self, batch: _Batch, index: int) -> None:
        now = self._clock()
        live = []
        for request in batch.requests:
            if request.deadline is not None and now >= request.deadline:
                request.error = self.refusal("expired")
                request.done.release()
            else:
                live.append(request)
        if len(live) < len(batch.requests):
            self.stats.count("expired", len(batch.requests) - len(live))
        if not live:
            return
        group = batch.key[0]
        rows = sum(r.rows for r in live)
        padded = self.settings.padded_rows(rows)
        aliases = _union(live)
        traced = [r for r in live if r.trace is not None]
        self.stats.batch(len(live), rows, padded - rows, [now - r.enqueued for r in live])
        try:
            feeds = merge.merge([r.feeds for r in live], padded, self._pad_variable)
            started_us = now_us() if traced else 0.0
            if traced:
                full = any(r.trace.engine_trace for r in traced)  # a timeline's request is in it
                lane, outputs, engine = group.run_traced(feeds, aliases, full)
                ended_us = now_us()
                for r in traced:
                    r.trace.stages.append(("queue", r.enqueued_us, started_us - r.enqueued_us))
                    r.trace.lane, r.trace.engine, r.trace.run_window = lane, engine, (started_us, ended_us)
                spans.batch_ran([(r.trace, r.enqueued_us) for r in traced], started_us, ended_us, lane, rows,
                                len(live), spans.backend_name(group))
            else:
                outputs = group.run_on(index % group.lanes, feeds, aliases)
            parts = merge.split(outputs, [r.rows for r in live], padded)
            if parts is None:
                self._unsplittable.add(batch.key[1])
                raise _NotPerRow()
        except Exception as exc:
            if len(live) == 1 and not isinstance(exc, _NotPerRow):
                live[0].error = as_processor_error(exc)
                live[0].done.release()
                return
            # Only the culprit may fail: every request again, alone.
            self.stats.count("isolated_retries", len(live))
            for r in live:
                try:
                    r.outputs = _run_alone(group, r.feeds, r.aliases, None)
                except Exception as alone_exc:
                    r.error = as_processor_error(alone_exc)
                r.done.release()
            return
        index_of = {alias: i for i, alias in enumerate(aliases)}
        for r, outs in zip(live, parts):
            r.outputs = [outs[index_of[alias]] for alias in r.aliases]
            r.done.release()

    # --- lifecycle and reporting ------------------------------------------------------------

    def close(self, timeout: float | None = None) -> bool:
        """Refuse new requests, run the queued ones, stop the threads; False if ``timeout``
        passed before they finished."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    def describe(self, native: dict | None = None) -> dict[str, Any]:
        """Settings and live counters, for model info and metrics. ``native``: the served group's
        engine queue ``stats()`` (its counters are added in; they start again with each full
        version load). ``queued_rows``: the rows the budget holds (every queue of the model)."""
        requests = self._queued_requests
        if native is not None:
            requests += native["queued_requests"]
        return {"settings": self.settings.model_dump(mode="json"), "native_queue": native is not None,
                "queued_requests": requests, "queued_rows": self.budget.used, **self.stats.snapshot(native)}


class _NotPerRow(Exception):
    """The merged outputs are not per row; the requests run alone."""


def _union(requests: list[Request]) -> tuple[str, ...]:
    """Every output alias the requests ask for, in first-asked order."""
    first = requests[0].aliases
    if all(r.aliases == first for r in requests):
        return first
    return tuple(dict.fromkeys(a for r in requests for a in r.aliases))


def _run_alone(group, feeds: merge.Feeds, aliases: tuple[str, ...], trace) -> list[np.ndarray]:
    if trace is None:
        return group.run(feeds, aliases)
    started = now_us()
    trace.lane, outputs, trace.engine = group.run_traced(feeds, aliases, trace.engine_trace)
    trace.run_window = (started, now_us())
    return outputs
