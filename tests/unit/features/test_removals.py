"""Removed ids in the in-process stores (issue 45): the index against a dict through inserts and
removals (Python and native probes), freed rows taken by later inserts (the arrays do not grow
under churn), the DRAM+SSD tier's cache and file, and expiry (``row_ttl_steps``)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from processor.features import native_rows
from processor.features.dram_store import DramTable, LocalVersionTables
from processor.features.hash_index import HashIndex
from processor.features.rows import RowChunk, TableSpec
from processor.features.store_metrics import StoreMetrics
from processor.features.tiered_store import BLOCK, TieredTable


@pytest.mark.parametrize("native", [False, True], ids=["numpy", "native"])
@pytest.mark.parametrize("wide", [False, True], ids=["int32 slots", "int64 slots"])
def test_index_against_a_dict_through_inserts_and_removals(wide, native, monkeypatch):
    """The index's own inserts and probes in numpy (the reference) and in native code."""
    if native and not native_rows.LOCATE:
        pytest.skip("processor._native is not built (or predates removals)")
    monkeypatch.setattr(native_rows, "LOCATE", native)
    rng = np.random.default_rng(3)
    index = HashIndex()
    if wide:  # tables past 2**31 rows use int64 slots: the same probe
        index.insert_new(np.array([-1], np.int64))
        index._slots = index._slots.astype(np.int64)
        index.remove(np.array([-1]))
    reference: dict[int, int] = {}
    for _ in range(25):
        keys = np.concatenate([rng.integers(-2**62, 2**62, 1500), rng.integers(0, 3000, 1500)])
        rows, _ = index.upsert(keys)
        for k, r in zip(keys.tolist(), rows.tolist()):
            assert reference.setdefault(k, r) == r
        gone = np.concatenate([rng.choice(np.array(list(reference)), 1800), rng.integers(0, 3000, 300)])
        freed = index.remove(gone)
        assert freed.tolist() == sorted({reference.pop(k) for k in set(gone.tolist()) if k in reference})
        assert index.count == len(reference) and sorted(index.keys().tolist()) == sorted(reference)
        queries = np.concatenate([np.array(list(reference), np.int64), gone, rng.integers(-2**62, 2**62, 500)])
        want = np.array([reference.get(k, -1) for k in queries.tolist()])
        np.testing.assert_array_equal(index.find(queries), want)
        if native_rows.AVAILABLE:  # the native probes pass over removed keys' slots too
            np.testing.assert_array_equal(native_rows.find_rows(index, queries), want)
        if native:  # and find the same slots as the reference
            for got, ref in zip(native_rows.find_slots(index, queries), index._probe(queries)):
                np.testing.assert_array_equal(got, ref)
    assert index.size <= 2 * len(reference) + 3000  # freed rows were taken again


def test_removing_from_the_rows_of_a_plain_variable_builds_the_index():
    index = HashIndex()
    index.insert_new(np.arange(100, dtype=np.int64))
    assert index.identity and index.remove(np.array([100, -1])).tolist() == [] and index.identity
    assert index.remove(np.array([5, 5, 7])).tolist() == [5, 7] and not index.identity
    np.testing.assert_array_equal(index.find(np.array([4, 5, 7, 8])), [4, -1, -1, 8])
    assert index.insert_new(np.array([1000, 1001, 1002])).tolist() == [5, 7, 100]  # freed rows first


def test_a_dram_table_under_churn_keeps_its_size_and_serves_removed_ids_the_default():
    spec = TableSpec("t", 8, "raw", default=tuple(range(8)))
    table = DramTable(spec)
    rng = np.random.default_rng(0)
    held = rng.choice(2**40, 10_000, replace=False).astype(np.int64)
    table.upsert(RowChunk(held, rng.standard_normal((len(held), 8)).astype(np.float32),
                          versions=np.ones(len(held), np.int64)))
    grown_at = (len(table.values), table.index.nbytes)
    for _ in range(30):  # each round: remove 1%, add 1% new ids
        gone = rng.choice(held, 100, replace=False)
        new = rng.integers(2**41, 2**42, 100)
        assert table.remove(gone) == 100
        table.upsert(RowChunk(new, np.zeros((100, 8), np.float32)))
        held = np.concatenate([np.setdiff1d(held, gone), new])
        np.testing.assert_array_equal(table.lookup(gone), np.tile(spec.default_vector(), (100, 1)))
        _, versions = table.metadata(new)
        assert (versions == 0).all()  # a freed row's metadata does not leak to the id taking it
    assert (len(table.values), table.index.nbytes) == grown_at and table.size == len(held)
    np.testing.assert_array_equal(table.held_ids(), np.sort(held))


