"""Shared fixtures: real models built once per test session into a temporary directory."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

# TensorFlow's C++ logging drowns test output; errors still show.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@pytest.fixture(scope="session")
def toy_model(tmp_path_factory):
    """DeepRec's toy y = 0.5*x + 2, TF1-exported, with one full checkpoint."""
    from demo.toy_model import build_toy_model

    return build_toy_model(tmp_path_factory.mktemp("toy") / "model")


@pytest.fixture(scope="session")
def toy_model_tf2(tmp_path_factory):
    """The toy exported with tf.saved_model.save (TF2 object-based checkpoint keys)."""
    from demo.toy_model import build_toy_model

    return build_toy_model(tmp_path_factory.mktemp("toy2") / "model", tf2=True)


@pytest.fixture(scope="session")
def ctr_model_small(tmp_path_factory):
    """The demo CTR model (small preset: same structure, small tables), two full versions."""
    from demo.ctr_model import build_ctr_model

    return build_ctr_model(tmp_path_factory.mktemp("ctr") / "model", preset="small", versions=2)


def model_config(paths, **overrides) -> dict:
    """A DeepRec-style model_config for a demo.layout.ModelPaths."""
    config = {
        "savedmodel_dir": str(paths.savedmodel_dir),
        "checkpoint_dir": str(paths.checkpoint_dir),
        "signature_name": "serving_default",
        "feature_store_type": "memory",
        "serialize_protocol": "protobuf",
        "model_store_type": "local",
        "session_num": 1,
        "inter_op_parallelism_threads": 1,
        "intra_op_parallelism_threads": 1,
    }
    config.update(overrides)
    return config


@pytest.fixture
def make_processor():
    """Factory: a Processor from a config dict; closed at the end of the test."""
    from processor.processor import Processor

    made = []

    def make(config: dict, name: str = ""):
        processor = Processor.create(name, json.dumps(config))
        made.append(processor)
        return processor

    yield make
    for processor in made:
        processor.close()


def plain_tf_predict(savedmodel_dir, checkpoint_prefix, feeds: dict[str, np.ndarray],
                     signature_name: str = "serving_default") -> dict[str, np.ndarray]:
    """The reference: plain TensorFlow on the SavedModel graph with a checkpoint restored."""
    import tensorflow as tf

    graph = tf.Graph()
    with tf.compat.v1.Session(graph=graph) as sess:
        meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], str(savedmodel_dir))
        if checkpoint_prefix is not None:
            sess.run(meta.saver_def.restore_op_name,
                     {meta.saver_def.filename_tensor_name: str(checkpoint_prefix)})
        sig = meta.signature_def[signature_name]
        feed = {sig.inputs[k].name: v for k, v in feeds.items()}
        names = sorted(sig.outputs)
        values = sess.run([sig.outputs[k].name for k in names], feed)
    return dict(zip(names, values))
