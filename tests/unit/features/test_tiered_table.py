"""DRAM+SSD table: a table 4x larger than its DRAM cache serves exact rows; hot rows stay cached."""

import numpy as np

from processor.features.rows import RowChunk, TableSpec
from processor.features.tiered_store import TieredStore, TieredTable


def test_four_times_over_budget_serves_correct_rows(tmp_path):
    rows, dim = 20_000, 16
    rng = np.random.default_rng(1)
    keys = rng.permutation(10 * rows)[:rows].astype(np.int64) - 5 * rows
    values = rng.standard_normal((rows, dim)).astype(np.float32)
    cache_rows = rows // 4
    table = TieredTable(TableSpec("t", dim, "raw"), str(tmp_path / "t.rows"), cache_rows, rows)
    for start in range(0, rows, 4096):
        table.upsert(RowChunk(keys[start:start + 4096], values[start:start + 4096]))
    assert table.nbytes()["dram_cache"] < 0.3 * values.nbytes
    expected = dict(zip(keys.tolist(), range(rows)))
    for _ in range(30):
        batch = rng.choice(keys, 4096)
        got = table.lookup(batch)
        np.testing.assert_array_equal(got, values[[expected[k] for k in batch.tolist()]])
    # Unknown ids: default vector; the cache never holds more than its budget.
    np.testing.assert_array_equal(table.lookup(np.array([10**15])), np.zeros((1, dim)))
    assert (table._cache_row >= 0).sum() <= cache_rows
    assert table.stats.extra["ssd_reads"] > 0 and table.stats.extra["cache_hits"] > 0
    table.close()
    assert not (tmp_path / "t.rows").exists()


def test_hot_rows_stay_in_dram_and_upserts_write_through(tmp_path):
    dim = 8
    table = TieredTable(TableSpec("t", dim), str(tmp_path / "t.rows"), cache_rows=100)
    keys = np.arange(1000, dtype=np.int64)
    table.upsert(RowChunk(keys, np.repeat(keys[:, None], dim, 1).astype(np.float32)))
    hot = np.arange(50)
    rng = np.random.default_rng(2)
    for _ in range(40):
        table.lookup(hot)
        table.lookup(rng.integers(100, 1000, 30))
    before = table.stats.extra["ssd_reads"]
    table.lookup(hot)
    assert table.stats.extra["ssd_reads"] - before <= 5  # the hot set survives the scans
    table.upsert(RowChunk(np.array([3, 5000]), np.full((2, dim), -1, np.float32)))
    np.testing.assert_array_equal(table.lookup(np.array([3, 5000, 4])),
                                  [[-1] * dim, [-1] * dim, [4] * dim])
    table.close()


def test_store_splits_the_dram_budget_and_enforces_the_ssd_limit(tmp_path):
    from processor.errors import ConfigError
    import pytest

    class Source:
        def row_count(self, specs):
            return 300

        def rows(self, specs, chunk_rows=0):
            yield "a", RowChunk(np.arange(100), np.ones((100, 4), np.float32))
            yield "b", RowChunk(np.arange(200), np.ones((200, 8), np.float32))

    specs = {"a": TableSpec("a", 4, rows=100), "b": TableSpec("b", 8, rows=200)}
    store = TieredStore(str(tmp_path / "ssd"), dram_bytes=1000)
    vt = store.open_version("v1", specs, Source())
    caches = {n: t.cache_rows for n, t in vt.tables.items()}
    assert caches["a"] * 16 + caches["b"] * 32 <= 1000
    np.testing.assert_array_equal(vt.lookup([("b", np.array([199, 200]))])[0], [[1] * 8, [0] * 8])
    vt.release()
    with pytest.raises(ConfigError, match="SSD"):
        TieredStore(str(tmp_path / "ssd2"), 1000, ssd_bytes=100).open_version("v1", specs, Source())
    store.close()
