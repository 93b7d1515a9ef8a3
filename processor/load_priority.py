"""Loads at a lower CPU priority than serving.

A version load (reading its files, building its tables, creating the engine's sessions, the
warm-up) runs inside :func:`lowered`, and so do a delta's reading and checks (not its apply,
which holds requests at the update gate and so runs at serving priority): the loading thread's
nice value is raised by the load's ``nice`` for the block, so on busy cores the scheduler runs
the serving threads first and the load takes what is left.

Linux gives each thread its own nice value, and a new thread starts with its creator's. The
engine's thread pools made during a load (ONNX Runtime's per-session pools, TensorFlow's) start
at the load's priority, which is right for the warm-up they run, and wrong for the requests they
serve afterwards. So when the last load running ends, every thread that appeared since the first
of them began and still runs at a load's nice value is put back to serving priority (the nice
value the loading threads had before).

Putting a thread back means lowering its nice value, which Linux allows only with CAP_SYS_NICE
or an RLIMIT_NICE that permits it (an unprivileged container has neither by default; the soft
limit is raised to the hard one here). :func:`supported` probes that once; where it fails,
loads run at serving priority (logged once, naming the fix), since a model left serving at a
load's priority would be worse than a load competing with requests.

The lowered priority is CPU scheduling only: a load's Python work still holds the GIL while it
runs, and work the engine hands to thread pools that already existed (TensorFlow's process-wide
pools) runs at their priority. Thread-safe: loads on several threads at once share one
bookkeeping (a lock and a count).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator

log = logging.getLogger(__name__)

DEFAULT_NICE = 10  # below serving, above the shadow copies (nice 19: processor/shadow.py)
_TASKS = "/proc/self/task"

_lock = threading.Lock()
_active = 0  # loads inside lowered() now
_before: set[int] = set()  # the threads that existed when the first of them began
_serving_nice = 0  # the nice value threads are put back to
_supported: bool | None = None  # probed once


def _tid() -> int:
    return threading.get_native_id()


def _threads() -> set[int]:
    try:
        return {int(t) for t in os.listdir(_TASKS)}
    except OSError:
        return set()


def _nice_of(tid: int) -> int | None:
    try:
        return os.getpriority(os.PRIO_PROCESS, tid)
    except OSError:  # the thread ended
        return None


def supported() -> bool:
    """Whether this process can put a thread back to a lower nice value (see the module doc);
    probed once, on a thread of its own (whose priority is lost with it)."""
    global _supported
    with _lock:
        if _supported is None:
            _supported = _probe()
            if not _supported:
                log.warning("model loads run at serving priority: this process cannot restore a thread's "
                            "CPU priority after a load (grant CAP_SYS_NICE, e.g. Kubernetes "
                            "securityContext.capabilities.add [SYS_NICE], or raise RLIMIT_NICE: ulimit -e 40)")
        return _supported


def _probe() -> bool:
    if not hasattr(os, "setpriority") or not os.path.isdir(_TASKS):
        return False
    with contextlib.suppress(ImportError, ValueError, OSError):
        import resource

        _, hard = resource.getrlimit(resource.RLIMIT_NICE)
        resource.setrlimit(resource.RLIMIT_NICE, (hard, hard))  # the soft limit up to the hard one
    result: list[bool] = []

    def attempt() -> None:
        tid = _tid()
        try:
            start = os.getpriority(os.PRIO_PROCESS, tid)
            if start >= 19:
                result.append(False)
                return
            os.setpriority(os.PRIO_PROCESS, tid, start + 1)
            os.setpriority(os.PRIO_PROCESS, tid, start)
            result.append(True)
        except OSError:
            result.append(False)
    probe = threading.Thread(target=attempt, name="sp-nice-probe", daemon=True)
    probe.start()
    probe.join()
    return bool(result and result[0])


@contextlib.contextmanager
def lowered(nice: int = DEFAULT_NICE) -> Iterator[None]:
    """Run the block (one load, on the caller's thread) ``nice`` steps below serving priority;
    the caller's thread and the threads the loads made are put back afterwards (see the module
    doc). ``nice`` 0, or a process that cannot put threads back: the block runs as it is. Never
    raises for the priority's sake."""
    if nice <= 0 or not supported():
        yield
        return
    global _active, _before, _serving_nice
    tid = _tid()
    own = _nice_of(tid)
    with _lock:
        if _active == 0:
            _before = _threads()
            _serving_nice = own if own is not None else 0
        _active += 1
    load_nice = min(19, (own or 0) + nice)
    try:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, tid, load_nice)
        yield
    finally:
        with contextlib.suppress(OSError):
            if own is not None:
                os.setpriority(os.PRIO_PROCESS, tid, own)
        with _lock:
            _active -= 1
            if _active == 0:
                _put_back(_threads() - _before, _serving_nice)


def _put_back(threads: set[int], serving_nice: int) -> None:
    """Threads made during loads that still run below ``serving_nice`` back to it (threads that
    lowered themselves further on purpose, the shadow copies' at 19, are left alone: only
    values between serving and a load's are a load's)."""
    for tid in threads:
        value = _nice_of(tid)
        if value is not None and serving_nice < value < 19:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, tid, serving_nice)
