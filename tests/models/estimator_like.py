"""A SavedModel shaped like a ``tf.estimator`` canned classifier's export (TensorFlow 2.16+ has no
``tf.estimator``; the graph is built as its ``export_saved_model`` builds one): a placeholder of
serialized ``tf.Example``s parsed with a feature spec, and the signatures an Estimator writes:

* ``serving_default`` and ``classification``: ``inputs`` (the examples) -> ``classes``
  (DT_STRING ``[batch, 2]``, "0" / "1") and ``scores`` (``[batch, 2]``);
* ``regression``: ``inputs`` -> ``outputs`` (the probability of class 1, ``[batch, 1]``);
* ``predict``: ``examples`` -> ``logits``, ``probabilities``, ``class_ids`` (predict method);
* ``ranking``: ``examples`` -> ``probability`` (``[batch, 1]``, predict method): a ranking
  model's own signature, which Regress and Classify also take (see ``server/tfserving/inference.py``).

Features: a ranking request's context (``user_age`` float, ``user_group`` int64) and per-item
ones (``item_price`` float, ``item_id`` int64), all with defaults, so a merged example and a
bare one both parse. The logit mixes all four (weights are variables restored from the export).
"""

from __future__ import annotations

from pathlib import Path

FEATURES = ("user_age", "user_group", "item_price", "item_id")


def export(base: Path, version: int = 1) -> Path:
    import tensorflow.compat.v1 as tf

    export_dir = base / str(version)
    graph = tf.Graph()
    with graph.as_default(), tf.Session(graph=graph) as sess:
        serialized = tf.placeholder(tf.string, shape=[None], name="input_example_tensor")
        parsed = tf.io.parse_example(serialized, {
            "user_age": tf.io.FixedLenFeature([1], tf.float32, default_value=[0.0]),
            "user_group": tf.io.FixedLenFeature([1], tf.int64, default_value=[0]),
            "item_price": tf.io.FixedLenFeature([1], tf.float32, default_value=[0.0]),
            "item_id": tf.io.FixedLenFeature([1], tf.int64, default_value=[0]),
        })
        w = tf.Variable([[0.03], [-0.2], [0.5], [0.01]], name="linear/weights")
        bias = tf.Variable([-1.0], name="linear/bias")
        dense = tf.concat([parsed["user_age"], tf.cast(parsed["user_group"], tf.float32),
                           parsed["item_price"], tf.cast(parsed["item_id"] % 97, tf.float32)], axis=1)
        logits = tf.identity(tf.matmul(dense, w) + bias, name="logits")
        p1 = tf.sigmoid(logits)
        probabilities = tf.concat([1.0 - p1, p1], axis=1, name="probabilities")
        class_ids = tf.argmax(probabilities, axis=1, name="class_ids")[:, None]
        classes = tf.tile(tf.constant([["0", "1"]]), [tf.shape(logits)[0], 1], name="classes")
        sess.run(tf.global_variables_initializer())

        info = tf.saved_model.utils.build_tensor_info
        sig = tf.saved_model.signature_def_utils.build_signature_def
        classification = sig({"inputs": info(serialized)}, {"classes": info(classes), "scores": info(probabilities)},
                             "tensorflow/serving/classify")
        builder = tf.saved_model.builder.SavedModelBuilder(str(export_dir))
        builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={
            "serving_default": classification,
            "classification": classification,
            "regression": sig({"inputs": info(serialized)}, {"outputs": info(p1)}, "tensorflow/serving/regress"),
            "predict": sig({"examples": info(serialized)},
                           {"logits": info(logits), "probabilities": info(probabilities),
                            "class_ids": info(class_ids)}, "tensorflow/serving/predict"),
            "ranking": sig({"examples": info(serialized)}, {"probability": info(p1)}, "tensorflow/serving/predict"),
        })
        builder.save()
    return export_dir


def run_tensorflow(export_dir: Path, serialized: list[bytes], signature: str = "classification") -> dict:
    """TensorFlow's own run of ``signature`` on ``serialized`` examples (the reference)."""
    import tensorflow.compat.v1 as tf

    graph = tf.Graph()
    with tf.Session(graph=graph) as sess:
        meta = tf.saved_model.loader.load(sess, ["serve"], str(export_dir))
        sig = meta.signature_def[signature]
        (feed,) = [i.name for i in sig.inputs.values()]
        names = {alias: t.name for alias, t in sig.outputs.items()}
        values = sess.run(names, {feed: serialized})
    return values
