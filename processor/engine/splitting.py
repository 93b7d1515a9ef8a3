"""RowSplitter: a large request cut by rows into chunks run in parallel on a SessionGroup's lanes.

TF Serving's large batch splitting (``max_execution_batch_size``): a request with more rows than
``chunk_rows`` is cut into ``ceil(rows / chunk_rows)`` chunks of near-equal size (each at most
``chunk_rows``), run at once on the group's lanes by a pool of ``lanes`` threads (thread ``i``
runs its chunks on lane ``i``), and the outputs joined in row order. So a ranking request's
latency is its share of the lanes, and the engine's working memory is that of the chunks in
flight (at most ``lanes``), not of the whole request.

* Which inputs are split: the rows of a request are the largest first dimension among inputs
  whose signature leaves the first dimension free (or the rank unknown); those inputs with that
  many rows are split, the others (a fixed first dimension, a scalar, one row broadcast against
  the batch) are passed whole to every chunk. A request whose free inputs have other first
  dimensions is not split.
* One version: the caller (:meth:`SessionGroup.run`) holds the group's update gate shared for the
  whole request and the chunks call the backend without entering it, so a delta lands before or
  after all of them (entering again from the pool could wait behind a queued delta that waits for
  this very caller).
* Failure: the first failing chunk (in row order) fails the request with its error; chunks not
  yet started are cancelled and running ones awaited before the caller leaves the gate.
* Outputs that are not per row (a chunk's output whose first dimension is not the chunk's rows):
  the request runs again whole, and later requests of that signature are not split.
* ``max_rows`` (``max_request_rows``): a request with more rows is refused with
  ResourceExhausted (413 / RESOURCE_EXHAUSTED) naming the limit, before it runs.

Thread-safe: any number of callers; the pool's threads start on the first split request and end
at :meth:`close` (the group's close, when no request uses it any more).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from ..dtypes import DT_DOUBLE, DT_FLOAT
from ..errors import ResourceExhausted
from ..signature import Signature

# The backend's run on one lane: (lane, feeds, fetches) -> outputs.
LaneRun = Callable[[int, dict[str, np.ndarray], tuple[str, ...]], list[np.ndarray]]

# The fewest bytes one element of an input takes in a serialized PredictRequest: floats are fixed
# (4 / 8 bytes in the typed fields or tensor_content); varints and string lengths take >= 1.
_MIN_WIRE_BYTES = {DT_FLOAT: 4, DT_DOUBLE: 8}


class RowSplitter:
    """See the module doc. ``chunk_rows``: None does not split (only ``max_rows`` applies)."""

    def __init__(self, chunk_rows: int | None, max_rows: int | None, lanes: int) -> None:
        self.chunk_rows = chunk_rows
        self.max_rows = max_rows
        self.lanes = lanes
        # the fewest rows a request needs to be split or refused
        self._limit = min(r for r in (chunk_rows, max_rows) if r is not None)
        self._free: dict[str, tuple[str, ...]] = {}  # signature name -> inputs with a free first dim
        self._unsplittable: set[str] = set()  # signatures whose outputs are not per row
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._lane_of = threading.local()
        self._next_lane = itertools.count()
        self._counts = {"split_requests": 0, "chunks_run": 0, "refused_requests": 0, "run_whole": 0}

    @classmethod
    def from_config(cls, config: Any, lanes: int) -> RowSplitter | None:
        """The splitter ``config`` (a ModelConfig) asks for, or None when it sets neither key."""
        chunk, limit = config.max_execution_batch_size, config.max_request_rows
        if chunk is None and limit is None:
            return None
        return cls(chunk, limit, lanes)

    def wire_bytes(self, signature: Signature) -> int:
        """The largest serialized request of ``signature`` that cannot hold more rows than the
        splitter lets run whole: longer ones must be decoded to count their rows (every input
        is required, so a request of R rows holds at least R times each row's fewest bytes)."""
        per_row = 0
        for spec in signature.inputs.values():
            if spec.shape is not None and (not spec.shape or spec.shape[0] != -1):
                continue  # not split: its size says nothing of the rows
            elements = math.prod(d for d in (spec.shape or ())[1:] if d > 0)
            per_row += elements * _MIN_WIRE_BYTES.get(spec.dtype, 1)
        return self._limit * per_row if per_row else 1 << 62

    def chunks(self, signature: Signature, feeds: dict[str, np.ndarray]) -> list[slice] | None:
        """The row ranges to run ``feeds`` in, or None to run it whole; ResourceExhausted when it
        has more rows than ``max_rows``."""
        free = self._free.get(signature.name)
        if free is None:
            free = self._free.setdefault(signature.name, tuple(
                alias for alias, spec in signature.inputs.items()
                if spec.shape is None or (spec.shape and spec.shape[0] == -1)))
        rows = 0
        for alias in free:  # a plain loop: every decoded request of a splitting model passes here
            array = feeds.get(alias)
            if array is not None and array.ndim and array.shape[0] > rows:
                rows = array.shape[0]
        if rows <= self._limit:
            return None
        if self.max_rows is not None and rows > self.max_rows:
            self._count("refused_requests")
            raise ResourceExhausted(
                f"the request has {rows} rows, over the model's max_request_rows ({self.max_rows}); "
                f"send at most {self.max_rows} rows per request")
        if self.chunk_rows is None or rows <= self.chunk_rows or signature.name in self._unsplittable:
            return None
        if any(feeds[a].ndim and feeds[a].shape[0] not in (rows, 1) for a in free if a in feeds):
            return None  # free inputs disagree on the rows: splitting could change the answer
        n = -(-rows // self.chunk_rows)
        bounds = [rows * i // n for i in range(n + 1)]  # near-equal chunks, each <= chunk_rows
        return [slice(bounds[i], bounds[i + 1]) for i in range(n)]

    def run(self, signature: Signature, chunks: list[slice], feeds: dict[str, np.ndarray],
            fetches: tuple[str, ...], run_lane: LaneRun) -> list[np.ndarray]:
        """``feeds`` run as ``chunks`` (from :meth:`chunks`) on the pool's lanes, outputs joined
        in order. The caller holds the group's update gate shared; ``run_lane`` must not enter it.
        Raises the first failing chunk's error."""
        rows = chunks[-1].stop
        parts = [{alias: array[part] if array.ndim and array.shape[0] == rows else array
                  for alias, array in feeds.items()} for part in chunks]
        pool = self._pool or self._start()
        futures = [pool.submit(self._on_lane, run_lane, part, fetches) for part in parts]
        try:
            outs = [future.result() for future in futures]
        except BaseException:
            for future in futures:
                future.cancel()
            concurrent.futures.wait(futures)  # none still runs once the caller leaves the gate
            raise
        with self._lock:
            self._counts["split_requests"] += 1
            self._counts["chunks_run"] += len(chunks)
        joined = []
        for j in range(len(fetches)):
            arrays = [out[j] for out in outs]
            if any(not a.ndim or a.shape[0] != part.stop - part.start for a, part in zip(arrays, chunks)):
                self._unsplittable.add(signature.name)
                self._count("run_whole")
                return pool.submit(self._on_lane, run_lane, feeds, fetches).result()
            joined.append(np.concatenate(arrays))
        return joined

    def _on_lane(self, run_lane: LaneRun, feeds: dict[str, np.ndarray], fetches: tuple[str, ...]) -> list[np.ndarray]:
        return run_lane(self._lane_of.lane, feeds, fetches)

    def _start(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    self.lanes, thread_name_prefix="sp-split", initializer=self._take_lane)
            return self._pool

    def _take_lane(self) -> None:
        self._lane_of.lane = next(self._next_lane) % self.lanes

    def _count(self, key: str) -> None:
        with self._lock:
            self._counts[key] += 1

    def describe(self) -> dict[str, Any]:
        """For model info: the settings and counters since this version loaded."""
        with self._lock:
            counts = dict(self._counts)
        return {"max_execution_batch_size": self.chunk_rows, "max_request_rows": self.max_rows,
                "lanes": self.lanes, **counts}

    def close(self) -> None:
        """End the pool's threads (no request is left: the group's handle is released)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
