"""The CTR model's inference graph (TF1 graph mode, resource variables).

Wide & deep over Criteo-like features::

    dense [n,13] --log1p(max(x,0))--------------------------+
    sparse_ids [n,20] --floormod(rows)--gather C1..C20 -----+--concat--> MLP 256-128-1 --+
    sparse_tokens [n,6] --to_hash_bucket_fast--gather C21..C26 --+           linear 1 -----+--> logits
                                                                                 probability = sigmoid(logits)

The wide part is a linear layer over the same concatenated features, added to the MLP output.

Tensor names (in an otherwise empty graph): inputs ``dense:0``, ``sparse_ids:0``,
``sparse_tokens:0``; outputs ``logits:0``, ``probability:0``. Variables: ``embeddings/C1`` ..
``embeddings/C26`` (``[rows, dim]``), ``mlp/layer_<k>/kernel|bias``, ``mlp/output/kernel|bias``,
``wide/kernel|bias``. Training and export build the same graph, so checkpoint keys match.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from demo.ctr_spec import (
    DENSE_INPUT,
    IDS_INPUT,
    LOGITS_OUTPUT,
    NUM_DENSE,
    NUM_ID_FEATURES,
    NUM_TOKEN_FEATURES,
    PROBABILITY_OUTPUT,
    TOKENS_INPUT,
    CtrPreset,
)



class CtrNetwork(NamedTuple):
    """Handles on the built graph.

    Attributes:
        inputs: alias -> placeholder.
        outputs: alias -> output tensor (``probability``, ``logits``, both float32 ``[n, 1]``).
        model_variables: every parameter of the model (tables first), nothing else; the
            variables a full checkpoint holds.
    """

    inputs: dict[str, tf.Tensor]
    outputs: dict[str, tf.Tensor]
    model_variables: list[tf.Variable]


def build_ctr_network(preset: CtrPreset) -> CtrNetwork:
    """Add the inference graph for ``preset`` to the current default graph.

    Must be called in graph mode (inside ``tf.Graph().as_default()``), once per graph. Variables
    get their initialisers (embeddings uniform in +-1/sqrt(dim), Glorot kernels, zero biases) but are not run.
    """
    dense = tf.compat.v1.placeholder(tf.float32, [None, NUM_DENSE], name=DENSE_INPUT)
    sparse_ids = tf.compat.v1.placeholder(tf.int64, [None, NUM_ID_FEATURES], name=IDS_INPUT)
    sparse_tokens = tf.compat.v1.placeholder(tf.string, [None, NUM_TOKEN_FEATURES], name=TOKENS_INPUT)

    with tf.compat.v1.variable_scope("embeddings"):
        tables = [
            tf.compat.v1.get_variable(
                table.feature,
                shape=[table.rows, table.dim],
                initializer=tf.compat.v1.random_uniform_initializer(-table.dim**-0.5, table.dim**-0.5),
                use_resource=True,
            )
            for table in preset.tables
        ]

    with tf.name_scope("embedding_lookup"):
        id_tables = [t for t in preset.tables if t.input == IDS_INPUT]
        id_rows = tf.constant([t.rows for t in id_tables], tf.int64, name="id_table_rows")
        id_buckets = tf.unstack(tf.math.floormod(sparse_ids, id_rows), axis=1)
        token_columns = tf.unstack(sparse_tokens, axis=1)
        embedded = []
        for table, variable in zip(preset.tables, tables, strict=True):
            with tf.name_scope(table.feature):
                if table.input == IDS_INPUT:
                    buckets = id_buckets[table.column]
                else:
                    buckets = tf.strings.to_hash_bucket_fast(token_columns[table.column], table.rows)
                embedded.append(tf.gather(variable, buckets))

    with tf.name_scope("features"):
        dense_features = tf.math.log1p(tf.maximum(dense, 0.0))
        features = tf.concat([dense_features, *embedded], axis=1)

    layer_variables: list[tf.Variable] = []
    with tf.compat.v1.variable_scope("mlp"):
        hidden = features
        for k, units in enumerate(preset.hidden_units, start=1):
            hidden = tf.nn.relu(_linear(hidden, units, f"layer_{k}", layer_variables))
        deep_logits = _linear(hidden, 1, "output", layer_variables)
    wide_logits = _linear(features, 1, "wide", layer_variables, zero_kernel=True)

    logits = tf.identity(deep_logits + wide_logits, name=LOGITS_OUTPUT)
    probability = tf.sigmoid(logits, name=PROBABILITY_OUTPUT)
    return CtrNetwork(
        inputs={DENSE_INPUT: dense, IDS_INPUT: sparse_ids, TOKENS_INPUT: sparse_tokens},
        outputs={PROBABILITY_OUTPUT: probability, LOGITS_OUTPUT: logits},
        model_variables=[*tables, *layer_variables],
    )


def _linear(
    x: tf.Tensor, units: int, scope: str, created: list[tf.Variable], *, zero_kernel: bool = False
) -> tf.Tensor:
    """``x @ kernel + bias``; creates ``<scope>/kernel`` and ``<scope>/bias`` and appends them to ``created``."""
    zeros = tf.compat.v1.zeros_initializer()
    with tf.compat.v1.variable_scope(scope):
        kernel = tf.compat.v1.get_variable(
            "kernel",
            [x.shape[-1], units],
            initializer=zeros if zero_kernel else tf.compat.v1.glorot_uniform_initializer(),
            use_resource=True,
        )
        bias = tf.compat.v1.get_variable("bias", [units], initializer=zeros, use_resource=True)
    created += [kernel, bias]
    return tf.matmul(x, kernel) + bias
