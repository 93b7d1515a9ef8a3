"""HashIndex and DramTable: EmbeddingVariable semantics on numpy arrays, checked against a dict."""

import numpy as np
import pytest

from processor.features.dram_store import DramTable
from processor.features.rows import RowChunk, TableSpec
from processor.features.hash_index import HashIndex


def test_index_matches_a_dict_through_growth_and_collisions():
    rng = np.random.default_rng(0)
    index = HashIndex()
    reference: dict[int, int] = {}
    for _ in range(20):
        keys = rng.integers(-2**63, 2**63 - 1, 3000, dtype=np.int64)
        keys[:500] = rng.integers(0, 2000, 500)  # repeats across and inside batches
        before = index.size
        rows, new = index.upsert(keys)
        for k, r in zip(keys.tolist(), rows.tolist()):
            assert reference.setdefault(k, r) == r
        assert index.size - before == new
    assert index.size == len(reference)
    absent = [k for k in (-3, 7_777_777_777, 2**63 - 1) if k not in reference]
    found = index.find(np.array(list(reference) + absent, np.int64))
    assert found[: len(reference)].tolist() == list(reference.values())
    assert (found[len(reference):] == -1).all()


def test_index_overhead_is_under_16_bytes_per_key():
    index = HashIndex(1_000_000)
    index.insert_new(np.arange(1_000_000, dtype=np.int64) * 7919)
    assert index.nbytes / index.size <= 16.0
    assert (index.find(np.array([7919 * 5, 3])) == [5, -1]).all()


def test_dram_table_serves_rows_default_vector_and_metadata():
    spec = TableSpec("t", 4, "raw", default=(1.0, 2.0, 3.0, 4.0))
    table = DramTable(spec, capacity=2)
    keys = np.array([10, -5, 2**62], np.int64)
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert table.upsert(RowChunk(keys, values, freqs=np.array([3, 1, 2**40]), versions=np.array([7, 8, 9]))) == 3
    got = table.lookup(np.array([-5, 99, 10, 2**62], np.int64))
    np.testing.assert_array_equal(got, [values[1], spec.default_vector(), values[0], values[2]])
    assert table.stats.default_served == 1
    # An upsert overwrites known ids and adds new ones (the table grows).
    table.upsert(RowChunk(np.array([99, 10], np.int64), np.full((2, 4), 5, np.float32), np.array([1, 4])))
    np.testing.assert_array_equal(table.lookup(np.array([99, 10])), np.full((2, 4), 5))
    freqs, versions = table.metadata(np.array([10, 2**62, 12345]))
    assert freqs.tolist() == [4, 2**32 - 1, -1] and versions.tolist() == [7, 9, -1]


def test_empty_table_and_bad_rows():
    table = DramTable(TableSpec("t", 3))
    np.testing.assert_array_equal(table.lookup(np.array([1, 2])), np.zeros((2, 3)))
    with pytest.raises(ValueError, match="expected"):
        table.upsert(RowChunk(np.array([1]), np.zeros((1, 4), np.float32)))


def test_identity_mode_for_the_rows_of_a_plain_variable():
    index = HashIndex(1000)
    for start in range(0, 1000, 300):
        index.upsert(np.arange(start, min(start + 300, 1000)))
    assert index.identity and index.nbytes == 0
    assert index.find(np.array([0, 999, 1000, -1])).tolist() == [0, 999, -1, -1]
    rows, new = index.upsert(np.array([5, -7, 2000]))  # ids outside 0..n-1: the arrays are built
    assert new == 2 and not index.identity and rows.tolist() == [5, 1000, 1001]
    assert index.find(np.array([999, -7, 2000, 3000])).tolist() == [999, 1000, 1001, -1]
