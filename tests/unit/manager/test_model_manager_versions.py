"""Several versions in the ModelManager (model_version_policy) over the fake store and engine:
side by side, by number, a new version replacing the oldest only once it serves, a failed one
leaving the others serving, deltas on the newest only, a retired version closed after its last
request."""

import pytest

from fakes import FakeBackend, FakeStore, ManualClock, fake_manager
from processor.errors import NotFound

LATEST_2 = {"model_version_policy": {"latest": {"num_versions": 2}}}


def update(m):
    """One watcher round, run here."""
    m.reconcile(m.discover_all())


def served(m) -> list[str]:
    return [v.label for v in m.served_versions()]


@pytest.fixture
def store():
    s = FakeStore(fulls=[10, 20, 30])
    s.add_delta(15, parent=10)
    s.add_delta(35, parent=30)
    return s


def test_the_policy_serves_the_newest_two_each_with_its_own_deltas(store):
    m = fake_manager(store, **LATEST_2)
    m.start()
    assert served(m) == ["20", "30+35"] and m.served_version().label == "30+35"  # the default: newest
    handle = m.acquire_handle(20)
    assert handle.group.version.label == "20"
    handle.release()
    with pytest.raises(NotFound, match=r"Specific\(m, 99\); serving versions \[20, 30\]"):
        m.acquire_handle(99)
    assert [v["version"] for v in m.info()["versions"]] == [20, 30]


def test_all_and_specific():
    store = FakeStore(fulls=[10, 20, 30])
    assert served(_started(store, model_version_policy={"all": {}})) == ["10", "20", "30"]
    assert served(_started(store, model_version_policy={"specific": {"versions": [10, 30, 77]}})) == ["10", "30"]


def _started(store, **config):
    m = fake_manager(store, **config)
    m.start()
    return m


def test_a_new_version_retires_the_oldest_once_it_serves_and_a_held_one_closes_after_release(store):
    backend = FakeBackend(store)
    m = fake_manager(store, backend, **LATEST_2)
    m.start()
    held = m.acquire_handle(20)  # a request of version 20 in flight
    old_group = held.group
    store.add_full(40)
    update(m)
    assert served(m) == ["30+35", "40"]
    assert old_group.closed == 0, "version 20 was closed under its in-flight request"
    held.release()
    assert old_group.closed == 1


def test_a_failing_new_version_leaves_both_serving(store):
    backend = FakeBackend(store, broken={40})
    m = fake_manager(store, backend, clock=ManualClock(), **LATEST_2)
    m.start()
    store.add_full(40)
    update(m)
    assert served(m) == ["20", "30+35"]  # 20 is kept: the policy's 40 does not serve
    assert [f["version"] for f in m.info()["failed_versions"]] == ["40"]


def test_deltas_reach_the_newest_only(store):
    m = fake_manager(store, **LATEST_2)
    m.start()
    store.add_delta(17, parent=10)  # a delta of an older full: not served by anyone here
    store.add_delta(37, parent=30)
    update(m)
    assert served(m) == ["20", "30+37"]
    assert m.info()["updates"]["delta_updates"] == 1


def test_a_pin_serves_one_version_and_unpin_returns_to_the_policy(store):
    m = fake_manager(store, **LATEST_2)
    m.start()
    m.pin(20)
    assert served(m) == ["20"]
    m.unpin()
    assert served(m) == ["20", "30+35"]
