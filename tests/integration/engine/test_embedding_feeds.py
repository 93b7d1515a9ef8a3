"""embedding_lookup.needed_feeds: each run of the split run is fed only the inputs it reads."""

from __future__ import annotations

import pytest

from processor.engine.tensorflow.embedding_lookup import needed_feeds

tf = pytest.importorskip("tensorflow")


def test_feeds_behind_fed_tensors_or_unread_are_left_out_and_control_inputs_count():
    graph = tf.Graph()
    with graph.as_default():
        ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
        dense = tf.compat.v1.placeholder(tf.float32, [None], name="dense")
        flag = tf.compat.v1.placeholder(tf.bool, [], name="flag")
        unused = tf.compat.v1.placeholder(tf.float32, [None], name="unused")
        table = tf.constant([[1.0], [2.0]])
        keys = ids % 2
        rows = tf.gather(table, keys)  # the gather whose output the store feeds
        check = tf.debugging.Assert(flag, [flag])
        with tf.control_dependencies([check]):
            out = tf.reduce_sum(rows, axis=1) + dense
    feeds = [ids, dense, flag, unused]
    assert needed_feeds(feeds, [keys], ()) == [0]  # the keys: ids only
    assert needed_feeds(feeds, [out], [rows]) == [1, 2]  # rows fed: ids not read; the Assert reads flag
    assert needed_feeds(feeds, [out], ()) == [0, 1, 2]
    assert needed_feeds(feeds, [dense], ()) == [1]  # a fetch that is a feed
