"""processor/features/shared_tables.py: the DRAM and DRAM+SSD stores' tables in one shared-memory
segment when this process is a worker (``shared_segments.enable`` pointed at a temporary
directory). Two ``open_version`` calls of the same version stand for two workers: the second maps
the first's segment; lookups equal the private path's; a delta in one leaves the other's rows;
the last release removes the files."""

from __future__ import annotations

import os

import numpy as np
import pytest

from processor import shared_segments
from processor.checkpoint.tensor_file import write_tensors
from processor.features import native_rows, shared_tables
from processor.features.dram_store import DramStore
from processor.features.ev_checkpoint import TableSource
from processor.features.rows import RowChunk, TableSpec
from processor.features.tiered_store import TieredStore

ROWS, DIM = 3000, 8


@pytest.fixture
def checkpoint(tmp_path):
    """A full checkpoint: an EmbeddingVariable table (raw ids, freqs, versions) and a plain one."""
    rng = np.random.default_rng(7)
    keys = rng.choice(10**9, ROWS, replace=False).astype(np.int64)
    tensors = {"ev-keys": keys, "ev-values": rng.standard_normal((ROWS, DIM)).astype(np.float32),
               "ev-freqs": rng.integers(1, 100, ROWS), "ev-versions": rng.integers(1, 100, ROWS),
               "plain": rng.standard_normal((500, 4)).astype(np.float32)}
    prefix = str(tmp_path / "ckpt" / "model.ckpt-10")
    os.makedirs(os.path.dirname(prefix))
    write_tensors(prefix, tensors)
    return prefix, tensors


def specs(dtype: str) -> dict[str, TableSpec]:
    return {"ev": TableSpec("ev", DIM, "raw", ROWS, dtype=dtype), "plain": TableSpec("plain", 4, "row", 500, dtype=dtype)}


def queries(tensors) -> list[tuple[str, np.ndarray]]:
    ev = np.concatenate([tensors["ev-keys"][::7], [-1, 5, 10**12]])  # hits, then misses
    return [("ev", ev.reshape(-1, 3)), ("plain", np.array([0, 499, 500, -3, 17]))]


def segment_files(shm) -> list[str]:
    return sorted(p.name for p in shm.iterdir() if "-tables-" in p.name and not p.name.endswith(".build"))


def leftovers(shm) -> list[str]:
    """Files of the server but its ``.create`` lock (which the supervisor's stop removes)."""
    return sorted(p.name for p in shm.iterdir() if not p.name.endswith(".create"))


def shares_memory(arr: np.ndarray, segment) -> bool:
    base = np.frombuffer(segment.buffer, np.uint8)
    return np.shares_memory(arr, base)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_two_workers_map_one_segment_and_serve_as_the_private_path(shm_worker, checkpoint, monkeypatch, dtype):
    prefix, tensors = checkpoint
    store = DramStore(dtype)
    first = store.open_version("run-10", specs(dtype), TableSource(prefix))
    second = store.open_version("run-10", specs(dtype), TableSource(prefix))
    assert first.shared.segment.created and not second.shared.segment.created
    assert first.shared.segment.path == second.shared.segment.path
    assert segment_files(shm_worker) == [first.shared.segment.path.name]
    for vt in (first, second):  # the tables' arrays are views of the segment, not copies
        ev, plain = vt.tables["ev"], vt.tables["plain"]
        for arr in (ev.values, ev.index._keys, ev.index._slots, ev.freqs, ev.versions, plain.values):
            assert shares_memory(arr, vt.shared.segment)
            assert arr.ctypes.data % 64 == 0
        assert plain.index.identity
    info = second.describe()["shared_memory"]
    assert info["created_here"] is False and info["path"] == str(first.shared.segment.path)

    monkeypatch.setattr(shared_segments, "_active", None)  # the private path: one process
    private = DramStore(dtype).open_version("run-10", specs(dtype), TableSource(prefix))
    assert private.shared is None and "shared_memory" not in private.describe()
    expected = private.lookup(queries(tensors))
    for vt in (first, second):
        for got, want in zip(vt.lookup(queries(tensors)), expected):
            np.testing.assert_array_equal(got, want)
        keys = tensors["ev-keys"][:50]
        for got, want in zip(vt.tables["ev"].metadata(keys), private.tables["ev"].metadata(keys)):
            np.testing.assert_array_equal(got, want)
        if native_rows.AVAILABLE:  # the numpy reference over the same views agrees
            q = np.ascontiguousarray(queries(tensors)[0][1].reshape(-1))
            np.testing.assert_array_equal(vt.tables["ev"].lookup_reference(q)[0], expected[0].reshape(-1, DIM))


