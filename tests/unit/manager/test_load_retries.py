"""TF Serving's load retries (``max_num_load_retries``, ``load_retry_interval_micros``: the
model_config keys ``tensorflow_model_server``'s flags of those names set) over fakes: a failed
first load is tried again that many times, that far apart, then given up; a version given up is
not tried again, a newer one is; without the keys nothing changes (no retry at start, a backoff
for ever after)."""

from __future__ import annotations

import math

import pytest

from fakes import FailingBackend, FakeBackend, FakeStore, ManualClock, fake_manager
from processor.errors import Internal
from processor.manager.model_state import ModelState
from processor.manager.policy import Retries, record_failure


def update(m):
    m.reconcile(m.discover())


def served(m):
    with m.acquire() as group:
        return group.params


def test_record_failure_gives_up_after_max_retries_at_a_fixed_interval():
    first = record_failure(None, "boom", 100.0, 2.0, Retries(max_retries=1, interval=5.0))
    assert (first.attempts, first.retry_at, first.given_up) == (1, 105.0, False)
    second = record_failure(first, "boom", 105.0, 2.0, Retries(max_retries=1, interval=5.0))
    assert second.attempts == 2 and math.isinf(second.retry_at) and second.given_up
    never = record_failure(None, "boom", 100.0, 2.0, Retries(max_retries=0))
    assert never.given_up
    ours = record_failure(None, "boom", 100.0, 2.0)
    assert ours.retry_at == 102.0 and not ours.given_up


def test_first_load_is_retried_then_given_up_and_a_newer_version_still_loads():
    store = FakeStore(fulls=[10])
    backend, clock = FailingBackend(store, at="open"), ManualClock()
    m = fake_manager(store, backend, clock, max_num_load_retries=2, load_retry_interval_micros=5_000_000)
    with pytest.raises(Internal, match="refused"):
        m.start()
    assert clock.sleeps == [5.0, 5.0] and m.state is ModelState.FAILED
    assert m.info()["failed_versions"] == [{"version": "10", "attempts": 3, "error": "the fake engine refused the model"}]
    backend.at = None
    clock.advance(3600)
    update(m)  # given up: not tried again
    assert m.state is ModelState.FAILED
    store.add_full(20)
    update(m)
    assert m.state is ModelState.READY and served(m) == (20, ())


def test_a_first_load_that_fails_once_serves_on_its_retry():
    store = FakeStore(fulls=[10])

    class FailsOnce(FakeBackend):
        calls = 0

        def open(self, config, version, features=None, batching=None, pinned=False):
            FailsOnce.calls += 1
            if FailsOnce.calls == 1:
                raise Internal("not yet")
            return super().open(config, version, features)

    clock = ManualClock()
    m = fake_manager(store, FailsOnce(store), clock, max_num_load_retries=5, load_retry_interval_micros=0)
    m.start()
    assert m.state is ModelState.READY and served(m) == (10, ()) and clock.sleeps == [0.0]


def test_without_the_keys_a_first_load_is_not_retried():
    store = FakeStore(fulls=[10])
    clock = ManualClock()
    m = fake_manager(store, FailingBackend(store, at="open"), clock)
    with pytest.raises(Internal):
        m.start()
    assert clock.sleeps == [] and m.info()["failed_versions"][0]["attempts"] == 1
