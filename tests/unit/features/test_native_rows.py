"""The native store parts (processor._native: find_rows, TableSet, CacheSet, RowCache) against the Python
reference: HashIndex.find, DramTable.lookup_reference and a dict; float16 storage and its limits."""

from __future__ import annotations

import numpy as np
import pytest

from processor.errors import ConfigError
from processor.features import native_rows
from processor.features.dram_store import DramTable, LocalVersionTables
from processor.features.hash_index import HashIndex
from processor.features.row_cache import HotRowCache
from processor.features.rows import Narrowing, RowChunk, TableSpec, to_storage

pytestmark = pytest.mark.skipif(not native_rows.AVAILABLE, reason="processor._native is not built")


def _queries(rng, keys: np.ndarray, n: int) -> np.ndarray:
    q = keys[rng.integers(0, len(keys), n)]
    unknown = rng.random(n) < 0.2
    q[unknown] = rng.integers(-2**63, 2**63 - 1, int(unknown.sum()), dtype=np.int64)
    return q


@pytest.mark.parametrize("seed", range(4))
def test_find_rows_equals_the_reference(seed):
    rng = np.random.default_rng(seed)
    index = HashIndex()
    keys = np.unique(rng.integers(-2**63, 2**63 - 1, 5000 + seed * 3000, dtype=np.int64))
    index.insert_new(keys)
    q = _queries(rng, keys, 7000)
    want = index.find(q)
    np.testing.assert_array_equal(native_rows.find_rows(index, q), want)
    wide = HashIndex()  # int64 slots (tables past 2**31 rows): the same probe
    wide.insert_new(keys)
    wide._slots = wide._slots.astype(np.int64)
    np.testing.assert_array_equal(native_rows.find_rows(wide, q), want)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("identity", [True, False])
def test_lookup_rows_equals_the_reference(dtype, identity):
    rng = np.random.default_rng(7)
    spec = TableSpec("t", 12, "row" if identity else "raw", 3000, default=tuple(np.linspace(-1, 1, 12)), dtype=dtype)
    table = DramTable(spec, 3000)
    keys = np.arange(3000, dtype=np.int64) if identity else rng.choice(2**50, 3000, replace=False).astype(np.int64)
    table.upsert(RowChunk(keys, rng.standard_normal((3000, 12)).astype(np.float32)))
    assert table.index.identity == identity
    for n in (0, 1, 4096):
        q = _queries(rng, keys, n)
        if identity and n > 3:
            q[:3] = [-1, 3000, 2999]
        got, misses = native_rows.lookup_rows(table.index, table.values, table.default, q)
        want, want_misses = table.lookup_reference(q)
        assert got.dtype == np.float32 and misses == want_misses
        np.testing.assert_array_equal(got, want)  # the same widening of the same stored bits


def test_a_table_set_equals_each_tables_reference():
    """Several tables in one call (what a request's lookups take): identity and hashed keys,
    float32 and float16 rows, int64 slots, an empty table, an empty request."""
    rng = np.random.default_rng(11)
    tables, asked = [], []
    for i, (dtype, identity, n) in enumerate([("float32", True, 500), ("float16", False, 800),
                                              ("float32", False, 300), ("float32", False, 0)]):
        spec = TableSpec(f"t{i}", 4 + i, "row" if identity else "raw", n, dtype=dtype,
                         default=tuple(float(d) for d in range(4 + i)))
        table = DramTable(spec, n)
        keys = np.arange(n, dtype=np.int64) if identity else rng.choice(2**40, n, replace=False).astype(np.int64)
        if n:
            table.upsert(RowChunk(keys, rng.standard_normal((n, 4 + i)).astype(np.float32)))
        if i == 2:
            table.index._slots = table.index._slots.astype(np.int64)  # tables past 2**31 rows
        tables.append(table)
        asked.append((table, _queries(rng, keys, 257) if n else np.array([1, 2], np.int64)))
    asked.append((tables[0], np.empty(0, np.int64)))
    found, counts = native_rows.table_set([t for t, _ in asked]).lookup([q for _, q in asked])
    for (table, q), rows, misses in zip(asked, found, counts[2].tolist()):
        want, want_misses = table.lookup_reference(q)
        assert rows.dtype == np.float32 and misses == want_misses
        np.testing.assert_array_equal(rows, want)


