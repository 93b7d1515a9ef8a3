"""The server's CPU scheduling policy: the deployment's ``cpu_scheduling``.

A SCHED_BATCH thread that wakes does not preempt the one running (its turn comes at the
scheduler's next tick or when the running one sleeps). On cores that network threads share with
the batch threads, a network read under SCHED_OTHER cuts into a batch the engine is computing,
which costs a context switch and the batch's caches each time.

* ``"io_batch"`` (the default): the native gRPC server's own threads (gRPC's pollers, callback
  and executor threads; ``io_threads_batch``, made so by native/grpc_server) are SCHED_BATCH,
  every other thread keeps Linux's normal policy, so the engine's threads still preempt the
  network's. With the Python gRPC server it changes nothing: its threads and the HTTP event loop
  run handler code too. Measured with the native gRPC server on 2 cores
  (benchmarks/bench_edges.py, the DLRM-like model): at batch 256 about 3.4 involuntary switches a
  request fall to 0.8 and req/s rise 4-13%; paced at 70-85% of capacity p50 and p99 are no worse
  and CPU per request is lower at batch 1 and 256; only at saturation with a fixed number of
  callers does p99 rise (10-20%) while p50 falls: the network threads wait out batches.
* ``"batch"``: every thread of the process, and every thread and worker process started after (a
  new thread or process takes its creator's policy). The batch threads no longer preempt each
  other either; the same trade at saturation.
* ``"other"``: Linux's normal policy (SCHED_OTHER) for every thread.

Unprivileged: SCHED_BATCH needs no capability. Not reversible here: ``"other"`` changes nothing,
so a process that once ran ``"batch"`` keeps it (one server a process, so no matter). Nice values
(the loads' lower priority, processor/load_priority.py) still apply.
"""

from __future__ import annotations

import os
from pathlib import Path

from processor.errors import ConfigError

KEY = "cpu_scheduling"


def io_threads_batch(policy: str) -> bool:
    """Whether the native gRPC server makes its own threads SCHED_BATCH under ``policy``."""
    return policy == "io_batch"


def apply(policy: str) -> None:
    """Put the process's threads (those running and those to come) under ``policy`` ("other",
    "io_batch": nothing to do process-wide; "batch": SCHED_BATCH). ConfigError naming the key
    where the OS has no SCHED_BATCH (not Linux) or refuses it. Thread-safe; a thread that ends
    meanwhile is skipped."""
    if policy != "batch":
        return
    batch = getattr(os, "SCHED_BATCH", None)
    if batch is None or not hasattr(os, "sched_setscheduler"):
        raise ConfigError(f'{KEY}: "batch" needs Linux\'s SCHED_BATCH, which this system has not; '
                          f'set {KEY}: "other"')
    try:
        for task in Path("/proc/self/task").iterdir():  # this thread among them: what it starts inherits it
            try:
                os.sched_setscheduler(int(task.name), batch, os.sched_param(0))
            except ProcessLookupError:  # the thread ended since the listing
                pass
    except OSError as exc:
        raise ConfigError(f'{KEY}: "batch": the system refused SCHED_BATCH ({exc}); set {KEY}: "other"') from None
