"""ModelManager over fakes (no engine, no files, no real time): start, full and delta updates,
failures and retries, pin / unpin / rollback, acquire while swapping, close."""

from __future__ import annotations

import json
import threading

import pytest

from fakes import FailingBackend, FakeBackend, FakeStore, ManualClock, SlowBackend, fake_manager
from processor.errors import Internal, NotFound, Unavailable
from processor.manager.model_state import ModelState


def update(m):
    """One watcher round, run here: discover, then reconcile."""
    m.reconcile(m.discover())


def served(m):
    with m.acquire() as group:
        return group.params


def loaded_pinned(m) -> bool:
    """Whether the serving group was loaded to be pinned (workers: its own parameter segment)."""
    with m.acquire() as group:
        return group.pinned


@pytest.fixture
def store():
    s = FakeStore(fulls=[10])
    s.add_delta(12, parent=10)
    return s


def test_start_serves_the_newest_full_and_its_newest_delta(store):
    store.add_full(5)
    m = fake_manager(store)
    assert m.state is ModelState.NEW and not m.ready
    m.start()
    assert m.state is ModelState.READY and m.ready
    assert served(m) == (10, (12,))
    info = m.info()
    assert (info["state"], info["version"]["label"], info["history"]) == ("ready", "10+12", ["10+12"])
    assert info["updates"]["full_loads"] == 1 and info["warmup"] == {"source": "fake", "runs": 2}


def test_model_info_keeps_its_keys_and_plain_strings(store):
    m = fake_manager(store, clock=ManualClock())
    m.start()
    info = m.info()
    assert list(info) == ["name", "state", "last_error", "pinned", "history", "failed_versions", "updates",
                          "warmup", "feature_store", "watcher", "version_policy", "versions", "memory", "freshness",
                          "version", "signature", "session_group"]
    assert type(info["state"]) is str
    assert list(info["version"]) == ["label", "full_step", "delta_step", "deltas_applied", "mode", "why",
                                     "savedmodel_dir", "full_checkpoint", "delta_checkpoint", "run_dir"]
    json.dumps(info)


def test_the_first_load_goes_loading_warming_ready(store):
    seen = []

    class Recording(FakeBackend):
        def open(self, config, version, features=None, batching=None, pinned=False):
            seen.append(m.state)
            return super().open(config, version, features)

        def warm(self, group, local, warmup_file, config):
            seen.append(m.state)
            return super().warm(group, local, warmup_file, config)

    m = fake_manager(store, Recording(store))
    m.start()
    assert seen + [m.state] == [ModelState.LOADING, ModelState.WARMING, ModelState.READY]
    store.add_full(20)
    update(m)  # a later load behind the served version: the model stays ready
    assert seen[2:] == [ModelState.READY, ModelState.READY]


def test_a_newer_full_is_loaded_and_swapped_in_the_old_group_closed(store):
    backend = FakeBackend(store)
    m = fake_manager(store, backend)
    m.start()
    old = backend.groups[0]
    store.add_full(20)
    update(m)
    assert served(m) == (20, ())
    assert old.closed == 1 and backend.groups[1].closed == 0
    assert m.info()["updates"]["full_loads"] == 2 and m.info()["history"] == ["10+12", "20"]


def test_a_newer_delta_is_applied_in_place(store):
    backend = FakeBackend(store)
    m = fake_manager(store, backend)
    m.start()
    store.add_delta(14, parent=10)
    update(m)
    assert backend.groups[0].params == (10, (12, 14)) and len(backend.groups) == 1  # same group
    assert m.served_version().label == "10+14"
    updates = m.info()["updates"]
    assert (updates["delta_updates"], updates["full_loads"], updates["last_delta_hold_seconds"]) == (1, 1, 0.0)


def test_nothing_new_does_nothing(store):
    m = fake_manager(store)
    m.start()
    materialized = len(store.materialized)
    update(m)
    update(m)
    assert len(store.materialized) == materialized and m.info()["updates"]["full_loads"] == 1


