"""Trainer-side writer of full and incremental checkpoints in the layout of docs/checkpoints.md.

```
<run_dir>/model.ckpt-<step>.index|data                               full: every model variable
<run_dir>/.incremental_checkpoint/incremental_model.ckpt-<step>.*    delta since the last full
<run_dir>/checkpoint                                                  TF checkpoint state
```

A delta holds, for every embedding table, changed rows in the EmbeddingVariable export naming
(``<table>-keys`` int64 ids, ``<table>-values`` [n, dim], ``<table>-freqs`` how many saves
changed the row since the full, ``<table>-versions`` the step of its last change), the ids the
trainer removed (``<table>-removed_keys``), and every other variable whole, under its own name.
``delta_mode``:

* ``cumulative`` (DeepRec's): every row changed since the full checkpoint the delta follows and
  held now, and every id held at some save since that full (in it, or added since) and not held
  now, so the newest delta alone brings the full, or any earlier version of it, to its step;
* ``chain``: the rows changed and the ids removed since the previous delta (or the full), so a
  version is the full plus every delta after it, applied in order.

A row removed and added again in one interval is a changed row (removals apply first); one added
and removed again is a removed id (a no-op where it was never served).

**Tables.** Two kinds, both named by their checkpoint name:

* a 2-D variable (``tables``; default: :func:`embedding_tables` of ``variables``): its ids are
  its row numbers, every row held but those the trainer evicted: ``save_delta(step,
  removed={table: ids})`` names the rows evicted since the previous save; such a row stays
  removed until its value changes again (the trainer trained it: it is back). Serving resets a
  removed row of an engine-resident table to zeros and drops it from a feature store, so a
  trainer that evicts a row should reset it to zeros too;
* a keyed table (``keyed_tables``): a hash table the trainer keeps itself (an EmbeddingVariable,
  TFRA's dynamic embeddings, its own), given as a function returning its ids and rows now
  (int64 ``[n]``, ``[n, dim]``). The writer finds what was added, changed and removed by
  comparing with the previous save; fulls hold it in the export naming (``-keys``, ``-values``,
  ``-freqs``, ``-versions``), and a graph variable of the same name (a stand-in the serving
  graph looks rows up in) is left out of every checkpoint.

Each delta also records the step it was computed against
(:data:`~processor.checkpoint.delta.PARENT_TENSOR`), which lets the processor refuse a chain with
a missing link, and every checkpoint the time it was written
(:data:`~processor.checkpoint.delta.WRITTEN_AT_TENSOR`, seconds since the epoch: the processor's
freshness). Every checkpoint is published atomically (:mod:`.publish`). The format's names are
the reader's (:mod:`processor.checkpoint.delta`).

Use from any TensorFlow graph-mode training loop::

    writer = CheckpointWriter(sess, run_dir, model_variables)
    writer.save_full(step)                       # every F seconds
    writer.save_delta(step, removed={...})       # every D seconds

Not thread-safe: call from the training thread. Holds a copy of every table as of the last save
(the baseline the next delta is computed against).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from demo.trainer.publish import publish_checkpoint, update_state
from processor.checkpoint.delta import PARENT_TENSOR, REMOVED_SUFFIX, WRITTEN_AT_TENSOR
from processor.checkpoint.tensor_file import write_tensors

FULL_BASENAME = "model.ckpt"
DELTA_DIR = ".incremental_checkpoint"
DELTA_BASENAME = "incremental_model.ckpt"

KeyedTable = Callable[[], tuple[np.ndarray, np.ndarray]]


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


@dataclass
class _Rows:
    """A table at a save: its ids (sorted), their rows, last-change steps and change counts."""

    keys: np.ndarray
    values: np.ndarray
    versions: np.ndarray
    freqs: np.ndarray


@dataclass
class _Change:
    """One table's delta at a save, and the state to keep once it is published."""

    keys: np.ndarray        # ids whose rows the delta carries
    rows: _Rows             # the table now
    removed: np.ndarray     # ids the delta removes
    touched: np.ndarray     # cumulative: every id changed or removed since the full
    value: np.ndarray | None = None    # 2-D variables: the whole value now
    present: np.ndarray | None = None  # 2-D variables: the rows held now