def test_version_tables_remove_first_then_write_and_count(tmp_path):
    spec = TableSpec("t", 2, "raw")
    metrics = StoreMetrics("dram")
    vt = LocalVersionTables("dram", "v", {"t": spec}, {"t": DramTable(spec)}, metrics)
    vt.apply_delta({"t": RowChunk(np.array([1, 2, 3]), np.ones((3, 2), np.float32))}, 1)
    # a delta removing 2 and 3 and writing 3 again: 3 is held, with the delta's row
    vt.apply_delta({"t": RowChunk(np.array([3]), np.full((1, 2), 5, np.float32))}, 2,
                   removed={"t": np.array([2, 3, 99])})
    np.testing.assert_array_equal(vt.held_ids("t"), [1, 3])
    np.testing.assert_array_equal(vt.lookup([("t", np.array([2, 3]))])[0], [[0, 0], [5, 5]])
    assert metrics.snapshot()["tables"]["t"]["removed"] == 2  # the ids it held


def test_expiry_drops_rows_not_updated_for_row_ttl_steps():
    """``expire_before`` (what ``row_ttl_steps`` gives a delta of step S: S - ttl): rows whose
    version is below it go, as removed ones; a row the delta writes without a version takes its
    step."""
    spec = TableSpec("t", 2, "raw")
    metrics = StoreMetrics("dram")
    vt = LocalVersionTables("dram", "v", {"t": spec}, {"t": DramTable(spec)}, metrics)
    vt.apply_delta({"t": RowChunk(np.array([1, 2, 3, 4]), np.ones((4, 2), np.float32),
                                  versions=np.array([10, 20, 30, 40]))}, 40)
    vt.apply_delta({"t": RowChunk(np.array([1]), np.ones((1, 2), np.float32))}, 50, expire_before=50 - 25)
    np.testing.assert_array_equal(vt.held_ids("t"), [1, 3, 4])  # 2 (step 20) is 30 steps old; 1 was updated
    assert metrics.snapshot()["tables"]["t"]["expired"] == 1


def test_dram_ssd_removal_leaves_the_cache_reuses_rows_and_gives_blocks_back(tmp_path):
    spec = TableSpec("t", 64, "raw")  # 256-byte rows: 16 a block
    table = TieredTable(spec, str(tmp_path / "t.rows"), cache_rows=64, capacity=4096)
    try:
        keys = np.arange(4096, dtype=np.int64) * 3
        table.upsert(RowChunk(keys, np.ones((4096, 64), np.float32)))
        table.lookup(keys[:64])  # cached
        allocated = table.nbytes()["ssd_allocated"]
        assert table.remove(keys[:2048]) == 2048
        np.testing.assert_array_equal(table.lookup(keys[:64]), np.zeros((64, 64)))  # not from the cache
        table.wait_reclaimed()
        if table.reclaim_off is not None:
            pytest.skip(f"this file system gives no blocks back: {table.reclaim_off}")
        freed_blocks = 2048 * 256 // BLOCK
        assert allocated - table.nbytes()["ssd_allocated"] >= freed_blocks * BLOCK * 0.9
        file_size = os.path.getsize(tmp_path / "t.rows")
        table.upsert(RowChunk(keys[:1000] + 1, np.full((1000, 64), 2, np.float32)))  # freed rows taken again
        assert os.path.getsize(tmp_path / "t.rows") == file_size and table.size == 3048
        np.testing.assert_array_equal(table.lookup(keys[:1000] + 1), np.full((1000, 64), 2))
        np.testing.assert_array_equal(table.lookup(keys[2048:2100]), np.ones((52, 64)))
    finally:
        table.close()
