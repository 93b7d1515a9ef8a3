"""ContextRunner: a served version's runs, with a ranking request's context computed once.

A :class:`~processor.engine.session_group.SessionGroup` runs every request of its default
signature through :meth:`ContextRunner.run` (same arguments and results as the backend's
``run``). A request whose inputs all have N rows runs as always, on the backend (one pass over
the per-row inputs' first dimensions decides it). A broadcast request (:mod:`.rows`):

* when the model declares ``context_inputs``, its engine has a context part
  (:class:`ContextPart`) and exactly those inputs came as one row: the context part runs once,
  at batch 1 (or its results come from the cache); its results, the boundary tensors, are
  repeated to N rows and fed with the per-candidate inputs to the main part, which skips what
  the context part computed. Outputs the context part computes whole are repeated too.
* otherwise the one-row inputs are repeated to N rows and the whole model runs (always exact).

Either way the answer is the tiled request's (allclose: an engine may round a batch-1 product
differently from a batch-N one). A request that the declared context does not allow is refused
(:meth:`.rows.RowPlan.broadcast`).

Threading: :meth:`run` from any number of threads, inside the group's update gate held shared
(so a delta never lands between a context's computation and its use); :meth:`invalidate` inside
it held exclusive. Counters are updated under a lock, per request.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from ..errors import InvalidArgument
from .cache import ContextCache
from .rows import RowPlan, repeat_rows, tile

# the backend's run: (lane, feeds by alias, fetches by output alias) -> outputs
LaneRun = Callable[[int, dict[str, np.ndarray], tuple[str, ...]], list[np.ndarray]]


class ContextPart(Protocol):
    """An engine's two halves of a partitioned graph (:mod:`processor.context.partition`)."""

    context_inputs: frozenset[str]  # aliases
    boundary: tuple[str, ...]  # tensor names, the context part's results in this order
    context_outputs: dict[str, int]  # output alias -> index in ``boundary`` (computed whole by the context part)
    direct_inputs: frozenset[str]  # aliases of context inputs the main part reads itself

    def run_context(self, lane: int, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The boundary tensors (batch 1) for the context inputs' one-row ``feeds``."""
        ...

    def run_main(self, lane: int, feeds: dict[str, np.ndarray], boundary: list[np.ndarray],
                 fetches: tuple[str, ...]) -> list[np.ndarray]:
        """``fetches`` (none of them a context output) for the per-candidate inputs and the
        repeated context inputs the main part reads (``feeds``, N rows) and the boundary
        tensors repeated to N rows."""
        ...

    def describe(self) -> dict[str, Any]:
        ...

    def close(self) -> None:
        ...


class ContextRunner:
    """See the module doc. ``part``: the engine's context part (None: broadcasts are tiled);
    ``cache``: the context cache (needs ``part``); ``report``: why there is no part, etc."""

    def __init__(self, rows: RowPlan, run: LaneRun, part: ContextPart | None = None,
                 cache: ContextCache | None = None, report: dict[str, Any] | None = None) -> None:
        self._rows = rows
        # feeds -> the per-row inputs' arrays (a tuple: itemgetter of two names or more)
        self._per_row_arrays = operator.itemgetter(*rows.per_row) if len(rows.per_row) > 1 else lambda feeds: ()
        self._run = run
        self._part = part
        self._cache = cache if part is not None else None
        self._report = report or {}
        self._lock = threading.Lock()
        self._counts = {"broadcast_requests": 0, "context_once": 0, "tiled": 0, "refused": 0}
        self._context_aliases = tuple(sorted(part.context_inputs)) if part is not None else ()
        # the update gate's weights stamp (set by the SessionGroup: UpdateGate.weights_stamp)
        self.weights_stamp: Callable[[], int] = lambda: 0

    @property
    def may_broadcast(self) -> bool:
        """Whether a request can be a broadcast one at all (two per-row inputs or more); a group
        runs other models' requests straight on the backend."""
        return len(self._rows.per_row) > 1

    def broadcasts(self, feeds: dict[str, np.ndarray]) -> bool:
        """Whether ``feeds`` is a broadcast request (InvalidArgument as :meth:`run` refuses)."""
        return self.may_broadcast and self._rows.broadcast(feeds) is not None

    @property
    def part(self) -> ContextPart | None:
        return self._part

    def run(self, lane: int, feeds: dict[str, np.ndarray], fetches: tuple[str, ...]) -> list[np.ndarray]:
        """The backend's ``run`` of ``feeds``, a broadcast request answered as its tiled one."""
        # every request passes here: per-row inputs that agree on their rows go straight on, by
        # C-level calls only (half the cost of a Python loop; a scalar or a missing input: the
        # full check below)
        try:
            if len(set(map(len, self._per_row_arrays(feeds)))) == 1:
                return self._run(lane, feeds, fetches)
        except (KeyError, TypeError):
            pass
        try:
            broadcast = self._rows.broadcast(feeds)
        except InvalidArgument:
            self._count("refused")
            raise
        if broadcast is None:
            return self._run(lane, feeds, fetches)
        rows, ones = broadcast
        part = self._part
        if part is None or ones != part.context_inputs:
            self._count("tiled")
            return self._run(lane, tile(feeds, ones, rows), fetches)
        return self._once(part, lane, feeds, fetches, rows)

    def warm(self, lane: int, feeds: dict[str, np.ndarray], fetches: tuple[str, ...]) -> None:
        """Run the context part and the main part on ``feeds`` (the context as one row) on
        ``lane``, uncounted and uncached: warmup's (the caller holds the update gate shared)."""
        rows = self._rows.broadcast(feeds)
        if self._part is not None and rows is not None and rows[1] == self._part.context_inputs:
            self._once(self._part, lane, feeds, fetches, rows[0], warm=True)

    def _once(self, part: ContextPart, lane: int, feeds: dict[str, np.ndarray], fetches: tuple[str, ...],
              rows: int, warm: bool = False) -> list[np.ndarray]:
        """The context part once (or its results from the cache, unless ``warm``), then the main
        part."""
        cache = None if warm else self._cache
        if cache is not None:
            cache.follow(self.weights_stamp())
            key = cache.key(feeds, self._context_aliases)
            boundary = cache.get(key)
            if boundary is None:
                generation = cache.generation
                boundary = tuple(part.run_context(lane, {a: feeds[a] for a in self._context_aliases}))
                cache.put(key, boundary, generation)
        else:
            boundary = part.run_context(lane, {a: feeds[a] for a in self._context_aliases})
        if any(not b.ndim or b.shape[0] != 1 for b in boundary):
            # not one row: the part is not what the analysis said; the tiled request is exact
            if not warm:
                self._count("tiled")
            return self._run(lane, tile(feeds, part.context_inputs, rows), fetches)
        if not warm:
            self._count("context_once")
        repeated = [repeat_rows(b, rows) for b in boundary]
        outputs = part.context_outputs
        main_fetches = tuple(a for a in fetches if a not in outputs)
        main: list[np.ndarray] = []
        if main_fetches:
            main_feeds = {a: (repeat_rows(v, rows) if a in part.direct_inputs else v)
                          for a, v in feeds.items() if a not in part.context_inputs or a in part.direct_inputs}
            main = part.run_main(lane, main_feeds, repeated, main_fetches)
        if len(main_fetches) == len(fetches):
            return main
        got = iter(main)
        return [repeated[outputs[a]] if a in outputs else next(got) for a in fetches]

    def invalidate(self) -> None:
        """A delta is landing (the caller holds the update gate exclusive): drop cached contexts."""
        if self._cache is not None:
            self._cache.clear()

    def _count(self, what: str) -> None:
        with self._lock:
            self._counts[what] += 1
            if what != "refused":
                self._counts["broadcast_requests"] += 1

    def stats(self) -> dict[str, Any]:
        """The counters, and the cache's (None without one)."""
        with self._lock:
            counts = dict(self._counts)
        return {**counts, "cache": self._cache.stats() if self._cache is not None else None}

    def describe(self) -> dict[str, Any]:
        """For model info: the declared inputs, the context part (or why there is none), counters."""
        part = self._part
        return {
            "context_inputs": sorted(self._rows.declared) if self._rows.declared is not None else None,
            "per_row_inputs": list(self._rows.per_row),
            "broadcast": ("one-row inputs among N-row ones apply to every row"
                          + ("; only the declared context_inputs may come as one row"
                             if self._rows.declared is not None else "")),
            "context_part": part.describe() if part is not None else None,
            **self._report,
            **self.stats(),
        }

    def close(self) -> None:
        if self._part is not None:
            self._part.close()


class OtherSignatures:
    """Broadcast requests of a model's other signatures (TF Serving's per-request signature):
    tiled, by each signature's own per-row inputs (declared context inputs name the default
    signature's). Thread-safe: a plan per signature, made once."""

    def __init__(self) -> None:
        self._plans: dict[str, RowPlan] = {}

    def tiled(self, signature, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        plan = self._plans.get(signature.name)
        if plan is None:
            plan = self._plans.setdefault(signature.name, RowPlan(signature))
        broadcast = plan.broadcast(feeds) if len(plan.per_row) > 1 else None
        return feeds if broadcast is None else tile(feeds, broadcast[1], broadcast[0])