def test_a_half_written_full_is_not_picked_up(store):
    m = fake_manager(store)
    m.start()
    store.add_partial_full(99)
    update(m)
    assert m.served_version().label == "10+12" and m.info()["failed_versions"] == []


@pytest.mark.parametrize("kind", ["full", "delta"])
def test_a_broken_version_keeps_the_served_one_and_is_not_retried_until_due_or_newer(store, kind):
    clock = ManualClock()
    backend = FakeBackend(store, broken={20})
    m = fake_manager(store, backend, clock, file_system_poll_wait_seconds=2)
    m.start()
    (store.add_full if kind == "full" else store.add_delta)(20)
    update(m)
    assert served(m) == (10, (12,)) and m.state is ModelState.READY
    info = m.info()
    assert [(f["version"], f["attempts"]) for f in info["failed_versions"]] == [
        ("20" if kind == "full" else "10+20", 1)]
    assert "truncated" in info["last_error"] and info["updates"]["failed_updates"] == 1
    tries = len(store.materialized)

    update(m)  # not due yet (2 s backoff): not tried
    clock.advance(1.9)
    update(m)
    assert len(store.materialized) == tries and m.info()["updates"]["failed_updates"] == 1

    clock.advance(0.1)  # due: tried again, fails again, backs off twice as long
    update(m)
    assert len(store.materialized) == tries + 1
    assert m.info()["failed_versions"][0]["attempts"] == 2
    clock.advance(3.9)
    update(m)
    assert len(store.materialized) == tries + 1

    (store.add_full if kind == "full" else store.add_delta)(30)  # something newer: tried at once
    update(m)
    assert m.served_version().label == ("30" if kind == "full" else "10+30")
    assert m.last_error is None and m.state is ModelState.READY
    assert [(f["version"], f["attempts"]) for f in m.info()["failed_versions"]] == [
        ("20" if kind == "full" else "10+20", 2)]  # the broken one stays recorded


def test_nothing_servable_at_start_fails_and_says_why():
    store = FakeStore()  # no checkpoint yet
    m = fake_manager(store)
    with pytest.raises(Unavailable, match="no complete full checkpoint"):
        m.start()
    assert m.state is ModelState.FAILED
    with pytest.raises(Unavailable, match=r"has no version ready \(failed\): .*no complete full checkpoint"):
        m.acquire_handle()


def test_start_waits_for_a_first_version_on_its_clock():
    store = FakeStore()

    class TrainerClock(ManualClock):
        def sleep(self, seconds):
            super().sleep(seconds)
            if len(self.sleeps) == 3:
                store.add_full(7)

    clock = TrainerClock()
    m = fake_manager(store, clock=clock, init_timeout_minutes=1)
    m.start()
    assert served(m) == (7, ()) and clock.sleeps == [1.0, 1.0, 1.0] and m.state is ModelState.READY


def test_start_gives_up_at_init_timeout():
    clock = ManualClock()
    m = fake_manager(FakeStore(), clock=clock, init_timeout_minutes=0.5)
    with pytest.raises(Unavailable):
        m.start()
    assert sum(clock.sleeps) == 30.0 and m.state is ModelState.FAILED


def test_a_failing_engine_at_start_then_a_good_version():
    store = FakeStore(fulls=[10])
    backend = FailingBackend(store, at="warmup")
    m = fake_manager(store, backend)
    with pytest.raises(Internal, match="version 10 rejected"):
        m.start()
    assert m.state is ModelState.FAILED and backend.groups[0].closed == 1
    backend.at = None
    m.load(m.discover())  # FAILED -> LOADING -> WARMING -> READY
    assert m.state is ModelState.READY and served(m) == (10, ())


