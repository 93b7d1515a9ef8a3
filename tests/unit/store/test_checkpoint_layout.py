import os
import time

import pytest

from processor.errors import NotFound, Unavailable
from processor.store.checkpoint_layout import latest_version
from processor.store.model_store import ModelStore


def touch(path, mtime=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    if mtime is not None:
        os.utime(path, (mtime, mtime))


def ckpt(run, name, step, shards=1):
    touch(run / f"{name}-{step}.index")
    for i in range(shards):
        touch(run / f"{name}-{step}.data-{i:05d}-of-{shards:05d}")


@pytest.fixture
def layout(tmp_path):
    sm = tmp_path / "sm"
    touch(sm / "saved_model.pb")
    return tmp_path, sm


def test_savedmodel_only(layout):
    root, sm = layout
    v = latest_version(ModelStore(), str(sm), None)
    assert v.full_step == -1 and v.label == "savedmodel"


def test_missing_savedmodel_is_unavailable(tmp_path):
    with pytest.raises(Unavailable, match="saved_model.pb"):
        latest_version(ModelStore(), str(tmp_path / "nope"), None)


def test_newest_run_by_checkpoint_mtime_and_highest_step(layout):
    root, sm = layout
    old, new = root / "ck" / "run_b", root / "ck" / "run_a"
    now = time.time()
    ckpt(old, "model.ckpt", 900)
    touch(old / "checkpoint", now - 100)
    ckpt(new, "model.ckpt", 100)
    ckpt(new, "model.ckpt", 300, shards=2)
    touch(new / "checkpoint", now)
    v = latest_version(ModelStore(), str(sm), str(root / "ck"))
    assert v.full_step == 300 and v.full_prefix == str(new / "model.ckpt-300")
    assert v.delta_step == -1


def test_incomplete_checkpoint_is_ignored(layout):
    root, sm = layout
    run = root / "ck" / "1"
    ckpt(run, "model.ckpt", 100)
    touch(run / "model.ckpt-200.index")  # data not there yet
    touch(run / "model.ckpt-300.data-00000-of-00002")  # one shard of two, no index
    touch(run / "checkpoint")
    assert latest_version(ModelStore(), str(sm), str(root / "ck")).full_step == 100


@pytest.mark.parametrize("delta_dir", [".incremental_checkpoint", ".incremental_ckpt"])
def test_newest_delta_after_the_full(layout, delta_dir):
    root, sm = layout
    run = root / "ck" / "1"
    ckpt(run, "model.ckpt", 100)
    touch(run / "checkpoint")
    ckpt(run / delta_dir, "incremental_model.ckpt", 50)
    ckpt(run / delta_dir, "incremental_model.ckpt", 120)
    ckpt(run / delta_dir, "incremental_model.ckpt", 150)
    v = latest_version(ModelStore(), str(sm), str(root / "ck"))
    assert (v.full_step, v.delta_step) == (100, 150)
    assert v.delta_prefix.endswith(f"{delta_dir}/incremental_model.ckpt-150")
    assert v.label == "100+150"


def test_checkpoint_dir_may_be_the_run_itself(layout):
    root, sm = layout
    run = root / "run"
    ckpt(run, "model.ckpt", 7)
    touch(run / "checkpoint")
    assert latest_version(ModelStore(), str(sm), str(run)).full_step == 7


def test_a_delta_belongs_to_the_full_it_follows(layout):
    """Deltas after a newer full are not applied to an older one, pinned or followed."""
    root, sm = layout
    run = root / "ck" / "1"
    for s in (1, 3, 6):
        ckpt(run, "model.ckpt", s)
    for s in (2, 4, 5, 7):
        ckpt(run / ".incremental_checkpoint", "incremental_model.ckpt", s)
    touch(run / "checkpoint")
    store, ck = ModelStore(), str(root / "ck")
    v = latest_version(store, str(sm), ck)
    assert (v.full_step, v.delta_step) == (6, 7)
    for full in (1, 3, 6):  # a pinned full step names exactly that full
        v = latest_version(store, str(sm), ck, pin_step=full)
        assert (v.full_step, v.delta_step, v.delta_prefix) == (full, -1, "")
    for delta, full in ((2, 1), (4, 3), (5, 3), (7, 6)):  # a delta step: its full plus that delta
        v = latest_version(store, str(sm), ck, pin_step=delta)
        assert (v.full_step, v.delta_step) == (full, delta) and v.delta_prefix.endswith(f"ckpt-{delta}")
    with pytest.raises(NotFound, match=r"step 8 .*full steps: \[1, 3, 6\], delta steps: \[2, 4, 5, 7\]"):
        latest_version(store, str(sm), ck, pin_step=8)
    (run / ".incremental_checkpoint" / "incremental_model.ckpt-7.index").unlink()
    v = latest_version(store, str(sm), ck)
    assert (v.full_step, v.delta_step) == (6, -1)  # deltas 4 and 5 belong to full 3


def test_chained_deltas_list_every_link_of_their_full(layout):
    root, sm = layout
    run = root / "ck" / "1"
    for s in (1, 6):
        ckpt(run, "model.ckpt", s)
    for s in (2, 3, 5, 7):
        ckpt(run / ".incremental_checkpoint", "incremental_model.ckpt", s)
    touch(run / "checkpoint")
    store, ck = ModelStore(), str(root / "ck")
    chain = lambda v: [s for s, _ in v.delta_chain]  # noqa: E731
    assert chain(latest_version(store, str(sm), ck)) == [7]
    assert chain(latest_version(store, str(sm), ck, delta_mode="chain")) == [7]
    assert chain(latest_version(store, str(sm), ck, pin_step=5, delta_mode="chain")) == [2, 3, 5]
    assert chain(latest_version(store, str(sm), ck, pin_step=3, delta_mode="chain")) == [2, 3]
    assert chain(latest_version(store, str(sm), ck, pin_step=3)) == [3]  # cumulative: the last only
    assert chain(latest_version(store, str(sm), ck, pin_step=1, delta_mode="chain")) == []


def test_pinned_step(layout):
    root, sm = layout
    run = root / "ck" / "1"
    for s in (100, 200):
        ckpt(run, "model.ckpt", s)
    touch(run / "checkpoint")
    assert latest_version(ModelStore(), str(sm), str(root / "ck"), pin_step=100).full_step == 100
    with pytest.raises(NotFound, match="full steps: \\[100, 200\\], delta steps: \\[\\]"):
        latest_version(ModelStore(), str(sm), str(root / "ck"), pin_step=150)


def test_no_runs_is_unavailable(layout):
    root, sm = layout
    (root / "ck").mkdir()
    with pytest.raises(Unavailable, match="no run"):
        latest_version(ModelStore(), str(sm), str(root / "ck"))
