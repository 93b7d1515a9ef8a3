"""RedisStore against real redis-server processes on 127.0.0.1 (one node and a 3-node cluster)."""

import threading

import numpy as np
import pytest

from processor.errors import Unavailable
from processor.features import native_rows
from processor.features.rows import RowChunk, TableSpec
from processor.features.redis_client import RedisNodes
from processor.features.redis_store import RedisStore
from processor.features.redis_url import parse_redis_url
from tools.local_redis import LocalRedis, LocalRedisCluster, redis_server_binary
from sp_checks import wait_for

pytestmark = pytest.mark.skipif(redis_server_binary() is None,
                                reason="redis-server is not installed (scripts/setup.sh installs it)")

SPECS = {"emb/a": TableSpec("emb/a", 8, "raw", 3000), "emb/b": TableSpec("emb/b", 3, "row", 500)}


class Source:
    """A TableSource stand-in: deterministic rows per table."""

    def __init__(self, delta_step=-1, scale=1.0):
        self.full_prefix, self.delta_prefix, self.delta_step = "mem://full", "", delta_step
        self.scale = scale

    @staticmethod
    def keys(name):
        return np.arange(-1500, 1500, dtype=np.int64) * 7 if name == "emb/a" else np.arange(500, dtype=np.int64)

    def values(self, name, keys):
        dim = SPECS[name].dim
        return (keys[:, None] * 0.5 + np.arange(dim) * self.scale).astype(np.float32)

    def row_count(self, specs):
        return 3500

    def rows(self, specs, chunk_rows=1000):
        for name in specs:
            keys = self.keys(name)
            for s in range(0, len(keys), 700):
                yield name, RowChunk(keys[s:s + 700], self.values(name, keys[s:s + 700]))


def make_store(url, cluster, name="m", **kw):
    nodes = RedisNodes(parse_redis_url(url, cluster=cluster), None, 2, 2, cluster, socket_timeout=1.0)
    store = RedisStore("cluster_redis" if cluster else "redis", nodes, name, lock_timeout=30, write_threads=2, **kw)
    nodes.refresh()
    return store


@pytest.fixture(scope="module", params=["redis", "cluster_redis"])
def server(request):
    made = LocalRedis() if request.param == "redis" else LocalRedisCluster(3)
    yield request.param == "cluster_redis", made
    made.close()