def test_pin_unpin_and_rollback(store):
    store.add_full(5)
    m = fake_manager(store)
    m.start()
    assert not loaded_pinned(m)
    assert m.pin(5).label == "5" and served(m) == (5, ()) and loaded_pinned(m)
    assert m.info()["version"]["mode"] == "pinned" and m.info()["version"]["why"] == "pin(5)"
    store.add_full(20)
    update(m)  # pinned: a newer version does not move it
    m.reconcile(store_newest(m))  # a discovery made before the pin: stale, skipped
    assert served(m) == (5, ())
    assert m.pin(12).label == "10+12" and served(m) == (10, (12,))  # a delta step: its full plus it
    with pytest.raises(NotFound, match=r"full steps: \[5, 10, 20\], delta steps: \[12\]"):
        m.pin(11)
    assert loaded_pinned(m)
    assert m.unpin().label == "20" and served(m) == (20, ()) and not loaded_pinned(m)
    assert m.info()["version"]["mode"] == "following" and m.info()["pinned"] is None

    assert m.rollback().label == "10+12" and served(m) == (10, (12,)) and loaded_pinned(m)
    info = m.info()
    assert (info["version"]["mode"], info["version"]["why"], info["pinned"]) == ("pinned", "rollback", "10+12")
    update(m)
    assert served(m) == (10, (12,))


def store_newest(m):
    from processor.store.checkpoint_layout import latest_version

    return latest_version(m.store, m.config.savedmodel_dir, m.config.checkpoint_dir)


def test_rollback_needs_a_previous_version(store):
    m = fake_manager(store)
    m.start()
    with pytest.raises(NotFound, match="no previous version"):
        m.rollback()


def test_restore_model_version_pins_at_start(store):
    store.add_full(20)
    m = fake_manager(store, restore_model_version=10)
    m.start()
    assert served(m) == (10, ())
    assert (m.info()["version"]["why"], m.info()["pinned"]) == ("config restore_model_version", 10)
    store.add_full(30)
    update(m)
    assert served(m) == (10, ())


def test_a_held_group_outlives_the_swap_until_released(store):
    backend = FakeBackend(store)
    m = fake_manager(store, backend)
    m.start()
    handle = m.acquire_handle()
    store.add_full(20)
    update(m)
    old, new = backend.groups
    assert handle.group is old and old.closed == 0  # retired, still in use
    assert served(m) == (20, ())  # new requests get the new group
    handle.release()
    assert old.closed == 1 and new.closed == 0


def test_requests_are_served_by_the_old_group_while_the_new_one_loads(store):
    backend = SlowBackend(store)
    m = fake_manager(store, backend)
    m.start()
    backend.hold()
    store.add_full(20)
    loading = threading.Thread(target=update, args=(m,))
    loading.start()
    try:
        assert backend.entered.wait(10)
        assert served(m) == (10, (12,)) and m.state is ModelState.READY  # the load is under way
    finally:
        backend.release.set()
        loading.join(10)
    assert served(m) == (20, ()) and backend.groups[0].closed == 1


def test_close(store):
    backend = FakeBackend(store)
    m = fake_manager(store, backend)
    m.start()
    m.close()
    assert m.state is ModelState.CLOSED and not m.ready and backend.groups[0].closed == 1
    with pytest.raises(Unavailable, match=r"no version ready \(closed\)"):
        m.acquire_handle()
    store.add_full(20)
    update(m)  # a watcher round after close: nothing
    with pytest.raises(Unavailable, match="closed"):
        m.load(m.discover())
    m.close()  # twice: nothing more
    assert len(backend.groups) == 1 and backend.groups[0].closed == 1 and m.state is ModelState.CLOSED


def test_a_remote_store_serves_its_local_copy_and_reports_the_stores_urls():
    store = FakeStore(fulls=[10], remote=True)
    store.add_delta(12, parent=10)
    backend = FakeBackend(store)
    m = fake_manager(store, backend)
    m.start()
    assert backend.groups[0].opened_from.full_prefix.startswith("/cache/")
    version = m.info()["version"]
    assert (version["full_checkpoint"], version["delta_checkpoint"]) == (
        "fake:///fake/run/model.ckpt-10", "fake:///fake/run/.incremental_checkpoint/incremental_model.ckpt-12")
    store.unreachable = True
    store.add_full(20)
    update(m)  # the download fails: the served version keeps serving, the failure is recorded
    assert served(m) == (10, (12,)) and "unreachable" in m.last_error
    assert [f["version"] for f in m.info()["failed_versions"]] == ["20"]