def test_a_table_sets_rows_are_aligned_views_for_keys_of_any_shape():
    """TensorFlow feeds 64-byte-aligned arrays without a copy: every table's block starts on 64
    bytes, whatever the sizes before it; rows come in the keys' shape + [dim]."""
    tables = []
    for i, dim in enumerate((3, 16, 5)):
        table = DramTable(TableSpec(f"t{i}", dim, "row", 10), 10)
        table.upsert(RowChunk(np.arange(10, dtype=np.int64), np.full((10, dim), float(i), np.float32)))
        tables.append(table)
    keys = [np.array([[1, 2, 3], [4, 5, 99]], np.int64), np.arange(7, dtype=np.int64), np.array([0], np.int64)]
    rows, counts = native_rows.table_set(tables).lookup(keys)
    assert [r.shape for r in rows] == [(2, 3, 3), (7, 16), (1, 5)]
    assert counts.tolist() == [[1, 1, 1], [6, 7, 1], [1, 0, 0]]  # lookups, ids, default vectors
    converted, _ = native_rows.table_set(tables).lookup([k.astype(np.int32) for k in keys])  # converted
    for a, b in zip(rows, converted):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="one key array per table"):
        native_rows.table_set(tables).lookup(keys[:2])
    most = 64 if np.lib.NumpyVersion(np.__version__) >= "2.0.0" else 32  # numpy's NPY_MAXDIMS
    deepest = np.zeros((1,) * most, np.int64)  # no room left for the rows' dim
    with pytest.raises(ValueError, match="too many dimensions"):
        native_rows.table_set(tables[:1]).lookup([deepest])
    assert all(r.ctypes.data % 64 == 0 for r in rows)
    for table, q, got in zip(tables, keys, rows):
        np.testing.assert_array_equal(got.reshape(-1, table.spec.dim), table.lookup_reference(q.reshape(-1))[0])


def test_version_tables_see_a_delta_that_grows_a_table():
    """The version's cached TableSet holds the arrays it was built from: a delta adding keys (the
    values array grows, the index leaves identity mode) must be seen by the next lookup."""
    spec = TableSpec("t", 4, "raw", 4)
    table = DramTable(spec, 4)
    table.upsert(RowChunk(np.arange(4, dtype=np.int64), np.ones((4, 4), np.float32)))
    tables = LocalVersionTables("dram", "v1", {"t": spec}, {"t": table})
    assert tables.lookup([("t", np.array([3, 1000], np.int64))])[0][:, 0].tolist() == [1.0, 0.0]
    tables.apply_delta({"t": RowChunk(np.arange(1000, 1100, dtype=np.int64), np.full((100, 4), 7.0, np.float32))}, 1)
    assert not table.index.identity and len(table.values) >= 104
    assert tables.lookup([("t", np.array([3, 1000], np.int64))])[0][:, 0].tolist() == [1.0, 7.0]


def test_an_empty_table_serves_the_default_vector():
    table = DramTable(TableSpec("t", 4, "raw", default=(1.0, 2.0, 3.0, 4.0)))
    rows, misses, _, _ = table.lookup_counted(np.array([5, 6], np.int64))
    assert misses == 2 and rows.tolist() == [[1, 2, 3, 4]] * 2


