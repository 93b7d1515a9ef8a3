"""CPU pinning of engine threads, by kernel thread id.

Engines create their pools inside native code; the only handle Python has on those threads is
their kernel id and name under ``/proc/self/task``. :func:`new_threads` snapshots the threads
that appear while a block runs (creation is serialized by :data:`creation_lock` so two loads do
not see each other's threads), and :func:`pin` sets their affinity.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Sequence

from ..errors import ConfigError

creation_lock = threading.Lock()


def _threads() -> dict[int, str]:
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                out[int(tid)] = f.read().strip()
        except OSError:  # the thread ended meanwhile
            pass
    return out


@contextlib.contextmanager
def new_threads() -> Iterator[dict[int, str]]:
    """Yield a dict that, after the block, maps the ids of threads created in it to their names.

    Callers must hold :data:`creation_lock`.
    """
    before = set(_threads())
    created: dict[int, str] = {}
    yield created
    created.update({tid: name for tid, name in _threads().items() if tid not in before})


def check_cpus(cpusets: Sequence[Sequence[int]]) -> None:
    """Raise ConfigError if a cpuset names a CPU this process may not run on."""
    allowed = os.sched_getaffinity(0)
    for i, cpus in enumerate(cpusets):
        bad = sorted(set(cpus) - allowed)
        if bad:
            raise ConfigError(f"cpusets: group {i} names CPU(s) {bad} outside this process's "
                              f"CPUs {sorted(allowed)}")


def pin(tids: Sequence[int], cpus: Sequence[int]) -> list[int]:
    """Pin each thread in ``tids`` to ``cpus``; return the ids actually pinned."""
    pinned = []
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
            pinned.append(tid)
        except OSError:  # the thread ended, or the kernel refused
            pass
    return pinned
