"""Read and write TensorFlow checkpoint files (tensor bundles) as name -> numpy array."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


def write_tensors(prefix: str, tensors: Mapping[str, np.ndarray]) -> None:
    """Write ``tensors`` as the bundle ``<prefix>.index`` + ``<prefix>.data-00000-of-00001``.

    Runs in a private graph, so it is safe inside a caller's graph-mode block or eager code.
    """
    import tensorflow as tf

    names = sorted(tensors)
    with tf.Graph().as_default() as graph:
        holders = [tf.compat.v1.placeholder(tf.as_dtype(tensors[n].dtype), tensors[n].shape) for n in names]
        save = tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                                 tensors=holders)
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(save, dict(zip(holders, (tensors[n] for n in names))))


def read_tensors(prefix: str) -> dict[str, np.ndarray]:
    """Every tensor of a checkpoint bundle. Raises the engine's error for a broken file."""
    from tensorflow.python.training import py_checkpoint_reader

    reader = py_checkpoint_reader.NewCheckpointReader(prefix)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}