def test_row_cache_against_a_dict():
    """Room for every id (no eviction): the cache must hold exactly what a dict holds."""
    rng = np.random.default_rng(3)
    cache = native_rows.row_cache(256, 3)
    model: dict[int, np.ndarray] = {}
    for step in range(300):
        ids = np.unique(rng.integers(0, 200, rng.integers(1, 40))).astype(np.int64)
        rows = rng.standard_normal((len(ids), 3)).astype(np.float32)
        if step % 3 == 0:
            cache.insert(ids, rows)
            model.update({int(k): r for k, r in zip(ids.tolist(), rows)})
        elif step % 3 == 1:
            present = [i for i, k in enumerate(ids.tolist()) if k in model]
            assert cache.update(ids, rows) == len(present)
            model.update({int(ids[i]): rows[i] for i in present})
        else:
            gone = ids[: len(ids) // 2]
            assert cache.erase(gone) == sum(int(k) in model for k in gone)
            for k in gone.tolist():
                model.pop(k, None)
        probe = np.arange(200, dtype=np.int64)
        out = np.zeros((200, 3), np.float32)
        miss = np.empty(200, np.int64)
        n = cache.lookup(probe, out, miss)
        assert sorted(set(range(200)) - set(miss[:n].tolist())) == sorted(model)
        for k, row in model.items():
            np.testing.assert_array_equal(out[k], row)
        assert cache.size == len(model) == len(cache.hot_keys(1000))


def test_row_cache_keeps_hot_ids_under_skew():
    rng = np.random.default_rng(5)
    cache = native_rows.row_cache(1000, 2)
    hits = looked = 0
    for _ in range(300):
        ids = np.unique(np.minimum(rng.zipf(1.1, 512), 10**6)).astype(np.int64)
        out = np.empty((len(ids), 2), np.float32)
        miss = np.empty(len(ids), np.int64)
        n = cache.lookup(ids, out, miss)
        cache.insert(ids[miss[:n]], np.zeros((n, 2), np.float32))
        hits += len(ids) - n
        looked += len(ids)
    assert hits / looked > 0.25 and cache.size == 1000 and cache.evictions > 0
    hot = np.arange(1, 11, dtype=np.int64)  # the ten hottest ids stay cached
    assert cache.lookup(hot, np.empty((10, 2), np.float32), np.empty(10, np.int64)) == 0


def test_hot_row_cache_sizes_tables_from_the_byte_budget():
    specs = {"a": TableSpec("a", 8, rows=10**6), "b": TableSpec("b", 8, rows=100)}
    cache = HotRowCache(specs, 1 << 20)
    assert cache.capacity_rows("b") == 100  # never more rows than the table has
    assert (1 << 20) // (4 * 8 + 18) - 101 <= cache.capacity_rows("a") <= (1 << 20) // (4 * 8 + 18)
    assert cache.describe()["allocated_bytes"] <= 1 << 20
    assert HotRowCache.reason_off(0).startswith("off")


def test_float16_storage_measures_its_cost_and_refuses_overflow():
    spec = TableSpec("emb/x", 2, dtype="float16")
    narrowing = Narrowing()
    values = np.array([[0.1, -3.0], [1000.25, 1e-8]], np.float32)
    half = to_storage(spec, values, narrowing)
    assert half.dtype == np.float16 and narrowing.bytes_saved == 2 * 2 * 2
    assert narrowing.max_abs_diff == pytest.approx(np.abs(half.astype(np.float32) - values).max())
    table = DramTable(spec)
    with pytest.raises(ConfigError, match="embedding_dtype.*emb/x.*70000"):
        table.upsert(RowChunk(np.array([1], np.int64), np.array([[70000.0, 0.0]], np.float32)))
    assert table.size == 0  # refused whole


def test_hot_row_cache_looks_several_tables_up_in_one_call():
    specs = {"a": TableSpec("a", 3, "raw", 100), "b": TableSpec("b", 2, "raw", 50),
             "uncached": TableSpec("uncached", 300_000, "raw", 10)}  # a row is over the budget: no cache
    cache = HotRowCache(specs, 1 << 20)
    rows_a = np.arange(30, dtype=np.float32).reshape(10, 3)
    cache.insert("a", np.arange(10, dtype=np.int64), rows_a)
    cache.insert("b", np.array([7], np.int64), np.array([[1.5, 2.5]], np.float32))
    ids_a = np.array([3, 42, 3, 9, -1], np.int64)  # repeats and unknown ids
    ids_b = np.array([8, 7], np.int64)
    (out_a, out_b, _), (miss_a, miss_b, miss_c) = cache.lookup_many(("a", "b", "uncached"), [ids_a, ids_b, ids_b])
    assert miss_a.tolist() == [1, 4] and miss_b.tolist() == [0] and miss_c.tolist() == [0, 1]
    assert out_a.shape == (5, 3) and out_b.shape == (2, 2)
    np.testing.assert_array_equal(out_a[[0, 2, 3]], rows_a[[3, 3, 9]])
    np.testing.assert_array_equal(out_b[1], [1.5, 2.5])
