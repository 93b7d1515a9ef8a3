"""MemoryBudget: the fit check before every load, and what loads teach it.

Before a version is read (a new model, a new full version, a reload), :meth:`MemoryBudget.admit`
estimates what loading it will cost (:func:`processor.memory.estimate_load_bytes`: its parameter
files' bytes, times a factor learned from the loads done so far) and refuses the load with
:class:`LoadRefused` (RESOURCE_EXHAUSTED, naming the model, the version and the figures) when the
estimate plus what the process holds (its resident set) would exceed the limit
(``memory_limit``: by default 0.9 of the cgroup's ``memory.max``, else of the machine's memory;
0 turns the check off; :func:`processor.memory.memory_limit`). The manager records a refusal as
a failed update: the version that serves keeps serving, model info shows the error, and the
load is retried with backoff (memory may have been freed meanwhile).

After a load, :meth:`MemoryBudget.learn` compares the process's growth during it with the file
estimate, per engine: the factor is the median of the last ratios (at least 1; 1.2 before any
load; at most 4; only loads of at least 16 MiB of files teach it, as a small load's growth is
mostly the engine's own start-up), so a model whose engine expands its files (TensorFlow's
graph, a DRAM index) is estimated by what this server saw, not by a guess.

One budget per process (:func:`default_budget`), shared by every model's manager. Thread-safe.
"""

from __future__ import annotations

import statistics
import threading
from collections import deque

from .errors import ResourceExhausted
from . import memory

INITIAL_FACTOR = 1.2
MAX_FACTOR = 4.0
# loads of smaller files teach nothing: their growth is mostly the engine's own start-up (a first
# TensorFlow session, ONNX Runtime's arenas), which a ratio would spread over every later load
LEARN_MIN_BYTES = 16 << 20
_KEPT = 8  # ratios kept per engine
_MIB = 1 << 20


class LoadRefused(ResourceExhausted):
    """A version whose load would not fit the memory limit (never loaded)."""


class MemoryBudget:
    """See the module doc. ``limit_setting``: the ``memory_limit`` setting
    (:func:`processor.memory.memory_limit`)."""

    def __init__(self, limit_setting: float | int | None = None) -> None:
        self.limit = memory.memory_limit(limit_setting)
        self._ratios: dict[str, deque[float]] = {}
        self._lock = threading.Lock()
        self.refused = 0

    def factor(self, engine: str) -> float:
        with self._lock:
            ratios = self._ratios.get(engine)
            return min(MAX_FACTOR, max(1.0, statistics.median(ratios))) if ratios else INITIAL_FACTOR

    def admit(self, model: str, label: str, engine: str, file_bytes: int) -> int:
        """The estimated bytes of loading version ``label`` of ``model`` (``file_bytes`` on disk,
        on ``engine``); LoadRefused when it does not fit (see the module doc)."""
        estimate = int(file_bytes * self.factor(engine))
        if self.limit is None:
            return estimate
        held = memory.process_rss_bytes()
        if held + estimate > self.limit:
            with self._lock:
                self.refused += 1
            raise LoadRefused(
                f"model {model!r} version {label}: not loaded, it would not fit the memory limit: about "
                f"{estimate / _MIB:,.0f} MiB needed (its files' {file_bytes / _MIB:,.0f} MiB x {self.factor(engine):.2f}, "
                f"learned from earlier loads) with {held / _MIB:,.0f} MiB held of {self.limit / _MIB:,.0f} MiB "
                f"(memory_limit); the version serving keeps serving")
        return estimate

    def learn(self, engine: str, file_bytes: int, grown: int) -> None:
        """A load of ``file_bytes`` on ``engine`` grew the process by ``grown`` bytes."""
        if file_bytes < LEARN_MIN_BYTES or grown <= 0:
            return  # nothing to learn from (small files: start-up dominates; memory freed meanwhile)
        with self._lock:
            self._ratios.setdefault(engine, deque(maxlen=_KEPT)).append(grown / file_bytes)

    def describe(self) -> dict:
        with self._lock:
            engines = list(self._ratios)
        factors = {engine: round(self.factor(engine), 3) for engine in engines}
        return {"limit_bytes": self.limit, "rss_bytes": memory.process_rss_bytes(), "refused": self.refused,
                "factors": factors, "initial_factor": INITIAL_FACTOR}


_default: MemoryBudget | None = None
_default_lock = threading.Lock()


def default_budget(limit_setting: float | int | None = None) -> MemoryBudget:
    """The process's budget, made on first use with ``limit_setting`` (later settings are
    ignored: one process, one limit; the server sets it from its deployment first)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = MemoryBudget(limit_setting)
        return _default
