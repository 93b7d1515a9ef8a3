"""In-place parameter updates for a live TensorFlow Session (delta checkpoints).

:class:`VariableUpdater` finds the graph's resource variables and builds, once, the ops that
overwrite chosen rows (``ResourceScatterUpdate``) or a whole value (``AssignVariableOp``). An
update is applied with ONE ``Session.run``; the caller serializes it against requests (see
:class:`~processor.engine.session_group.SessionGroup`). Building ops takes a lock; ``apply`` is
safe to call from any thread but not concurrently with itself.
"""

from __future__ import annotations

import numpy as np

from ..checkpoint.delta import CheckpointError, Delta, VariableInfo

_RESOURCE_VARIABLE_OPS = ("VarHandleOp",)


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
