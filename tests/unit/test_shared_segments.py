"""processor/shared_segments.py in one process, in a temporary directory: create once, map again,
the last user removes the file, private writes, stale servers cleaned, the server lock; and the
``workers`` deployment key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from processor import shared_segments
from server.settings import DeploymentConfig
from processor.errors import ConfigError


def fill_with(values: np.ndarray):
    return lambda path: Path(path).write_bytes(values.tobytes())


def test_created_once_mapped_again_and_removed_by_the_last_user(shm_worker):
    values = np.arange(4096, dtype=np.float32)
    first = shared_segments.Segment.open("entry.weights", values.nbytes, fill_with(values))
    second = shared_segments.Segment.open("entry.weights", values.nbytes,
                                          lambda path: pytest.fail("filled twice"))
    assert first.created and not second.created and first.path == second.path
    a = np.frombuffer(first.buffer, np.float32)
    b = np.frombuffer(second.buffer, np.float32)
    np.testing.assert_array_equal(b, values)
    a[0] = -1.0  # a private mapping: the other mapping and the file keep the published value
    assert b[0] == 0.0 and np.frombuffer(first.path.read_bytes(), np.float32)[0] == 0.0
    first.release()
    assert first.path.exists()  # the second still uses it
    second.release()
    second.release()  # idempotent
    assert not first.path.exists()


def test_a_fill_that_fails_leaves_nothing(shm_worker):
    def broken(path):
        Path(path).write_bytes(b"x")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        shared_segments.Segment.open("bad.weights", 4096, broken)
    assert not [p for p in shm_worker.iterdir() if "bad" in p.name]
    with pytest.raises(OSError, match="expected 4096"):
        shared_segments.Segment.open("short.weights", 4096, lambda path: Path(path).write_bytes(b"x"))


def test_segments_are_off_outside_a_worker(monkeypatch):
    monkeypatch.setattr(shared_segments, "_active", None)
    assert shared_segments.active() is None
    with pytest.raises(RuntimeError, match="not a worker"):
        shared_segments.Segment.open("x", 1, lambda path: None)


def test_stale_servers_are_cleaned_live_ones_kept(tmp_path):
    prefix = shared_segments.PREFIX
    # a dead server: its lock file is there but nobody holds it
    for name in ("111.lock", "111.create", "111-abc.weights"):
        (tmp_path / f"{prefix}{name}").write_bytes(b"")
    # files of a server whose lock is gone already
    (tmp_path / f"{prefix}222-def.weights").write_bytes(b"")
    # a live server: its lock is held (by a child process, as another server's supervisor would)
    live = tmp_path / f"{prefix}333.lock"
    (tmp_path / f"{prefix}333-ghi.weights").write_bytes(b"")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
        "fcntl.flock(fd, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(60)"), str(live)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        (tmp_path / "unrelated.file").write_bytes(b"")
        removed = shared_segments.clean_stale(tmp_path)
        assert sorted(removed) == sorted(f"{prefix}{n}" for n in
                                         ("111.lock", "111.create", "111-abc.weights", "222-def.weights"))
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            [f"{prefix}333.lock", f"{prefix}333-ghi.weights", "unrelated.file"])
    finally:
        holder.kill()
        holder.wait()


def test_server_lock_takes_this_pid_and_removes_its_files(tmp_path):
    lock = shared_segments.ServerLock(tmp_path)
    assert lock.server_id == str(os.getpid())
    (tmp_path / f"{shared_segments.PREFIX}{lock.server_id}-x.weights").write_bytes(b"")
    assert shared_segments.clean_stale(tmp_path) == []  # held: not stale
    lock.remove()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", [0, 257, "2", True])
def test_workers_key_is_checked(value):
    with pytest.raises(ConfigError, match="workers"):
        DeploymentConfig.from_dict({"models": [{"name": "m", "model_config": {"savedmodel_dir": "/m"}}],
                                    "workers": value})


def test_workers_defaults_to_one_process():
    dep = DeploymentConfig.from_dict({"models": [{"name": "m", "model_config": {"savedmodel_dir": "/m"}}]})
    assert dep.workers == 1


def test_a_worker_names_its_timelines_with_its_pid(shm_worker):
    from processor.tracing.tracer import _file_name

    assert _file_name(str(shm_worker)).startswith(f"timeline-{os.getpid()}-")
