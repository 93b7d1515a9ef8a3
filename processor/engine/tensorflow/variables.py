"""In-place parameter updates for a live TensorFlow Session (delta checkpoints).

:class:`VariableUpdater` finds the graph's resource variables and builds, once, the ops that
overwrite chosen rows (``ResourceScatterUpdate``) or a whole value (``AssignVariableOp``). An
update is applied with ONE ``Session.run``; the caller serializes it against requests (see
:class:`~processor.engine.session_group.SessionGroup`). Building ops takes a lock; ``apply`` is
safe to call from any thread but not concurrently with itself.
"""

from __future__ import annotations

import numpy as np

from ...checkpoint.delta import CheckpointError, Delta, VariableInfo
from ...config import shorten
from ...errors import ConfigError

_RESOURCE_VARIABLE_OPS = ("VarHandleOp",)
_VARIABLE_OPS = ("VarHandleOp", "VariableV2")


def restored_variables(graph, session) -> set[str]:
    """The names of the graph's variables that hold a value (the SavedModel loaded, restored and
    its init ops run).

    A Keras 3 export (``model.export``) tracks each variable twice: the graph holds a second
    handle per variable that neither the saver restores nor the signature reads. Those are no
    parameter of the model (reading one fails: "Could not find variable"), so callers that list
    the model's parameters take these names only.
    """
    import tensorflow as tf

    ops = [op for op in graph.get_operations() if op.type in _VARIABLE_OPS]
    if not ops:
        return set()
    with graph.as_default(), tf.name_scope("processor_restored"):
        checks = {op.name: (tf.raw_ops.VarIsInitializedOp(resource=op.outputs[0]) if op.type == "VarHandleOp"
                            else tf.raw_ops.IsVariableInitialized(ref=op.outputs[0])) for op in ops}
    return {name for name, initialized in session.run(checks).items() if initialized}


def check_outputs_restored(graph, restored: set[str], outputs: list[str], savedmodel_dir: str) -> None:
    """Refuse a SavedModel whose signature reads a variable its saver never restores.

    That is what ``tf.saved_model.save(keras_3_model)`` writes: the signature's function reads
    handles the checkpoint does not fill (Keras 3 tracks its variables apart from the graph), so
    every request would fail ("Could not find variable"). TF Serving's loader fails the same
    way; Keras 3's own answer is ``model.export()``.

    Raises:
        ConfigError: naming ``savedmodel_dir``, the first such variables and the fix.
    """
    seen, stack, unread = set(), [graph.get_tensor_by_name(name).op for name in outputs], []
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        if op.type in _VARIABLE_OPS and op.name not in restored:
            unread.append(op.name)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    if unread:
        raise ConfigError(
            f"savedmodel_dir: the signature of {shorten(savedmodel_dir)} reads variables the SavedModel does "
            f"not restore ({shorten(sorted(unread), 200)}): a Keras 3 model saved with tf.saved_model.save() "
            f"writes this; export it with model.export() (what TF Serving serves too)")


def variable_bytes(graph, session, names: set[str]) -> dict[str, int]:
    """The bytes of the variables ``names`` of ``graph`` as loaded, by memory part
    (:data:`processor.memory.PARTS`): ``weights`` (host) and ``device`` (those whose op asks for
    a GPU: the device TensorFlow was asked for; soft placement may still have kept one on the
    CPU). Shape x dtype size each, the shape from the op's static attribute, or asked of the
    session in one run for the variables whose shape the graph leaves open. Call once, at load
    (the sizes are fixed after it: deltas overwrite rows, they add none)."""
    import tensorflow as tf

    ops = [op for op in graph.get_operations() if op.type in _VARIABLE_OPS and op.name in names]
    shapes: dict[str, tuple[int, ...]] = {}
    open_shapes = []
    for op in ops:
        proto = op.get_attr("shape")
        dims = tuple(d.size for d in proto.dim)
        if proto.unknown_rank or any(d < 0 for d in dims):
            open_shapes.append(op)
        else:
            shapes[op.name] = dims
    if open_shapes:
        with graph.as_default(), tf.name_scope("processor_memory"):
            asked = {op.name: (tf.raw_ops.VariableShape(input=op.outputs[0], out_type=tf.int64)
                               if op.type == "VarHandleOp" else tf.shape(op.outputs[0], out_type=tf.int64))
                     for op in open_shapes}
        shapes.update({name: tuple(int(d) for d in shape) for name, shape in session.run(asked).items()})
    out = {"weights": 0, "device": 0}
    for op in ops:
        size = int(np.prod(shapes[op.name], dtype=np.int64)) * np.dtype(op.get_attr("dtype").as_numpy_dtype).itemsize
        out["device" if "GPU" in op.device.upper() else "weights"] += size
    return out


class VariableUpdater:
    """See the module doc."""

    def __init__(self, graph, session, run_options=None) -> None:
        import tensorflow as tf

        self._session = session
        self._run_options = run_options
        self.variables: dict[str, VariableInfo] = {}
        self._row_ops: dict[str, tuple] = {}
        self._assign_ops: dict[str, tuple] = {}
        variable_ops = [op for op in graph.get_operations() if op.type in _RESOURCE_VARIABLE_OPS]
        with graph.as_default(), tf.name_scope("processor_delta"):
            for op in variable_ops:
                shape = tuple(d.size for d in op.get_attr("shape").dim)
                info = VariableInfo(shape, np.dtype(op.get_attr("dtype").as_numpy_dtype))
                self.variables[op.name] = info
                holder = tf.compat.v1.placeholder(info.dtype, shape)
                self._assign_ops[op.name] = (
                    tf.raw_ops.AssignVariableOp(resource=op.outputs[0], value=holder), holder)
                if len(shape) == 2:
                    ids = tf.compat.v1.placeholder(tf.int64, [None])
                    updates = tf.compat.v1.placeholder(info.dtype, [None, shape[1]])
                    self._row_ops[op.name] = (tf.raw_ops.ResourceScatterUpdate(
                        resource=op.outputs[0], indices=ids, updates=updates), ids, updates)

    def apply(self, delta: Delta) -> None:
        """Write ``delta`` into the session's variables in one run."""
        ops, feed = [], {}
        for name, (keys, values) in delta.rows.items():
            op, ids, updates = self._row_ops[name]
            ops.append(op)
            feed[ids], feed[updates] = keys, values
        for name, value in delta.dense.items():
            op, holder = self._assign_ops[name]
            ops.append(op)
            feed[holder] = value
        try:
            self._session.run(ops, feed, options=self._run_options)
        except Exception as exc:
            raise CheckpointError(f"applying delta {delta.step} failed: {type(exc).__name__}: {exc}") from exc