def _changes(prev: _Rows, keys: np.ndarray, values: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray, _Rows]:
    """(mask of ``keys`` added or changed since ``prev``, ids of ``prev`` gone, the new state)."""
    pos = np.minimum(np.searchsorted(prev.keys, keys), max(len(prev.keys) - 1, 0))
    known = prev.keys[pos] == keys if len(prev.keys) else np.zeros(len(keys), bool)
    upsert = ~known
    if known.any():
        upsert[known] = np.any(prev.values[pos[known]] != values[known], axis=1)
    gone = np.setdiff1d(prev.keys, keys, assume_unique=True)
    versions = np.where(upsert, step, prev.versions[pos] if len(prev.keys) else step)
    freqs = np.where(known, prev.freqs[pos] if len(prev.keys) else 0, 0) + upsert
    return upsert, gone, _Rows(keys, values, versions.astype(np.int64), freqs.astype(np.int64))


def _sorted_table(name: str, keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    keys = np.asarray(keys, np.int64).reshape(-1)
    values = np.asarray(values)
    if values.ndim != 2 or len(values) != len(keys):
        raise ValueError(f"keyed table {name!r}: rows of shape {list(values.shape)} for {len(keys)} ids")
    order = np.argsort(keys, kind="stable")
    keys, values = keys[order], values[order]
    if len(keys) > 1 and np.any(keys[1:] == keys[:-1]):
        raise ValueError(f"keyed table {name!r}: repeated ids")
    return keys, values


def _stamp_saveable():
    """A saveable writing the time of the save as :data:`WRITTEN_AT_TENSOR` (restoring it is a
    no-op), so a full the Saver writes carries it too. Build inside the session's graph."""
    import tensorflow as tf
    from tensorflow.python.training.saving import saveable_object

    class _WrittenAt(saveable_object.SaveableObject):
        def __init__(self) -> None:
            now = tf.timestamp()
            super().__init__(now, [saveable_object.SaveSpec(now, "", WRITTEN_AT_TENSOR)], WRITTEN_AT_TENSOR)

        def restore(self, *_):  # the time of an old save is not restored anywhere
            return tf.no_op()

    return _WrittenAt()


class CheckpointWriter:
    """See the module doc. ``tables`` defaults to :func:`embedding_tables` of ``variables``;
    ``keyed_tables``: name -> a function giving that table's (ids, rows) now."""

    def __init__(self, session, run_dir: Path, variables: Sequence, tables: Sequence | None = None,
                 delta_mode: str = "cumulative", keyed_tables: Mapping[str, KeyedTable] | None = None) -> None:
        import tensorflow as tf

        if delta_mode not in ("cumulative", "chain"):
            raise ValueError(f"delta_mode must be 'cumulative' or 'chain', not {delta_mode!r}")
        self.delta_mode = delta_mode
        self.session = session
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.keyed = dict(keyed_tables or {})
        # a variable named like a keyed table stands in for it in the graph: never written
        self.variables = [v for v in variables if variable_name(v) not in self.keyed]
        self.tables = [t for t in (tables if tables is not None else embedding_tables(self.variables))
                       if variable_name(t) not in self.keyed]
        table_ops = {t.op.name for t in self.tables}
        self.dense = [v for v in self.variables if v.op.name not in table_ops]
        self._saver = None
        if not self.keyed:  # with keyed tables a full is written tensor by tensor (write_tensors)
            with session.graph.as_default():
                self._saver = tf.compat.v1.train.Saver(var_list=[*self.variables, _stamp_saveable()],
                                                       sharded=False)
        self._rows: dict[str, _Rows] = {}  # every table as of the last save
        self._touched: dict[str, np.ndarray] = {}  # cumulative: ids changed or removed since the full
        self._value: dict[str, np.ndarray] = {}  # 2-D variables: their value at the last save
        self._present: dict[str, np.ndarray] = {}  # 2-D variables: the rows held at the last save
        self._pending: dict[str, _Change] = {}  # computed by delta_tensors, kept once published
        self.full_step: int | None = None
        self._parent_step: int | None = None  # the checkpoint the next delta is computed against

    def save_full(self, step: int) -> Path:
        """Publish ``model.ckpt-<step>`` with every variable and keyed table; it becomes the
        baseline of the next deltas."""
        keyed: dict[str, _Rows] = {}
        if self._saver is not None:
            with self.session.graph.as_default():  # Saver.save needs graph mode
                prefix = publish_checkpoint(self.run_dir, FULL_BASENAME, step, lambda tmp: self._saver.save(
                    self.session, tmp, write_meta_graph=False, write_state=False))
        else:
            keyed = {name: self._keyed_rows(name, source, step) for name, source in self.keyed.items()}
            tensors = dict(zip(map(variable_name, self.variables), self.session.run(self.variables)))
            for name, rows in keyed.items():
                tensors.update({f"{name}-keys": rows.keys, f"{name}-values": rows.values,
                                f"{name}-freqs": rows.freqs, f"{name}-versions": rows.versions})
            tensors[WRITTEN_AT_TENSOR] = np.array(time.time(), np.float64)
            prefix = publish_checkpoint(self.run_dir, FULL_BASENAME, step, lambda tmp: write_tensors(tmp, tensors))
        self.full_step = step
        self._rebaseline(keyed)
        update_state(self.run_dir, FULL_BASENAME)
        return prefix

    def rebaseline(self) -> None:
        """Take the tables as they are now as the baseline of the next deltas (every row held).

        :meth:`save_full` does it; call it directly when resuming from a full checkpoint that
        is already published (and set ``full_step`` to its step).
        """
        step = self.full_step if self.full_step is not None else 0
        self._rebaseline({name: self._keyed_rows(name, source, step) for name, source in self.keyed.items()})

    def _rebaseline(self, keyed: dict[str, _Rows]) -> None:
        """The baseline: the 2-D variables now and the keyed tables' ``keyed`` (as just read)."""
        step = self.full_step if self.full_step is not None else 0
        for table, value in zip(self.tables, self.session.run(self.tables)):
            name = variable_name(table)
            keys = np.arange(len(value), dtype=np.int64)
            self._value[name], self._present[name] = value, np.ones(len(value), bool)
            self._rows[name] = _Rows(keys, value, np.full(len(keys), step, np.int64), np.zeros(len(keys), np.int64))
        for name, rows in keyed.items():  # change counts start again from the full
            self._rows[name] = _Rows(rows.keys, rows.values, rows.versions, np.zeros(len(rows.keys), np.int64))
        self._touched = {name: np.empty(0, np.int64) for name in self._rows}
        self._parent_step = self.full_step

    def _keyed_rows(self, name: str, source: KeyedTable, step: int) -> _Rows:
        """A keyed table now; versions and change counts carried from the last save where it
        held the id (a new id: ``step``)."""
        keys, values = _sorted_table(name, *source())
        prev = self._rows.get(name)
        if prev is None:
            return _Rows(keys, values, np.full(len(keys), step, np.int64), np.zeros(len(keys), np.int64))
        return _changes(prev, keys, values, step)[2]

    def save_delta(self, step: int, removed: Mapping[str, np.ndarray] | None = None) -> Path:
        """Publish ``incremental_model.ckpt-<step>``: the rows changed and ids removed (since the
        full, or the previous delta in a chain), dense variables whole. ``removed``: per 2-D
        variable table, the rows the trainer evicted since the previous save (see the module
        doc); a keyed table's removals are found by comparison (ids named for one must be gone)."""
        if self.full_step is None or not self._rows:
            raise RuntimeError("save_full must run before the first save_delta")
        if step <= self.full_step:
            raise ValueError(f"delta step {step} must be above the full step {self.full_step}")
        tensors = self.delta_tensors(step, removed)
        prefix = publish_checkpoint(self.run_dir / DELTA_DIR, DELTA_BASENAME, step,
                                    lambda tmp: write_tensors(tmp, tensors))
        for name, change in self._pending.items():  # published: the next delta starts from here
            self._rows[name], self._touched[name] = change.rows, change.touched
            if change.value is not None:
                self._value[name], self._present[name] = change.value, change.present
        self._pending = {}
        if self.delta_mode == "chain":  # the next link is computed against this one
            self._parent_step = step
        return prefix

    def delta_tensors(self, step: int, removed: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """The tensors of a delta at ``step`` (each table's changed rows and removed ids, dense
        variables, the markers); what to keep once it is published is held aside."""
        removed = dict(removed or {})
        unknown = set(removed) - set(self._rows)
        if unknown:
            raise ValueError(f"removed: {sorted(unknown)} are no tables of this writer")
        self._pending = {}
        for table, value in zip(self.tables, self.session.run(self.tables)):
            name = variable_name(table)
            self._pending[name] = self._variable_change(name, value, removed.get(name), step)
        for name, source in self.keyed.items():
            keys, values = _sorted_table(name, *source())
            gone = np.asarray(removed.get(name, ()), np.int64)
            if np.isin(gone, keys).any():
                raise ValueError(f"removed: {name!r} still holds ids named as removed")
            self._pending[name] = self._change(name, keys, values, step)
        tensors: dict[str, np.ndarray] = {}
        for name, change in self._pending.items():
            rows = change.rows
            at = np.searchsorted(rows.keys, change.keys)
            tensors[f"{name}-keys"] = change.keys
            tensors[f"{name}-values"] = rows.values[at]
            tensors[f"{name}-freqs"] = rows.freqs[at]
            tensors[f"{name}-versions"] = rows.versions[at]
            if len(change.removed):
                tensors[f"{name}{REMOVED_SUFFIX}"] = change.removed
        for variable, value in zip(self.dense, self.session.run(self.dense)):
            tensors[variable_name(variable)] = value
        tensors[PARENT_TENSOR] = np.array(self._parent_step if self._parent_step is not None else self.full_step,
                                          np.int64)
        tensors[WRITTEN_AT_TENSOR] = np.array(time.time(), np.float64)
        return tensors

    def _variable_change(self, name: str, value: np.ndarray, evicted, step: int) -> _Change:
        """A 2-D variable's change: rows held unless evicted now or before and unchanged since."""
        present = self._present[name] | np.any(value != self._value[name], axis=1)  # trained: held again
        if evicted is not None:
            evicted = np.asarray(evicted, np.int64)
            if len(evicted) and (evicted.min() < 0 or evicted.max() >= len(value)):
                raise ValueError(f"removed: {name!r} rows outside [0, {len(value)})")
            present[evicted] = False
        keys = np.flatnonzero(present).astype(np.int64)
        change = self._change(name, keys, value if present.all() else value[keys], step)
        change.value, change.present = value, present
        return change

    def _change(self, name: str, keys: np.ndarray, values: np.ndarray, step: int) -> _Change:
        upsert, gone, rows = _changes(self._rows[name], keys, values, step)
        if self.delta_mode == "chain":
            return _Change(keys[upsert], rows, gone, self._touched[name])
        touched = np.union1d(self._touched[name], np.union1d(keys[upsert], gone))
        return _Change(np.intersect1d(keys, touched, assume_unique=True), rows,
                       np.setdiff1d(touched, keys, assume_unique=True), touched)