def test_a_delta_in_one_worker_leaves_the_other_and_growth_goes_private(shm_worker, checkpoint):
    prefix, tensors = checkpoint
    store = DramStore()
    first = store.open_version("run-10", specs("float32"), TableSource(prefix))
    second = store.open_version("run-10", specs("float32"), TableSource(prefix))
    q = queries(tensors)
    before = [r.copy() for r in second.lookup(q)]
    old_key = tensors["ev-keys"][:3]
    new_keys = np.array([10**12, 10**12 + 1], np.int64)  # grows the index and the values
    first.apply_delta({"ev": RowChunk(np.concatenate([old_key, new_keys]), np.full((5, DIM), 9.0, np.float32),
                                      np.full(5, 3), np.full(5, 4)),
                       "plain": RowChunk(np.array([1, 600]), np.full((2, 4), 7.0, np.float32))}, step=11)
    np.testing.assert_array_equal(first.lookup([("ev", np.concatenate([old_key, new_keys]))])[0], 9.0)
    np.testing.assert_array_equal(first.lookup([("plain", np.array([1, 600, 2]))])[0][:2], 7.0)
    assert not first.tables["plain"].index.identity  # key 600 broke the row pattern: private arrays now
    for got, want in zip(second.lookup(q), before):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(second.lookup([("ev", new_keys)])[0], 0.0)
    assert shares_memory(second.tables["ev"].values, second.shared.segment)
    assert not shares_memory(first.tables["ev"].values, first.shared.segment)  # grown: a private copy
    # a delta that only overwrites rows writes the worker's copy-on-write pages in place
    second.apply_delta({"ev": RowChunk(old_key, np.full((3, DIM), 5.0, np.float32))}, step=11)
    assert shares_memory(second.tables["ev"].values, second.shared.segment)
    np.testing.assert_array_equal(second.lookup([("ev", old_key)])[0], 5.0)
    np.testing.assert_array_equal(first.lookup([("ev", old_key)])[0], 9.0)
    path = first.shared.segment.path
    np.testing.assert_array_equal(np.frombuffer(path.read_bytes(), np.uint8)[:64],
                                  np.frombuffer(first.shared.segment.buffer, np.uint8)[:64])

    first.release()
    assert path.exists()  # the second still maps it
    second.release()
    second.release()  # idempotent
    assert not path.exists() and leftovers(shm_worker) == []


def test_names_differ_by_checkpoint_version_and_dtype(shm_worker, checkpoint, tmp_path):
    prefix, tensors = checkpoint
    other = str(tmp_path / "ckpt" / "model.ckpt-20")
    write_tensors(other, tensors)
    name = shared_tables.version_name
    base = name("dram", "run-10", specs("float32"), TableSource(prefix))
    assert base == name("dram", "run-10", specs("float32"), TableSource(prefix))
    assert len({base, name("dram", "run-10", specs("float16"), TableSource(prefix)),
                name("dram", "run-20", specs("float32"), TableSource(prefix)),
                name("dram", "run-10", specs("float32"), TableSource(other)),
                name("dram", "run-10", specs("float32"), TableSource(prefix, other, 20)),
                name("dram_ssd", "run-10", specs("float32"), TableSource(prefix))}) == 6
    assert name("dram", "run-10", specs("float32"), object()) is None  # a source that says nothing


def test_outside_a_worker_nothing_is_shared(checkpoint, monkeypatch):
    monkeypatch.setattr(shared_segments, "_active", None)
    prefix, _ = checkpoint
    assert shared_tables.version_name("dram", "run-10", specs("float32"), TableSource(prefix)) is None
    vt = DramStore().open_version("run-10", specs("float32"), TableSource(prefix))
    assert vt.shared is None and "shared_memory" not in vt.describe()


def test_a_full_shm_leaves_the_worker_its_own_copy(shm_worker, checkpoint, monkeypatch, caplog):
    prefix, tensors = checkpoint

    def full(name, tables):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shared_tables, "publish", full)
    vt = DramStore().open_version("run-10", specs("float32"), TableSource(prefix))
    assert vt.shared is None and "own copy" in vt.describe()["shared_memory"]
    assert "could not write the tables segment" in caplog.text
    np.testing.assert_array_equal(vt.lookup([("ev", tensors["ev-keys"][:4])])[0], tensors["ev-values"][:4])
    assert segment_files(shm_worker) == []


