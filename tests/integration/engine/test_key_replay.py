"""key_replay: a store-served graph's lookup keys in numpy equal the TensorFlow run's, and what
it does not replay keeps the TensorFlow run."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import model_config
from processor.engine.tensorflow.key_replay import KeyReplay
from processor.errors import InvalidArgument

tf = pytest.importorskip("tensorflow")


def test_the_demo_models_keys_equal_the_tensorflow_run(ctr_model_small, make_processor):
    from demo.synthetic_data import synthetic_batch

    p = make_processor(model_config(ctr_model_small, ev_storage_type=1))
    group = p.model.manager.acquire_handle().group
    backend, embedding = group.backend, group.backend._embedding
    graph, session = backend._graph, backend._session
    feeds = backend._feed_tensors[0]
    keys = [graph.get_tensor_by_name(n) for n in embedding.key_tensor_names]
    replay = KeyReplay.build(feeds, keys)
    assert replay is not None and {"FloorMod", "Unpack", "StringToHashBucketFast"} <= set(replay.op_types)
    assert p.model_info()["session_group"]["embedding"]["keys"].startswith("computed in numpy")
    for batch, seed in ((1, 1), (7, 2), (256, 3)):
        inputs = synthetic_batch(batch, seed)
        inputs["sparse_ids"][0, :3] = [-5, 2**40, 0]  # negative and large ids: floor modulo
        given = [inputs[a] for a in backend._feed_aliases]
        want = session.run(keys, dict(zip(feeds, given)))
        got = replay(*given)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_array_equal(g, w)
    bad = synthetic_batch(2, 4)
    bad["sparse_ids"] = bad["sparse_ids"][:, :5]  # fewer id columns than the graph unstacks
    with pytest.raises(InvalidArgument, match="rejected the input"):
        replay(*[bad[a] for a in backend._feed_aliases])


def test_ops_it_does_not_replay_keep_the_tensorflow_run():
    graph = tf.Graph()
    with graph.as_default():
        ids = tf.compat.v1.placeholder(tf.int64, [None, 4], name="ids")
        sliced = ids[:, 1:3]  # StridedSlice: not replayed
        plain = tf.math.floormod(ids, 10)
        floats = tf.compat.v1.placeholder(tf.float32, [None], name="floats")
        float_mod = tf.math.floormod(floats, 2.0)  # a float modulo: not replayed
    assert KeyReplay.build([ids], [sliced]) is None
    assert KeyReplay.build([floats], [float_mod]) is None
    replay = KeyReplay.build([ids], [plain])
    x = np.array([[-11, 3, 25, 10**12]], np.int64)
    np.testing.assert_array_equal(replay(x)[0], tf.compat.v1.Session(graph=graph).run(plain, {ids: x}))


def test_unpack_on_every_axis_and_modulo_divisors_equal_the_tensorflow_run():
    """Unpack along each axis (negative too) of a 3-D input, and integer modulo by a constant
    divisor (checked once, at build), by a fed one and by a constant holding a zero: values,
    dtypes and shapes as TensorFlow's, and its refusal of a zero divisor."""
    graph = tf.Graph()
    with graph.as_default():
        ids = tf.compat.v1.placeholder(tf.int64, [2, 3, 4], name="ids")
        divisor = tf.compat.v1.placeholder(tf.int64, [4], name="divisor")
        unpacked = [t for axis in (0, 1, 2, -1, -3) for t in tf.unstack(ids, axis=axis)]
        by_const = tf.math.floormod(ids, tf.constant([3, 7, 10, 2**33], tf.int64))
        truncated = tf.truncatemod(ids, tf.constant(-6, tf.int64))
        by_fed = tf.math.floormod(ids, divisor)
        by_zero = tf.math.floormod(ids, tf.constant([3, 0, 1, 1], tf.int64))
    keys = [*unpacked, by_const, truncated]
    replay = KeyReplay.build([ids], keys)
    assert replay is not None and {"Unpack", "FloorMod", "TruncateMod"} <= set(replay.op_types)
    x = np.random.default_rng(5).integers(-2**40, 2**40, (2, 3, 4))
    x[0, 0, :] = [-1, 0, 2**62, -2**62]
    session = tf.compat.v1.Session(graph=graph)
    for got, want in zip(replay(x), session.run(keys, {ids: x})):
        assert got.dtype == want.dtype and got.shape == want.shape and got.flags.c_contiguous
        np.testing.assert_array_equal(got, want)
    fed = KeyReplay.build([ids, divisor], [by_fed])
    np.testing.assert_array_equal(fed(x, np.array([5, 9, 2, 11]))[0],
                                  session.run(by_fed, {ids: x, divisor: [5, 9, 2, 11]}))
    for refused, given in ((fed, (x, np.array([5, 0, 2, 11]))), (KeyReplay.build([ids], [by_zero]), (x,))):
        with pytest.raises(InvalidArgument, match="division by zero"):
            refused(*given)
