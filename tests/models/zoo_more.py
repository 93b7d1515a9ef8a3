"""More small zoo models (issue 14 item 3), seconds each, in the demo layout (:mod:`demo.layout`).

* :func:`build_keras_dcn`: a Keras 3 DCN-like model (TensorFlow backend): ``country`` string [None]
  through ``StringLookup``, ``item_id`` int64 [None] through ``IntegerLookup``, ``user_id`` int64
  [None] through ``Hashing``; embeddings concatenated with ``dense`` float32 [None, 3], one cross
  layer ``x0 * (W x + b) + x`` and a deep layer; outputs ``logit`` and ``prob`` float32 [None, 1].
  Saved with ``tf.saved_model.save`` of a ``tf.Module`` calling the Keras model, with a
  ``tf.function`` serving signature; checkpoint step 1 from ``tf.train.Checkpoint`` of the same
  module built with other weights.
* :func:`build_keras3_hashing_dcn`: a Keras 3 DCN of ``Hashing`` + ``Embedding`` + ``Dense`` only
  (no lookup tables), written the two ways Keras 3 users do: ``model.export()`` (its graph holds
  a second, unrestored handle per variable) or ``tf.saved_model.save(model)`` (its signature
  reads handles nothing restores); TF Serving's layout, version 1; with the model's own answer.
* :func:`build_keras3_int_hashing`: a Keras 3 model hashing int64 item ids held as Keras users
  hold them, in columns: ``item_ids`` int64 [None, 4] (a history, averaged) and ``last_item``
  int64 [None, 1] through ``Hashing`` + ``Embedding`` into one ``Dense``; ``model.export()``,
  TF Serving's layout, version 1; with the model's own answers (``output_0`` the score,
  ``output_1`` the history's buckets).
* :func:`build_tf1_vocab_table`: a TF1 graph with a ``StaticHashTable`` vocabulary (string -> id,
  unknown words -> the last row) and an embedding variable; input ``word`` string [None], outputs ``id`` int64 [None]
  and ``score`` float32 [None, 1]. Exported with ``SavedModelBuilder`` and
  ``main_op=tables_initializer()``; one full checkpoint ``model.ckpt-1`` with other values.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

from demo.checkpoint_publish import publish_checkpoint
from demo.layout import ModelPaths, prepare_out_dir, read_model_paths

SIGNATURE_NAME = "serving_default"
COUNTRIES = ["fr", "de", "no", "pe", "jp"]
ITEMS = [3, 17, 42, 100, 2024]
USER_BINS = 11
WORDS = [b"alpha", b"beta", b"gamma", b"delta"]


def _rand(seed: int, shape) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * 0.3).astype(np.float32)


def _keras_dcn(seed: int):
    import keras

    country = keras.Input(shape=(), dtype="string", name="country")
    item = keras.Input(shape=(), dtype="int64", name="item_id")
    user = keras.Input(shape=(), dtype="int64", name="user_id")
    dense = keras.Input(shape=(3,), dtype="float32", name="dense")
    c = keras.layers.StringLookup(vocabulary=COUNTRIES, name="country_lookup")(country)
    i = keras.layers.IntegerLookup(vocabulary=ITEMS, name="item_lookup")(item)
    u = keras.layers.Hashing(num_bins=USER_BINS, name="user_hash")(user)
    ec = keras.layers.Embedding(len(COUNTRIES) + 1, 4, name="country_emb")(c)
    ei = keras.layers.Embedding(len(ITEMS) + 1, 4, name="item_emb")(i)
    eu = keras.layers.Embedding(USER_BINS, 4, name="user_emb")(u)
    x0 = keras.layers.Concatenate(name="concat")([ec, ei, eu, dense])
    width = 4 * 3 + 3
    cross = keras.layers.Add(name="cross")([
        keras.layers.Multiply()([x0, keras.layers.Dense(width, name="cross_w")(x0)]), x0])
    deep = keras.layers.Dense(8, activation="relu", name="deep")(x0)
    logit = keras.layers.Dense(1, name="logit")(keras.layers.Concatenate()([cross, deep]))
    model = keras.Model([country, item, user, dense], logit)
    for k, weight in enumerate(model.weights):
        weight.assign(_rand(seed * 100 + k, tuple(weight.shape)))
    return model


class KerasDCNModule(tf.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        model = _keras_dcn(seed)
        # The Keras model is called untracked (a closure): a SavedModel tracking Keras 3 variables
        # holds a second, unread handle per variable, which a TF1-style loader restores instead of
        # the one the graph reads. Tracked instead: the plain tf.Variables and the lookup layers
        # (their vocabulary tables).
        self._model = lambda inputs: model(inputs)
        self.weights = [w.value for w in model.weights]
        self.lookups = [model.get_layer(n) for n in ("country_lookup", "item_lookup", "user_hash")]

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="country"),
                                  tf.TensorSpec([None], tf.int64, name="item_id"),
                                  tf.TensorSpec([None], tf.int64, name="user_id"),
                                  tf.TensorSpec([None, 3], tf.float32, name="dense")])
    def serve(self, country, item_id, user_id, dense):
        logit = self._model([country, item_id, user_id, dense])
        return {"logit": logit, "prob": tf.sigmoid(logit)}


def build_keras_dcn(out_dir: Path) -> ModelPaths:
    paths = prepare_out_dir(Path(out_dir))
    module = KerasDCNModule(1)
    tf.saved_model.save(module, str(paths.savedmodel_dir), signatures={SIGNATURE_NAME: module.serve})
    publish_checkpoint(paths.run_dir, 1, tf.train.Checkpoint(KerasDCNModule(2)).write)
    return read_model_paths(Path(out_dir))


HASHING_DCN_FEEDS = {"item_id": np.array([3, 99, -5, 2**40], np.int64), "user_id": np.array([1, 2, 3, 0], np.int64),
                     "dense": _rand(5, (4, 3))}


def build_keras3_hashing_dcn(out_dir: Path, saved_with: str) -> tuple[Path, dict[str, np.ndarray]]:
    """The model in ``out_dir/1`` (``saved_with``: ``export`` or ``tf_saved_model``) and what
    Keras itself answers for :data:`HASHING_DCN_FEEDS` (output ``output_0``)."""
    import keras

    item = keras.Input(shape=(), dtype="int64", name="item_id")
    user = keras.Input(shape=(), dtype="int64", name="user_id")
    dense = keras.Input(shape=(3,), dtype="float32", name="dense")
    ei = keras.layers.Embedding(13, 4, name="item_emb")(keras.layers.Hashing(num_bins=13, name="item_hash")(item))
    eu = keras.layers.Embedding(USER_BINS, 4, name="user_emb")(keras.layers.Hashing(num_bins=USER_BINS)(user))
    x0 = keras.layers.Concatenate()([ei, eu, dense])
    cross = keras.layers.Add()([keras.layers.Multiply()([x0, keras.layers.Dense(11, name="cross_w")(x0)]), x0])
    deep = keras.layers.Dense(8, activation="relu", name="deep")(x0)
    logit = keras.layers.Dense(1, name="logit")(keras.layers.Concatenate()([cross, deep]))
    model = keras.Model({"item_id": item, "user_id": user, "dense": dense}, logit)
    for k, weight in enumerate(model.weights):
        weight.assign(_rand(300 + k, tuple(weight.shape)))
    base = Path(out_dir)
    if saved_with == "export":
        model.export(str(base / "1"))
    else:
        tf.saved_model.save(model, str(base / "1"))
    return base, {"output_0": np.asarray(model(HASHING_DCN_FEEDS))}


# ids whose decimal text has every length from 1 to 20 (farmhash's branches), both signs, the extremes
INT_HASHING_FEEDS = {
    "item_ids": np.array([[3, 99, -5, 2**40], [0, -1, 2**63 - 1, -2**63], [10**18, -10**17, 123456789, -42],
                          [7, 7, 7, 7], [10**k for k in range(15, 19)]], np.int64),
    "last_item": np.array([[9], [-9], [10**12], [-(10**13)], [2**62]], np.int64)}


def build_keras3_int_hashing(out_dir: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """The model in ``out_dir/1`` and what Keras itself answers for :data:`INT_HASHING_FEEDS`."""
    import keras

    history = keras.Input(shape=(4,), dtype="int64", name="item_ids")
    last = keras.Input(shape=(1,), dtype="int64", name="last_item")
    buckets = keras.layers.Hashing(num_bins=1009, name="history_hash")(history)
    eh = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(1009, 4, name="history_emb")(buckets))
    el = keras.layers.Flatten()(keras.layers.Embedding(13, 4, name="last_emb")(
        keras.layers.Hashing(num_bins=13, name="last_hash")(last)))
    score = keras.layers.Dense(1, name="score")(keras.layers.Concatenate()([eh, el]))
    model = keras.Model({"item_ids": history, "last_item": last}, [score, buckets])
    for k, weight in enumerate(model.weights):
        weight.assign(_rand(400 + k, tuple(weight.shape)))
    base = Path(out_dir)
    model.export(str(base / "1"))
    answers = model(INT_HASHING_FEEDS)
    return base, {f"output_{k}": np.asarray(answer) for k, answer in enumerate(answers)}


def _tf1_vocab_graph(seed: int):
    graph = tf.Graph()
    with graph.as_default():
        word = tf.compat.v1.placeholder(tf.string, [None], name="word")
        table = tf.compat.v1.lookup.StaticHashTable(tf.compat.v1.lookup.KeyValueTensorInitializer(
            tf.constant(WORDS), tf.range(len(WORDS), dtype=tf.int64)), default_value=len(WORDS))
        ids = tf.identity(table.lookup(word), name="id")
        emb = tf.compat.v1.get_variable("embedding", initializer=tf.constant(_rand(seed, (len(WORDS) + 1, 3))),
                                        use_resource=True)
        w = tf.compat.v1.get_variable("w", initializer=tf.constant(_rand(seed + 7, (3, 1))), use_resource=True)
        score = tf.identity(tf.matmul(tf.gather(emb, ids), w), name="score")
        saver = tf.compat.v1.train.Saver([emb, w], sharded=True)
        init = tf.compat.v1.global_variables_initializer()
        tables = tf.compat.v1.tables_initializer()
    return graph, {"word": word}, {"id": ids, "score": score}, saver, init, tables


def build_tf1_vocab_table(out_dir: Path) -> ModelPaths:
    paths = prepare_out_dir(Path(out_dir))
    graph, inputs, outputs, saver, init, tables = _tf1_vocab_graph(1)
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run([init, tables])
        builder = tf.compat.v1.saved_model.Builder(str(paths.savedmodel_dir))
        builder.add_meta_graph_and_variables(
            sess, [tf.saved_model.SERVING],
            signature_def_map={SIGNATURE_NAME: tf.compat.v1.saved_model.predict_signature_def(inputs, outputs)},
            main_op=tables, saver=saver, strip_default_attrs=True)
        builder.save()
    graph, _, _, saver, init, _ = _tf1_vocab_graph(2)
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(init)
        publish_checkpoint(paths.run_dir, 1, lambda prefix: saver.save(
            sess, prefix, write_meta_graph=False, write_state=False))
    return read_model_paths(Path(out_dir))
