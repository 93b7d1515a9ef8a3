"""Build the demo CTR model: train on synthetic data, write full checkpoints, export.

:func:`build_ctr_model` trains the wide & deep network of :mod:`demo.ctr_network` with Adagrad
on :mod:`demo.synthetic_data` in ``versions`` segments of ``steps_per_version`` steps. After each
segment it publishes a full checkpoint of the model variables only (no optimizer slots)
as ``checkpoints/run_1/model.ckpt-<step>`` (see :mod:`demo.checkpoint_publish`). It then
exports an inference-only graph whose variables are restored from the newest checkpoint to
``savedmodel/`` with ``tf.compat.v1.saved_model.Builder``: signature ``serving_default``
(predict method) and a ``saver_def`` over the same variables, so feeding any checkpoint prefix to
``saver_def.filename_tensor_name`` and running ``saver_def.restore_op_name`` loads that version.
Last it writes ``model_card.json``, the mark of a complete build.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from demo.checkpoint_publish import publish_checkpoint
from demo.ctr_network import CtrNetwork, build_ctr_network
from demo.ctr_spec import PROBABILITY_OUTPUT, CtrPreset, get_preset
from demo.layout import CTR_MODEL_NAME, ModelPaths, prepare_out_dir, read_model_paths, write_model_card
from demo.metrics import roc_auc
from demo.signature_info import describe_signature
from demo.synthetic_data import synthetic_batch, synthetic_labeled_batch

__all__ = ["SIGNATURE_NAME", "build_ctr_model", "synthetic_batch"]

SIGNATURE_NAME = "serving_default"

# Seed streams: training batches are [seed, _TRAIN_STREAM, step], the held-out batch
# [seed, _EVAL_STREAM], so the two never overlap.
_TRAIN_STREAM = 1
_EVAL_STREAM = 2


def build_ctr_model(out_dir: Path, *, preset: str = "full", versions: int = 2, seed: int = 0) -> ModelPaths:
    """Train and export the CTR model into ``out_dir`` (layout in :mod:`demo.layout`).

    Args:
        out_dir: model directory; must not yet hold ``savedmodel/``, ``checkpoints/`` or
            ``model_card.json`` (it may exist and hold other files).
        preset: ``full`` (~185 MB of parameters) or ``small`` (tables <= 5k rows).
        versions: number of full checkpoints; version ``k`` is written at step
            ``k * steps_per_version``; the SavedModel holds the last one's values.
        seed: seeds the synthetic data and the variable initialisers. Data and initial values
            are reproducible; trained values may differ in the last bits between runs
            (multithreaded float reductions).

    Returns:
        The paths of the build; ``checkpoint_prefixes`` oldest first.

    Raises:
        ValueError: unknown preset or ``versions < 1``.
        FileExistsError: ``out_dir`` already holds a model.
    """
    spec = get_preset(preset)
    if versions < 1:
        raise ValueError(f"versions must be >= 1, got {versions}")
    started = time.perf_counter()
    out_dir = Path(out_dir)
    paths = prepare_out_dir(out_dir)

    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(seed)
        network = build_ctr_network(spec)
        labels = tf.compat.v1.placeholder(tf.float32, [None, 1], name="labels")
        logits = network.outputs["logits"]
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
        train_op = tf.compat.v1.train.AdagradOptimizer(spec.learning_rate).minimize(loss)
        saver = tf.compat.v1.train.Saver(network.model_variables, sharded=True)
        init = tf.compat.v1.global_variables_initializer()

    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(init)
        step = 0
        for _ in range(versions):
            for _ in range(spec.steps_per_version):
                batch = synthetic_labeled_batch(spec.batch_size, [seed, _TRAIN_STREAM, step])
                sess.run(train_op, _feed_dict(network, batch.feeds, {labels: batch.labels}))
                step += 1
            newest = publish_checkpoint(
                paths.run_dir,
                step,
                lambda prefix: saver.save(sess, prefix, write_meta_graph=False, write_state=False),
            )
        held_out = synthetic_labeled_batch(spec.eval_examples, [seed, _EVAL_STREAM])
        predicted = sess.run(network.outputs[PROBABILITY_OUTPUT], _feed_dict(network, held_out.feeds))

    _export_savedmodel(spec, newest, paths.savedmodel_dir)
    built = read_model_paths(out_dir)
    evaluation = {
        "examples": spec.eval_examples,
        "seed": [seed, _EVAL_STREAM],
        "auc": roc_auc(held_out.labels, predicted),
        "oracle_auc": roc_auc(held_out.labels, held_out.probabilities),
        "positive_rate": float(held_out.labels.mean()),
    }
    card = _model_card(spec, built, network, seed, evaluation, time.perf_counter() - started)
    write_model_card(out_dir, card)
    return built


def _feed_dict(
    network: CtrNetwork, feeds: dict[str, np.ndarray], extra: dict[tf.Tensor, np.ndarray] | None = None
) -> dict[tf.Tensor, np.ndarray]:
    return {network.inputs[alias]: value for alias, value in feeds.items()} | (extra or {})


def _export_savedmodel(spec: CtrPreset, checkpoint_prefix: Path, savedmodel_dir: Path) -> None:
    """Export a fresh inference graph with the variables of ``checkpoint_prefix``."""
    graph = tf.Graph()
    with graph.as_default():
        network = build_ctr_network(spec)
        saver = tf.compat.v1.train.Saver(network.model_variables, sharded=True)
        signature = tf.compat.v1.saved_model.predict_signature_def(network.inputs, network.outputs)
    with tf.compat.v1.Session(graph=graph) as sess:
        saver.restore(sess, str(checkpoint_prefix))
        builder = tf.compat.v1.saved_model.Builder(str(savedmodel_dir))
        builder.add_meta_graph_and_variables(
            sess,
            [tf.saved_model.SERVING],
            signature_def_map={SIGNATURE_NAME: signature},
            saver=saver,
            strip_default_attrs=True,
            clear_devices=True,
        )
        builder.save()


def _model_card(
    spec: CtrPreset,
    built: ModelPaths,
    network: CtrNetwork,
    seed: int,
    evaluation: dict[str, Any],
    build_seconds: float,
) -> dict[str, Any]:
    embedding_params = sum(t.rows * t.dim for t in spec.tables)
    total_params = sum(int(np.prod(v.shape.as_list())) for v in network.model_variables)
    return {
        "model": CTR_MODEL_NAME,
        "preset": spec.name,
        "seed": seed,
        **describe_signature(built.savedmodel_dir, SIGNATURE_NAME),
        "tables": [
            {
                "name": t.name,
                "feature": t.feature,
                "input": t.input,
                "column": t.column,
                "rows": t.rows,
                "dim": t.dim,
                "id_mapping": t.id_mapping,
            }
            for t in spec.tables
        ],
        "dense_part": {"hidden_units": list(spec.hidden_units), "wide": "linear over all features"},
        "parameters": {
            "total": total_params,
            "embedding": embedding_params,
            "dense": total_params - embedding_params,
            "bytes": total_params * 4,
        },
        "training": {
            "optimizer": "Adagrad",
            "learning_rate": spec.learning_rate,
            "batch_size": spec.batch_size,
            "steps_per_version": spec.steps_per_version,
        },
        "steps": built.steps,
        "checkpoint_prefixes": [str(p.relative_to(built.out_dir)) for p in built.checkpoint_prefixes],
        "evaluation": evaluation,
        "build_seconds": round(build_seconds, 2),
    }
