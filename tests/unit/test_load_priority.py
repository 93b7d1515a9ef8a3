"""processor.load_priority: a load runs below serving priority, and the threads it makes (an
engine's pools) serve at serving priority once the loads end."""

from __future__ import annotations

import os
import threading

import pytest

from processor import load_priority

needs_restore = pytest.mark.skipif(not load_priority.supported(),
                                   reason="this process cannot lower a thread's nice value (no CAP_SYS_NICE, "
                                          "RLIMIT_NICE 0): loads run at serving priority here")


def nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


class Pool:
    """A thread made inside a load, as an engine's pool thread is: it reports its nice value on
    request until stopped."""

    def __init__(self, own_nice: int | None = None) -> None:
        self.ask, self.told, self.stop = threading.Event(), threading.Event(), False
        self.value = None
        self.own_nice = own_nice
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.ready.wait(10)

    def _run(self) -> None:
        if self.own_nice is not None:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.own_nice)
        self.ready.set()
        while True:
            self.ask.wait()
            self.ask.clear()
            if self.stop:
                return
            self.value = nice()
            self.told.set()

    def nice(self) -> int:
        self.told.clear()
        self.ask.set()
        assert self.told.wait(10)
        return self.value

    def close(self) -> None:
        self.stop = True
        self.ask.set()
        self.thread.join(10)


def run_on_thread(fn):
    """``fn()`` on a fresh thread (a thread's lowered priority is its own: the test's stays)."""
    out, errors = [], []

    def target():
        try:
            out.append(fn())
        except BaseException as exc:  # noqa: BLE001 - re-raised on the test's thread
            errors.append(exc)
    thread = threading.Thread(target=target)
    thread.start()
    thread.join(30)
    if errors:
        raise errors[0]
    return out[0]


@needs_restore
def test_a_load_runs_lowered_and_its_pools_go_back_to_serving_priority():
    def load():
        base = nice()
        with load_priority.lowered(10):
            inside = nice()
            pool, shadow = Pool(), Pool(own_nice=19)  # an engine's pool; a thread lowered on purpose
            pool_inside = pool.nice()
        after = (nice(), pool.nice(), shadow.nice())
        pool.close()
        shadow.close()
        return base, inside, pool_inside, after
    base, inside, pool_inside, after = run_on_thread(load)
    assert inside == pool_inside == min(19, base + 10)
    assert after == (base, base, 19)


@needs_restore
def test_pools_go_back_only_when_the_last_of_concurrent_loads_ends():
    first_in, second_done, release = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def first():
        with load_priority.lowered(10):
            seen["pool"] = Pool()
            first_in.set()
            release.wait(30)
            seen["while_first_loads"] = seen["pool"].nice()
        seen["after"] = seen["pool"].nice()
        return True

    def second():
        first_in.wait(30)
        with load_priority.lowered(10):
            pass
        second_done.set()
        return True

    a = threading.Thread(target=first)
    b = threading.Thread(target=second)
    a.start()
    b.start()
    assert second_done.wait(30)
    release.set()
    a.join(30)
    b.join(30)
    seen["pool"].close()
    assert seen["while_first_loads"] == min(19, seen["after"] + 10)  # still the load's: it warms up
    assert seen["after"] == nice()


def test_nice_zero_or_no_way_back_leaves_priority_alone(monkeypatch):
    def check():
        base = nice()
        with load_priority.lowered(0):
            assert nice() == base
        monkeypatch.setattr(load_priority, "_supported", False)
        with load_priority.lowered(10):
            assert nice() == base
        return True
    assert run_on_thread(check)
