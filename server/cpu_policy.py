"""The server's CPU scheduling policy: the deployment's ``cpu_scheduling``.

``"other"`` (the default) leaves Linux's normal policy (SCHED_OTHER). ``"batch"`` puts every
thread of the process under SCHED_BATCH, and with it every thread and worker process started
after (Linux: a new thread or process takes its creator's policy). A SCHED_BATCH thread that
wakes does not preempt the one running: on cores that the gRPC or HTTP threads share with the
batch threads, a network read no longer cuts into a batch the engine is computing, which costs a
context switch and the batch's caches each time. Measured with the native gRPC server on 2 cores
(benchmarks/bench_edges.py, batch-256 requests merged by the model's batching): about 2.5
involuntary switches per request off, and about 10% more requests a second; at batch 1 the same
throughput. What it gives up is latency for a thread that wakes to a short task while a long one
runs: it waits for the scheduler's next tick. Nice values (the loads' lower priority,
processor/load_priority.py) still apply.

Unprivileged: SCHED_BATCH needs no capability. Not reversible here: ``"other"`` changes nothing,
so a process that once ran ``"batch"`` keeps it (one server a process, so no matter).
"""

from __future__ import annotations

import os
from pathlib import Path

from processor.errors import ConfigError

KEY = "cpu_scheduling"


def apply(policy: str) -> None:
    """Put the process's threads (those running and those to come) under ``policy`` ("other":
    nothing to do; "batch": SCHED_BATCH). ConfigError naming the key where the OS has no
    SCHED_BATCH (not Linux) or refuses it. Thread-safe; a thread that ends meanwhile is skipped."""
    if policy == "other":
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
