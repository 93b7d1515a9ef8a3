"""VersionLoader over fakes: materialize, open, apply deltas, warm up, close on failure."""

from __future__ import annotations

import os
import threading

import pytest

from fakes import FailingBackend, FakeBackend, FakeStore
from processor import load_priority
from processor.checkpoint.delta import CheckpointError
from processor.errors import Internal, Unavailable
from processor.store.checkpoint_layout import latest_version


def newest(store, **config):
    cfg = store.config(**config)
    return latest_version(store, cfg.savedmodel_dir, cfg.checkpoint_dir, delta_mode=cfg.delta_mode)


def test_load_opens_the_local_copy_serving_the_stores_version():
    store = FakeStore(fulls=[10], remote=True)
    store.add_delta(12, parent=10)
    backend = FakeBackend(store)
    version = newest(store)
    events = []
    loaded = backend.loader(store.config()).load(version, on_warming=lambda: events.append(backend.warmups))
    group = loaded.group
    assert store.materialized == [version]
    assert group.opened_from.full_prefix == "/cache/fake/run/model.ckpt-10"  # the local copy
    assert group.version == version  # reports the store's version
    assert group.params == (10, (12,)) and backend.staged == [12]
    assert events == [0] and backend.warmups == 1  # on_warming: after the deltas, before the warmup
    assert loaded.warmup == {"source": "fake", "runs": 2}
    assert group.closed == 0


def test_a_chain_applies_every_link_in_order():
    store = FakeStore(fulls=[10])
    for step, parent in ((11, 10), (12, 11), (13, 12)):
        store.add_delta(step, parent)
    backend = FakeBackend(store)
    loaded = backend.loader(store.config(delta_mode="chain")).load(newest(store, delta_mode="chain"))
    assert loaded.group.params == (10, (11, 12, 13))


def test_a_missing_link_is_refused_before_anything_is_applied_and_the_group_closed():
    store = FakeStore(fulls=[10])
    store.add_delta(11, parent=10)
    store.add_delta(13, parent=12)  # 12 never published
    backend = FakeBackend(store)
    with pytest.raises(CheckpointError, match=r"version 10\+13 rejected: .*missing link"):
        backend.loader(store.config(delta_mode="chain")).load(newest(store, delta_mode="chain"))
    [group] = backend.groups
    assert group.deltas == [] and group.closed == 1 and backend.warmups == 0


def test_a_warmup_failure_closes_the_new_group():
    store = FakeStore(fulls=[10])
    backend = FailingBackend(store, at="warmup")
    with pytest.raises(Internal, match="version 10 rejected: ValueError: warmup request failed"):
        backend.loader(store.config()).load(newest(store))
    [group] = backend.groups
    assert group.closed == 1


@pytest.mark.parametrize("backend_kind", ["failing", "broken"])
def test_an_open_failure_leaves_nothing_open(backend_kind):
    store = FakeStore(fulls=[10])
    backend = FailingBackend(store) if backend_kind == "failing" else FakeBackend(store, broken={10})
    with pytest.raises(Internal):
        backend.loader(store.config()).load(newest(store))
    assert backend.groups == []


def test_an_unreachable_store_fails_before_opening():
    store = FakeStore(fulls=[10], remote=True)
    store.unreachable = True
    backend = FakeBackend(store)
    with pytest.raises(Unavailable, match="unreachable"):
        backend.loader(store.config()).load(newest(store))
    assert backend.groups == []


@pytest.mark.parametrize("mode, published, applied", [
    ("cumulative", [(12, 10), (14, 10)], (12, 14)),  # the newest delta alone, against the full
    ("chain", [(11, 10), (12, 11), (13, 12)], (11, 12, 13)),  # the links after the served ones
])
def test_apply_delta_in_place(mode, published, applied):
    store = FakeStore(fulls=[10])
    store.add_delta(*published[0])
    backend = FakeBackend(store)
    loader = backend.loader(store.config(delta_mode=mode))
    group = loader.load(newest(store, delta_mode=mode)).group
    for step, parent in published[1:]:
        store.add_delta(step, parent)
    target = newest(store, delta_mode=mode)
    result = loader.apply_delta(group, target)
    assert group.params == (10, applied) and group.version == target
    assert (result.rows, result.dense, result.hold_seconds) == (len(published) - 1, 0, 0.0)
    assert backend.groups == [group]  # no second group


def test_apply_delta_checks_every_link_first():
    store = FakeStore(fulls=[10])
    store.add_delta(11, parent=10)
    backend = FakeBackend(store, broken={13})
    loader = backend.loader(store.config(delta_mode="chain"))
    group = loader.load(newest(store, delta_mode="chain")).group
    store.add_delta(12, parent=11)
    store.add_delta(13, parent=12)
    with pytest.raises(CheckpointError, match="cannot read delta"):
        loader.apply_delta(group, newest(store, delta_mode="chain"))
    assert group.params == (10, (11,))  # 12 was read but not applied: 13 failed its read


def test_an_unreadable_delta_keeps_the_reader_error_as_its_cause(tmp_path):
    """CheckpointError is an internal error: the reader's exception stays its __cause__ (the
    edge logs where the read failed), not hidden with ``from None``."""
    from processor.checkpoint.delta import read_delta

    with pytest.raises(CheckpointError, match="cannot read delta") as info:
        read_delta(str(tmp_path / "missing"), 11, {})
    assert info.value.__cause__ is not None


@pytest.mark.skipif(not load_priority.supported(),
                    reason="this process cannot lower a thread's nice value back (no CAP_SYS_NICE, RLIMIT_NICE 0): "
                           "deltas run at serving priority here")
def test_a_delta_is_read_below_serving_priority_and_applied_at_it(monkeypatch):
    """The reading and checks compete with requests, so they yield the cores; the apply holds
    requests at the gate, so it runs at serving priority (a lowered writer would hold them longer)."""
    def nice() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    store = FakeStore(fulls=[10])
    backend = FakeBackend(store)
    loader = backend.loader(store.config(delta_mode="chain", load_nice=7))
    group = loader.load(newest(store, delta_mode="chain")).group
    store.add_delta(11, parent=10)
    serving, seen = nice(), {}

    def noting(stage, call):
        def noted(*args):
            seen[stage] = nice()
            return call(*args)
        return noted

    monkeypatch.setattr(backend, "read_delta", noting("read", backend.read_delta))
    monkeypatch.setattr(group, "apply_delta", noting("apply", group.apply_delta))
    loader.apply_delta(group, newest(store, delta_mode="chain"))
    assert seen == {"read": serving + 7, "apply": serving} and nice() == serving
