"""TF Serving layout test models: the TF1 toy (``y = a*x + b``, demo/toy_model.py) exported as
numbered version directories of a model base directory, each with its own variable values, so
that each version gives its own answer. Built with TensorFlow at test time."""

import os
import shutil


def export_version(base, number, a, b):
    """Write the TF1 toy with ``a``, ``b`` as ``base/<number>`` (built aside, then renamed in)."""
    import tensorflow as tf

    from demo.toy_model import SIGNATURE_NAME, _tf1_graph

    staging = base.parent / f".staging-{base.name}-{number}"
    toy = _tf1_graph(a, b, 3.0)
    with tf.compat.v1.Session(graph=toy.graph) as sess:
        sess.run(toy.init)
        builder = tf.compat.v1.saved_model.Builder(str(staging))
        builder.add_meta_graph_and_variables(
            sess, [tf.saved_model.SERVING],
            signature_def_map={SIGNATURE_NAME: tf.compat.v1.saved_model.predict_signature_def(
                {"x": toy.x}, {"y": toy.y})},
            saver=toy.saver, strip_default_attrs=True)
        builder.save()
    base.mkdir(parents=True, exist_ok=True)
    os.rename(staging, base / str(number))
    return base / str(number)


def copy_version(versions, base, number, as_number=None):
    """Copy pristine version ``number`` into ``base`` (via a rename, as a publisher would)."""
    target = base / str(as_number if as_number is not None else number)
    staging = base / f".tmp-{target.name}"
    shutil.copytree(versions / str(number), staging)
    os.rename(staging, target)
    return target


def export_versions(base, numbers=(1, 2)):
    """Versions ``numbers`` under ``base``: version n answers ``answer_of(n, x)``."""
    for number in numbers:
        export_version(base, number, float(number), 1.0)
    return base


def answer_of(number: int, x: float) -> float:
    """What version ``number`` of :func:`export_versions` answers at ``x``: n*x + 1."""
    return number * x + 1.0