def test_one_replica_loads_both_serve_and_a_delta_is_written_once(server):
    cluster, redis = server
    a, b = make_store(redis.url, cluster, "share"), make_store(redis.url, cluster, "share")
    src = Source()
    va = a.open_version("run_1-10", SPECS, src)
    vb = b.open_version("run_1-10", SPECS, src)
    assert va.loaded_by == "this replica" and vb.loaded_by == "another replica"
    assert a.writes_of("run_1-10") == 1
    probe = np.array([7, -1500 * 7, 3, 123456789], np.int64)
    for vt in (va, vb):
        got_a, got_b = vt.lookup([("emb/a", probe), ("emb/b", np.array([[1, 499], [499, 600]]).reshape(-1))])
        want = src.values("emb/a", probe)
        want[2:] = 0  # unseen ids: the default vector
        np.testing.assert_array_equal(got_a, want)
        np.testing.assert_array_equal(got_b, np.concatenate([src.values("emb/b", np.array([1, 499, 499])),
                                                             np.zeros((1, 3))]))
    rows = {"emb/a": RowChunk(np.array([7, 10**12], np.int64), np.full((2, 8), 9, np.float32))}
    threads = [threading.Thread(target=vt.stage_delta, args=(rows, 15)) for vt in (va, vb)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert a.writes_of("run_1-10", "15") == 1
    # The replica that wrote the delta serves the old rows until the delta is applied (update gate).
    writer = va if va._pinned is not None else vb
    np.testing.assert_array_equal(writer.lookup([("emb/a", np.array([10**12, 7]))])[0],
                                  np.concatenate([np.zeros((1, 8)), src.values("emb/a", np.array([7]))]))
    for vt in (va, vb):
        vt.apply_delta(rows, 15)
        np.testing.assert_array_equal(vt.lookup([("emb/a", np.array([10**12, 7]))])[0], np.full((2, 8), 9))
    assert va.stats.default_served == 3 + (va is writer)  # 10**12 was absent before the delta
    a.close()
    b.close()


@pytest.mark.skipif(not native_rows.AVAILABLE, reason="processor._native is not built (the cache is native)")
def test_cached_lookups_with_repeated_and_absent_ids_equal_uncached_ones(server):
    """The hot-row cache looks ids up as they come (repeats included) and fetches the distinct
    rest: rows, default vectors and counts equal the uncached store's, and hits + misses count
    every id asked."""
    cluster, redis = server
    plain, cached = make_store(redis.url, cluster, "cache"), make_store(redis.url, cluster, "cache", cache_bytes=1 << 20)
    src = Source()
    vp, vc = (store.open_version("run_1-10", SPECS, src) for store in (plain, cached))
    rng = np.random.default_rng(5)
    known = src.keys("emb/a")
    asked = 0
    for round_ in range(4):  # the cache warms from nothing to mostly hits
        ids = np.concatenate([rng.choice(known[:20], 40), np.array([123456789, 123456789, known[0], known[0]])])
        rows_b = rng.integers(480, 520, 16)  # 500..519 are absent from emb/b
        want = vp.lookup([("emb/a", ids), ("emb/b", rows_b)])
        got = vc.lookup([("emb/a", ids), ("emb/b", rows_b)])
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
        asked += len(ids) + len(rows_b)
    assert vc.stats.default_served == vp.stats.default_served > 0
    extra = vc.stats.extra
    assert extra["cache_hits"] + extra["cache_misses"] == asked and extra["cache_hits"] > extra["cache_misses"]
    plain.close()
    cached.close()


def test_a_new_version_loads_beside_and_old_ones_are_dropped(server):
    cluster, redis = server
    store = make_store(redis.url, cluster, "versions")
    v1 = store.open_version("r-1", SPECS, Source(scale=1.0))
    v2 = store.open_version("r-2", SPECS, Source(scale=2.0))
    keys = np.array([14], np.int64)
    # Both versions serve side by side, each its own rows.
    assert v1.lookup([("emb/a", keys)])[0][0, 1] == 1.0 + 7.0 and v2.lookup([("emb/a", keys)])[0][0, 1] == 2.0 + 7.0
    store.open_version("r-3", SPECS, Source(scale=3.0))  # keeps the active (r-2) and r-3, drops r-1
    with pytest.raises(Unavailable, match="refilling"):
        v1.lookup([("emb/a", keys)])
    store.close()


def test_lock_is_exclusive_and_released_by_its_owner_only(server):
    cluster, redis = server
    store = make_store(redis.url, cluster, "lock")
    token = store._try_lock("v")
    assert token and store._try_lock("v") is None
    store._unlock("v", "not-the-owner")
    assert store._try_lock("v") is None
    store._unlock("v", token)
    again = store._try_lock("v")
    assert again
    store._unlock("v", again)
    store.close()


def test_outage_fails_fast_then_refills_an_empty_redis(tmp_path):
    redis = LocalRedis()
    try:
        store = make_store(redis.url, False, "outage", probe_seconds=0.1)
        src = Source()
        vt = store.open_version("r-1", SPECS, src)
        keys = np.array([7, 14], np.int64)
        want = src.values("emb/a", keys)
        np.testing.assert_array_equal(vt.lookup([("emb/a", keys)])[0], want)
        redis.stop()
        with pytest.raises(Unavailable):
            vt.lookup([("emb/a", keys)])  # finds the outage: the store is down from here on
        assert store.state == "down"
        # Down: lookups fail at once, without touching the network (no command is sent to the
        # nodes from this thread; the probe thread pings on its own).
        sent = []
        execute = store.nodes.execute

        def counted(commands, write=False):
            if threading.current_thread() is threading.main_thread():
                sent.append(commands)
            return execute(commands, write=write)

        store.nodes.execute = counted
        failed_fast = store.counters["failed_fast"]
        for _ in range(50):
            with pytest.raises(Unavailable, match="requests fail until it is back"):
                vt.lookup([("emb/a", keys)])
        store.nodes.execute = execute
        assert sent == [] and store.counters["failed_fast"] - failed_fast == 50
        redis.start()  # back, and empty
        assert wait_for(lambda: store.state == "up", timeout=20), store.last_error
        assert store.counters["refills"] == 1
        np.testing.assert_array_equal(vt.lookup([("emb/a", keys)])[0], want)
        store.close()
    finally:
        redis.close()


def test_reads_and_writes_follow_a_slot_migration():
    """A partition's slot migrates to another node: while it migrates (its key moved already, so
    the old owner answers ASK) and after (MOVED), lookups and a delta's writes reach the row."""
    cluster = LocalRedisCluster(3)
    try:
        store = make_store(cluster.url, True, "migrate")
        src = Source()
        vt = store.open_version("r-1", SPECS, src)
        keys = src.keys("emb/a")[:300]  # spread over every partition: most commands are not redirected
        part = int(store.layout.partition_of(vt.tids["emb/a"], keys[:1])[0])
        slot, key = str(int(vt.slots[part])), vt.keys[part].decode()
        owner = next(s for s in cluster.servers if s.cli("cluster", "countkeysinslot", slot).strip() == "1")
        target = next(s for s in cluster.servers if s is not owner)
        owner_id, target_id = (s.cli("cluster", "myid").strip() for s in (owner, target))
        target.cli("cluster", "setslot", slot, "importing", owner_id)
        owner.cli("cluster", "setslot", slot, "migrating", target_id)
        assert owner.cli("migrate", "127.0.0.1", str(target.port), key, "0", "5000").strip() == "OK"
        np.testing.assert_array_equal(vt.lookup([("emb/a", keys)])[0], src.values("emb/a", keys))  # ASK
        rows = {"emb/a": RowChunk(keys[:1], np.full((1, 8), 9, np.float32))}
        vt.stage_delta(rows, 15)  # its HSET is answered ASK too
        vt.apply_delta(rows, 15)
        want = src.values("emb/a", keys)
        want[0] = 9
        np.testing.assert_array_equal(vt.lookup([("emb/a", keys)])[0], want)
        for server in cluster.servers:  # the migration ends: the old owner answers MOVED
            server.cli("cluster", "setslot", slot, "node", target_id)
        np.testing.assert_array_equal(vt.lookup([("emb/a", keys)])[0], want)
        assert store.state == "up"
        store.close()
    finally:
        cluster.close()
