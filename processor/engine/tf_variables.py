"""In-place parameter updates for a live TensorFlow Session (delta checkpoints).

:class:`VariableUpdater` finds the graph's resource variables and builds, once, the ops that
overwrite chosen rows (``ResourceScatterUpdate``) or a whole value (``AssignVariableOp``). An
update is applied with ONE ``Session.run``; the caller serializes it against requests (see
:class:`~processor.engine.session_group.SessionGroup`). Building ops takes a lock; ``apply`` is
safe to call from any thread but not concurrently with itself.
"""

from __future__ import annotations

import threading

import numpy as np

from ..checkpoint.delta import CheckpointError, Delta, VariableInfo

_RESOURCE_VARIABLE_OPS = ("VarHandleOp",)


class VariableUpdater:
    """See the module doc."""

    def __init__(self, graph, session, run_options=None) -> None:
        self._graph = graph
        self._session = session
        self._run_options = run_options
        self._lock = threading.Lock()
        self._row_ops: dict[str, tuple] = {}
        self._assign_ops: dict[str, tuple] = {}
        self.variables: dict[str, VariableInfo] = {}
        self._handles = {}
        for op in graph.get_operations():
            if op.type in _RESOURCE_VARIABLE_OPS:
                shape = tuple(d.size for d in op.get_attr("shape").dim)
                self.variables[op.name] = VariableInfo(shape, np.dtype(op.get_attr("dtype").as_numpy_dtype))
                self._handles[op.name] = op.outputs[0]

    def apply(self, delta: Delta) -> None:
        """Write ``delta`` into the session's variables in one run."""
        ops, feed = [], {}
        with self._lock:
            for name, (keys, values) in delta.rows.items():
                op, ids, updates = self._row_op(name)
                ops.append(op)
                feed[ids], feed[updates] = keys, values
            for name, value in delta.dense.items():
                op, holder = self._assign_op(name)
                ops.append(op)
                feed[holder] = value
        try:
            self._session.run(ops, feed, options=self._run_options)
        except Exception as exc:
            raise CheckpointError(f"applying delta {delta.step} failed: {type(exc).__name__}: {exc}") from None

    def _row_op(self, name: str):
        if name not in self._row_ops:
            import tensorflow as tf

            info = self.variables[name]
            with self._graph.as_default(), tf.name_scope("processor_delta"):
                ids = tf.compat.v1.placeholder(tf.int64, [None])
                updates = tf.compat.v1.placeholder(info.dtype, [None, info.shape[1]])
                op = tf.raw_ops.ResourceScatterUpdate(resource=self._handles[name], indices=ids, updates=updates)
            self._row_ops[name] = (op, ids, updates)
        return self._row_ops[name]

    def _assign_op(self, name: str):
        if name not in self._assign_ops:
            import tensorflow as tf

            info = self.variables[name]
            with self._graph.as_default(), tf.name_scope("processor_delta"):
                holder = tf.compat.v1.placeholder(info.dtype, info.shape)
                op = tf.raw_ops.AssignVariableOp(resource=self._handles[name], value=holder)
            self._assign_ops[name] = (op, holder)
        return self._assign_ops[name]
