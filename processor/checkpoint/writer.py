"""Trainer-side writer of full and incremental checkpoints in the layout of docs/checkpoints.md.

```
<run_dir>/model.ckpt-<step>.index|data                               full: every model variable
<run_dir>/.incremental_checkpoint/incremental_model.ckpt-<step>.*    delta since the last full
<run_dir>/checkpoint                                                  TF checkpoint state
```

A delta holds, for every embedding table, changed rows in the EmbeddingVariable export naming
(``<table>-keys`` int64 row ids, ``<table>-values`` [n, dim], ``<table>-freqs`` how many deltas
changed the row, ``<table>-versions`` the step of its last change), and every other variable
whole, under its own name. ``delta_mode``:

* ``cumulative`` (DeepRec's): every row changed since the full checkpoint the delta follows, so
  the newest delta alone brings the full to its step;
* ``chain``: the rows changed since the previous delta (or the full), so a version is the full
  plus every delta after it, applied in order.

Each delta also records the step it was computed against (:data:`~.delta.PARENT_TENSOR`), which
lets the processor refuse a chain with a missing link. Every checkpoint is published
atomically (:mod:`.publish`).

Use from any TensorFlow graph-mode training loop::

    writer = CheckpointWriter(sess, run_dir, model_variables)
    writer.save_full(step)     # every F seconds
    writer.save_delta(step)    # every D seconds

Not thread-safe: call from the training thread. Holds a copy of the embedding tables as of the
last full checkpoint (the baseline deltas are computed against).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .delta import PARENT_TENSOR
from .publish import publish_checkpoint, update_state
from .tensor_file import write_tensors

FULL_BASENAME = "model.ckpt"
DELTA_DIR = ".incremental_checkpoint"
DELTA_BASENAME = "incremental_model.ckpt"


def variable_name(variable) -> str:
    """The checkpoint key of a graph-mode variable (its op name)."""
    return variable.op.name


def embedding_tables(variables: Sequence) -> list:
    """The variables an embedding lookup reads: 2-D variables consumed by a gather op."""
    tables = []
    for v in variables:
        if len(v.shape) != 2:
            continue
        consumers = {c.type for c in v.op.outputs[0].consumers()}
        if consumers & {"ResourceGather", "GatherV2", "Gather", "ResourceGatherNd"}:
            tables.append(v)
    return tables


class CheckpointWriter:
    """See the module doc. ``tables`` defaults to :func:`embedding_tables` of ``variables``."""

    def __init__(self, session, run_dir: Path, variables: Sequence, tables: Sequence | None = None,
                 delta_mode: str = "cumulative") -> None:
        import tensorflow as tf

        if delta_mode not in ("cumulative", "chain"):
            raise ValueError(f"delta_mode must be 'cumulative' or 'chain', not {delta_mode!r}")
        self.delta_mode = delta_mode
        self.session = session
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.variables = list(variables)
        self.tables = list(tables) if tables is not None else embedding_tables(self.variables)
        table_ops = {t.op.name for t in self.tables}
        self.dense = [v for v in self.variables if v.op.name not in table_ops]
        with session.graph.as_default():
            self._saver = tf.compat.v1.train.Saver(var_list=self.variables, sharded=False)
        self._baseline: dict[str, np.ndarray] | None = None
        self._freqs: dict[str, np.ndarray] = {}
        self._versions: dict[str, np.ndarray] = {}
        self.full_step: int | None = None
        self._parent_step: int | None = None  # the checkpoint the next delta is computed against
        self._pending_baseline: dict[str, np.ndarray] = {}  # chain mode: the next link's baseline

    def save_full(self, step: int) -> Path:
        """Publish ``model.ckpt-<step>`` with every variable; it becomes the delta baseline."""
        with self.session.graph.as_default():  # Saver.save needs graph mode
            prefix = publish_checkpoint(self.run_dir, FULL_BASENAME, step, lambda tmp: self._saver.save(
                self.session, tmp, write_meta_graph=False, write_state=False))
        self.full_step = step
        self.rebaseline()
        update_state(self.run_dir, FULL_BASENAME)
        return prefix

    def rebaseline(self) -> None:
        """Take the current table values as the baseline of the next deltas.

        :meth:`save_full` does it; call it directly when resuming from a full checkpoint that
        is already published (and set ``full_step`` to its step).
        """
        values = self.session.run(self.tables)
        self._baseline = {variable_name(t): v for t, v in zip(self.tables, values)}
        self._parent_step = self.full_step
        self._freqs = {n: np.zeros(v.shape[0], np.int64) for n, v in self._baseline.items()}
        self._versions = {n: np.full(v.shape[0], -1, np.int64) for n, v in self._baseline.items()}

    def save_delta(self, step: int) -> Path:
        """Publish ``incremental_model.ckpt-<step>``: rows changed since the full, dense whole."""
        if self._baseline is None or self.full_step is None:
            raise RuntimeError("save_full must run before the first save_delta")
        if step <= self.full_step:
            raise ValueError(f"delta step {step} must be above the full step {self.full_step}")
        tensors = self.delta_tensors(step)
        prefix = publish_checkpoint(self.run_dir / DELTA_DIR, DELTA_BASENAME, step,
                                    lambda tmp: write_tensors(tmp, tensors))
        if self.delta_mode == "chain":  # the next link is computed against this one
            self._baseline = self._pending_baseline
            self._parent_step = step
        return prefix

    def delta_tensors(self, step: int) -> dict[str, np.ndarray]:
        """The tensors of a delta at ``step`` (changed rows of each table, dense variables)."""
        table_values = self.session.run(self.tables)
        dense_values = self.session.run(self.dense)
        tensors: dict[str, np.ndarray] = {}
        self._pending_baseline = {}
        for table, current in zip(self.tables, table_values):
            name = variable_name(table)
            base = self._baseline[name]
            changed_now = np.flatnonzero(np.any(current != base, axis=1))
            self._freqs[name][changed_now] += 1
            self._versions[name][changed_now] = step
            if self.delta_mode == "chain":  # the rows changed since the previous checkpoint
                rows = changed_now
                self._pending_baseline[name] = current  # the next link's baseline, once published
            else:  # every row that ever changed since the full, with its current value
                rows = np.flatnonzero(self._versions[name] >= 0)
            tensors[f"{name}-keys"] = rows.astype(np.int64)
            tensors[f"{name}-values"] = current[rows]
            tensors[f"{name}-freqs"] = self._freqs[name][rows]
            tensors[f"{name}-versions"] = self._versions[name][rows]
        for variable, value in zip(self.dense, dense_values):
            tensors[variable_name(variable)] = value
        tensors[PARENT_TENSOR] = np.array(self._parent_step if self._parent_step is not None else self.full_step,
                                          np.int64)
        return tensors
