"""A two-tower ranking model (issue 47): one user and many candidates per request.

TF1 graph mode, resource variables, exported as a SavedModel (TF Serving's layout: one version
directory, ``<base>/1``), servable on TensorFlow and (converted) on ONNX Runtime::

    user_seq [n, L] ids --mod--gather item_emb--(per-position MLP)--mean over L--+
    user_profile [n, P] ids --mod--gather profile_emb--flatten-+--concat--> user MLP (512-256) --+
    user_dense [n, U] ------------------------------------------+                                |
    item_id [n] ids --mod--gather item_emb---------------------+--concat--> item MLP (256-128) --+--concat--> head (256-128-1) --> prob [n, 1]
    item_dense [n, I] -------------------------------------------+

The user side depends only on the ``user_*`` inputs: a ranking request sends them once (one row)
beside N candidates, and with ``context_inputs: USER_INPUTS`` the processor runs that side once.
Weights are seeded random numbers (the model exists to be served and timed). Sizes are
arguments (tests build a small one).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

USER_INPUTS = ("user_seq", "user_profile", "user_dense")


def build(base: Path, *, items: int = 100_000, dim: int = 64, seq: int = 100, profile: int = 4,
          profile_rows: int = 10_000, profile_dim: int = 16, user_dense: int = 16, item_dense: int = 8,
          user_hidden=(512, 256), item_hidden=(256, 128), head_hidden=(256, 128), seq_hidden=(),
          seed: int = 0) -> Path:
    """Write the SavedModel to ``base/1``; returns that version directory. ``seq_hidden``: a
    per-position MLP over the behaviour sequence before the pooling (a stand-in for a heavier
    sequence encoder; none by default)."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    graph = tf.Graph()
    with graph.as_default():
        def var(name, value):
            return tf.compat.v1.get_variable(name, initializer=tf.constant(value.astype(np.float32)), use_resource=True)

        def mlp(x, width, sizes, scope, last_relu=True):
            with tf.compat.v1.variable_scope(scope):
                for k, units in enumerate(sizes):
                    w = var(f"w{k}", rng.standard_normal((width, units)) / np.sqrt(width))
                    b = var(f"b{k}", rng.standard_normal(units) * 0.01)
                    x = tf.nn.bias_add(tf.matmul(x, w), b)
                    if last_relu or k < len(sizes) - 1:
                        x = tf.nn.relu(x)
                    width = units
            return x, width

        ph = {
            "user_seq": tf.compat.v1.placeholder(tf.int64, [None, seq], name="user_seq"),
            "user_profile": tf.compat.v1.placeholder(tf.int64, [None, profile], name="user_profile"),
            "user_dense": tf.compat.v1.placeholder(tf.float32, [None, user_dense], name="user_dense"),
            "item_id": tf.compat.v1.placeholder(tf.int64, [None], name="item_id"),
            "item_dense": tf.compat.v1.placeholder(tf.float32, [None, item_dense], name="item_dense"),
        }
        item_emb = var("item_emb", rng.standard_normal((items, dim)) * 0.05)
        profile_emb = var("profile_emb", rng.standard_normal((profile_rows, profile_dim)) * 0.05)
        seq_emb, width = tf.gather(item_emb, tf.math.floormod(ph["user_seq"], items)), dim
        with tf.compat.v1.variable_scope("seq"):
            for k, units in enumerate(seq_hidden):  # [n, L, width] x [width, units]: per position
                w = var(f"w{k}", rng.standard_normal((width, units)) / np.sqrt(width))
                seq_emb = tf.nn.relu(tf.nn.bias_add(tf.matmul(seq_emb, w), var(f"b{k}", np.zeros(units))))
                width = units
        seq_vec = tf.reduce_mean(seq_emb, axis=1)
        prof = tf.reshape(tf.gather(profile_emb, tf.math.floormod(ph["user_profile"], profile_rows)),
                          [-1, profile * profile_dim])
        user_in = tf.concat([seq_vec, prof, ph["user_dense"]], axis=1)
        user_vec, user_width = mlp(user_in, width + profile * profile_dim + user_dense, user_hidden, "user")
        item_in = tf.concat([tf.gather(item_emb, tf.math.floormod(ph["item_id"], items)), ph["item_dense"]], axis=1)
        item_vec, item_width = mlp(item_in, dim + item_dense, item_hidden, "item")
        logit, _ = mlp(tf.concat([user_vec, item_vec], axis=1), user_width + item_width, (*head_hidden, 1), "head",
                       last_relu=False)
        prob = tf.sigmoid(logit, name="prob")
        saver = tf.compat.v1.train.Saver(sharded=True)
        init = tf.compat.v1.global_variables_initializer()
        out = Path(base) / "1"
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(init)
            builder = tf.compat.v1.saved_model.Builder(str(out))
            builder.add_meta_graph_and_variables(
                sess, [tf.saved_model.SERVING],
                signature_def_map={"serving_default": tf.compat.v1.saved_model.predict_signature_def(ph, {"prob": prob})},
                saver=saver, strip_default_attrs=True)
            builder.save()
    return out


def request(candidates: int, *, user: int = 0, seed: int = 0, seq: int = 100, profile: int = 4, user_dense: int = 16,
            item_dense: int = 8) -> dict[str, np.ndarray]:
    """One ranking request: user ``user``'s context (one row each) and ``candidates`` candidates."""
    urng = np.random.default_rng(1_000_003 + user)
    rng = np.random.default_rng(seed)
    return {"user_seq": urng.integers(0, 1 << 40, (1, seq), dtype=np.int64),
            "user_profile": urng.integers(0, 1 << 40, (1, profile), dtype=np.int64),
            "user_dense": urng.standard_normal((1, user_dense)).astype(np.float32),
            "item_id": rng.integers(0, 1 << 40, candidates, dtype=np.int64),
            "item_dense": rng.standard_normal((candidates, item_dense)).astype(np.float32)}


def tiled(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The same request with the user's row repeated for every candidate (what clients send today)."""
    n = len(feeds["item_id"])
    return {k: (np.repeat(v, n, axis=0) if k in USER_INPUTS else v) for k, v in feeds.items()}
