"""Redis key layout and redis_url forms."""

import numpy as np
import pytest

from processor.features.key_layout import SENTINEL, KeyLayout, key_slot, table_id
from processor.features.redis_url import parse_redis_url


def test_hash_tags_and_slots():
    assert key_slot(b"foo") == 12182  # Redis' CLUSTER KEYSLOT foo
    assert key_slot(b"{user1000}.following") == key_slot(b"{user1000}.followers") == key_slot(b"user1000")
    layout = KeyLayout("ctr model", partitions=32)
    keys, slots = layout.partition_keys("run_1-80")
    assert len(set(keys)) == 32 and all(k.startswith(b"sp1:{ctr_model/run_1-80/p") for k in keys)
    assert [key_slot(k) for k in keys] == slots.tolist()
    # Partition p's slot lies in the p-th 1/32 of the slot space: even over a 3-node cluster.
    assert (slots // 512 == np.arange(32)).all()
    assert key_slot(layout.meta_key) == key_slot(layout.lock_key("run_1-80"))
    assert layout.partition_keys("run_1-120")[0] != keys


def test_fields_are_12_binary_bytes_and_partitions_spread():
    layout = KeyLayout("m", partitions=8)
    ids = np.array([0, 1, -1, 2**62], np.int64)
    fields = layout.fields(np.full(4, table_id("emb/C1"), np.uint32), ids)
    assert all(len(f) == 12 and f.endswith(b"\x01") for f in fields)
    assert fields[1][:8] == (1).to_bytes(8, "little") and fields[2][:8] == b"\xff" * 8
    assert SENTINEL not in fields
    parts = layout.partition_of(table_id("emb/C1"), np.arange(80_000))
    counts = np.bincount(parts, minlength=8)
    assert counts.min() > 9000 and counts.max() < 11000


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ">f4"])
def test_packed_commands_are_the_resp_of_their_arguments(dtype):
    """HSET / HDEL / HMGET built in one numpy pass parse (as Redis parses a command) to the
    arguments one would send: each row as little-endian bytes of its dtype."""
    import hiredis

    ids = np.array([7, -3, 2**40], np.int64)
    tids = np.full(3, table_id("emb/C1"), np.uint32)
    fields, as_bytes = KeyLayout.packed_fields(tids, ids), KeyLayout.fields(tids, ids)
    rows = np.arange(3 * 5).reshape(3, 5).astype(dtype)
    little = rows.astype(rows.dtype.newbyteorder("<"))
    reader = hiredis.Reader()
    reader.feed(KeyLayout.pack(b"HSET", b"k{1}", fields, rows))
    assert reader.gets() == [b"HSET", b"k{1}"] + [x for f, r in zip(as_bytes, little) for x in (f, r.tobytes())]
    reader.feed(KeyLayout.pack(b"HDEL", b"k", fields[1:]))
    assert reader.gets() == [b"HDEL", b"k", *as_bytes[1:]]
    reader.feed(KeyLayout.pack_hmget(b"k", fields[:0]))
    assert reader.gets() == [b"HMGET", b"k", SENTINEL]
    assert reader.gets() is False  # nothing left over


def test_redis_url_forms():
    a = parse_redis_url("127.0.0.1:6379")[0]
    assert (a.host, a.port, a.db) == ("127.0.0.1", 6379, 0)
    b = parse_redis_url("redis://:s3cret@cache.local:7000/2")[0]
    assert (b.host, b.port, b.db, b.password) == ("cache.local", 7000, 2, "s3cret")
    c = parse_redis_url("redis://10.0.0.1:7000,10.0.0.2:7001", cluster=True)
    assert [x.port for x in c] == [7000, 7001]
    for bad, why in (("localhost", "host:port"), ("http://h:1", "scheme"), ("h:1/x", "db number"),
                     ("h:1,h:2", "cluster_redis"), ("h:99999", "range")):
        with pytest.raises(ValueError, match=why):
            parse_redis_url(bad)
    with pytest.raises(ValueError, match="db 0"):
        parse_redis_url("h:1/3", cluster=True)


def test_config_validates_redis_url():
    from processor.config import ModelConfig
    from processor.errors import ConfigError

    base = {"savedmodel_dir": "/m", "feature_store_type": "redis"}
    assert ModelConfig.from_dict({**base, "redis_url": "redis://h:6379/1"}).redis_url
    with pytest.raises(ConfigError, match="redis_url"):
        ModelConfig.from_dict({**base, "redis_url": "h:1,h:2"})
    assert ModelConfig.from_dict({**base, "feature_store_type": "cluster_redis", "redis_url": "h:1,h:2"})