def tiered(root, dtype="float32") -> TieredStore:
    return TieredStore(str(root), dram_bytes=ROWS * DIM * 4 // 8, dtype=dtype)  # caches: 1/8 of the rows


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_dram_ssd_files_written_once_and_the_index_shared(shm_worker, checkpoint, tmp_path, monkeypatch, dtype):
    prefix, tensors = checkpoint
    store = tiered(tmp_path / "ssd", dtype)
    first = store.open_version("run-10", specs(dtype), TableSource(prefix))
    files = sorted(p for p in (tmp_path / "ssd").rglob("*.rows"))
    stamps = [(p.stat().st_ino, p.stat().st_mtime_ns) for p in files]
    second = tiered(tmp_path / "ssd", dtype).open_version("run-10", specs(dtype), TableSource(prefix))
    assert len(files) == 2 and [(p.stat().st_ino, p.stat().st_mtime_ns) for p in files] == stamps  # reused
    assert first.shared.segment.created and not second.shared.segment.created
    assert second.describe()["shared_memory"]["files"] == str(files[0].parent)
    for vt in (first, second):
        ev = vt.tables["ev"]
        for arr in (ev.index._keys, ev.index._slots, ev.freqs, ev.versions):
            assert shares_memory(arr, vt.shared.segment)
    assert not np.shares_memory(first.tables["ev"]._cache, second.tables["ev"]._cache)  # a cache per worker

    monkeypatch.setattr(shared_segments, "_active", None)
    private = tiered(tmp_path / "private", dtype).open_version("run-10", specs(dtype), TableSource(prefix))
    expected = private.lookup(queries(tensors))
    for _ in range(2):  # misses, then cache hits
        for vt in (first, second):
            for got, want in zip(vt.lookup(queries(tensors)), expected):
                np.testing.assert_array_equal(got, want)
    private.release()


def test_dram_ssd_delta_stays_in_its_worker_and_the_last_release_removes_the_files(shm_worker, checkpoint, tmp_path):
    prefix, tensors = checkpoint
    first = tiered(tmp_path / "ssd").open_version("run-10", specs("float32"), TableSource(prefix))
    second = tiered(tmp_path / "ssd").open_version("run-10", specs("float32"), TableSource(prefix))
    q = queries(tensors)
    before = [r.copy() for r in second.lookup(q)]
    files = sorted((tmp_path / "ssd").rglob("*.rows"))
    on_disk = [p.read_bytes() for p in files]
    keys = np.concatenate([tensors["ev-keys"][:3], np.arange(10**12, 10**12 + 40, dtype=np.int64)])
    first.apply_delta({"ev": RowChunk(keys, np.full((len(keys), DIM), 9.0, np.float32), np.full(len(keys), 3))},
                      step=11)
    np.testing.assert_array_equal(first.lookup([("ev", keys)])[0], 9.0)
    ev = first.tables["ev"]
    assert (ev.freqs[ev.index.find(keys)] == 3).all()
    for got, want in zip(second.lookup(q), before):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(second.lookup([("ev", keys)])[0][3:], 0.0)
    assert [p.read_bytes() for p in files] == on_disk  # the files never change
    assert first.describe()["tables"]["ev"]["bytes"]["dram_added_rows"] > 0

    directory = files[0].parent
    first.release()
    assert directory.exists() and second.shared.segment.path.exists()
    second.release()
    assert not directory.exists() and leftovers(shm_worker) == []
    tiered(tmp_path / "ssd").close()  # a worker's close leaves what others may use; here nothing is left
    assert not (tmp_path / "ssd").exists()


def test_a_waiter_on_a_removed_lock_file_takes_a_new_one(shm_worker):
    import threading
    import time

    lock = shared_tables._build_lock("dram-tables-x")
    inside: list[bool] = []

    def wait_then_build() -> None:
        with shared_tables.building("dram-tables-x"):
            inside.append(lock.exists())

    with shared_tables.building("dram-tables-x"):
        waiter = threading.Thread(target=wait_then_build)
        waiter.start()
        time.sleep(0.2)  # the waiter has opened the file and waits for the lock
        lock.unlink()  # as the last release does
    waiter.join(10)
    assert inside == [True]  # it locked the file now at the path, not the removed one
