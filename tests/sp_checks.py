"""Checks shared by several test modules (importable as ``sp_checks``, like ``conftest``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` seconds passed; its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def concurrent_mismatches(process: Callable[[bytes], tuple[int, bytes]], requests: Sequence[bytes],
                          threads: int = 8, calls: int = 500) -> list[str]:
    """Call ``process`` ``calls`` times from each of ``threads`` threads, cycling through
    ``requests``; return one line per thread whose answer was not 200 with the bytes a
    single-threaded call gave first (empty: every call matched)."""
    expected = [process(r)[1] for r in requests]
    errors: list[str] = []

    def worker(i: int) -> None:
        for n in range(calls):
            k = (i + n) % len(requests)
            status, body = process(requests[k])
            if status != 200 or body != expected[k]:
                errors.append(f"thread {i} call {n}: status {status}")
                return

    run_threads(worker, threads)
    return errors


def run_threads(worker: Callable[[int], None], threads: int) -> None:
    """``worker(k)`` for k in range(threads), each on its own thread; returns when all end."""
    pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
