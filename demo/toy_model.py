"""DeepRec's end-to-end toy model: ``y = a*x + b`` with ``a = 0.5``, ``b = 2.0``.

A third variable ``c = 3.0`` exists but is not used by the signature (like DeepRec's example),
so a loader must cope with parameters that no output depends on.

Signature ``serving_default`` (predict method): input alias ``x`` float32 ``[-1, 1]``, output
alias ``y`` float32 ``[-1, 1]``. Two export flavours:

- TF1 (default): graph mode, resource variables named ``a``, ``b``, ``c``, exported with
  ``tf.compat.v1.saved_model.Builder`` and a ``Saver`` over those variables; tensor names
  ``x:0`` and ``y:0``. Checkpoints are written by a ``Saver`` with the same variable names.
- TF2 (``tf2=True``): a ``tf.Module`` exported with ``tf.saved_model.save``; checkpoints are
  written with ``tf.train.Checkpoint(<module>)`` so their keys (``a/.ATTRIBUTES/VARIABLE_VALUE``
  ...) are the ones the MetaGraphDef's ``saver_def`` restore op reads. Needs eager execution.

Either way the MetaGraphDef has a ``saver_def``: feeding a checkpoint prefix to
``saver_def.filename_tensor_name`` and running ``saver_def.restore_op_name`` loads that version.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import tensorflow as tf

from demo.checkpoint_publish import publish_checkpoint
from demo.layout import TOY_MODEL_NAME, ModelPaths, prepare_out_dir, read_model_paths, write_model_card
from demo.signature_info import describe_signature

TOY_A = 0.5
TOY_B = 2.0
TOY_C = 3.0
TOY_INITIAL_STEP = 1
SIGNATURE_NAME = "serving_default"


def build_toy_model(out_dir: Path, *, tf2: bool = False) -> ModelPaths:
    """Build the toy model in ``out_dir`` (layout in :mod:`demo.layout`).

    Writes ``savedmodel/`` (a=0.5, b=2.0, c=3.0), the full checkpoint
    ``checkpoints/run_1/model.ckpt-1`` with the same values and its ``checkpoint`` state file,
    then ``model_card.json``. More versions: :func:`write_toy_checkpoint` with the same ``tf2``.

    Raises:
        FileExistsError: ``out_dir`` already holds a model.
        RuntimeError: ``tf2=True`` outside eager execution.
    """
    out_dir = Path(out_dir)
    paths = prepare_out_dir(out_dir)
    if tf2:
        _require_eager()
        module = _ToyModule(TOY_A, TOY_B, TOY_C)
        tf.saved_model.save(module, str(paths.savedmodel_dir), signatures={SIGNATURE_NAME: module.serve})
    else:
        _export_tf1(paths.savedmodel_dir)
    write_toy_checkpoint(paths.run_dir, TOY_INITIAL_STEP, TOY_A, TOY_B, tf2=tf2)
    built = read_model_paths(out_dir)
    write_model_card(
        out_dir,
        {
            "model": TOY_MODEL_NAME,
            "format": "tf2" if tf2 else "tf1",
            "formula": "y = a*x + b",
            **describe_signature(paths.savedmodel_dir, SIGNATURE_NAME),
            "savedmodel_values": {"a": TOY_A, "b": TOY_B, "c": TOY_C},
            "steps": built.steps,
        },
    )
    return built


def write_toy_checkpoint(
    run_dir: Path, step: int, a: float, b: float, *, c: float = TOY_C, tf2: bool = False
) -> Path:
    """Publish a full toy checkpoint ``run_dir/model.ckpt-<step>`` holding ``a``, ``b``, ``c``.

    ``tf2`` must match the flavour the SavedModel was built with (the checkpoint keys differ).
    The checkpoint appears atomically and the ``checkpoint`` state file then points at the
    highest step in ``run_dir`` (see :func:`demo.checkpoint_publish.publish_checkpoint`).

    Returns:
        The published prefix.
    """
    if tf2:
        _require_eager()
        checkpoint = tf.train.Checkpoint(_ToyModule(a, b, c))
        return publish_checkpoint(run_dir, step, checkpoint.write)
    toy = _tf1_graph(a, b, c)
    with tf.compat.v1.Session(graph=toy.graph) as sess:
        sess.run(toy.init)
        return publish_checkpoint(
            run_dir,
            step,
            lambda prefix: toy.saver.save(sess, prefix, write_meta_graph=False, write_state=False),
        )


class _Tf1Toy(NamedTuple):
    graph: tf.Graph
    x: tf.Tensor
    y: tf.Tensor
    saver: tf.compat.v1.train.Saver
    init: tf.Operation


def _tf1_graph(a: float, b: float, c: float) -> _Tf1Toy:
    """The TF1 toy graph with its variables initialised to ``a``, ``b``, ``c``."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 1], name="x")
        variables = [
            tf.compat.v1.get_variable(name, initializer=tf.constant(value, tf.float32), use_resource=True)
            for name, value in (("a", a), ("b", b), ("c", c))
        ]
        y = tf.identity(variables[0] * x + variables[1], name="y")
        saver = tf.compat.v1.train.Saver(variables, sharded=True)
        init = tf.compat.v1.global_variables_initializer()
    return _Tf1Toy(graph, x, y, saver, init)


def _export_tf1(savedmodel_dir: Path) -> None:
    toy = _tf1_graph(TOY_A, TOY_B, TOY_C)
    with tf.compat.v1.Session(graph=toy.graph) as sess:
        sess.run(toy.init)
        builder = tf.compat.v1.saved_model.Builder(str(savedmodel_dir))
        builder.add_meta_graph_and_variables(
            sess,
            [tf.saved_model.SERVING],
            signature_def_map={
                SIGNATURE_NAME: tf.compat.v1.saved_model.predict_signature_def({"x": toy.x}, {"y": toy.y})
            },
            saver=toy.saver,
            strip_default_attrs=True,
        )
        builder.save()


class _ToyModule(tf.Module):
    """The TF2 toy; its attribute names are the checkpoint keys (``a/.ATTRIBUTES/...``)."""

    def __init__(self, a: float, b: float, c: float) -> None:
        super().__init__(name="toy")
        self.a = tf.Variable(a, dtype=tf.float32, name="a")
        self.b = tf.Variable(b, dtype=tf.float32, name="b")
        self.c = tf.Variable(c, dtype=tf.float32, name="c")

    @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.float32, name="x")])
    def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"y": self.a * x + self.b}


def _require_eager() -> None:
    if not tf.executing_eagerly():
        raise RuntimeError("the TF2 toy needs eager execution (call it outside a tf.Graph context)")
