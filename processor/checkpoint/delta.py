"""Reads an incremental checkpoint and checks it against the served model's variables.

Reading and checking happen off the request path; the result is a :class:`Delta` that an engine
applies in one step. Accepts DeepRec's own naming too: ``<table>-sparse_incr_keys`` /
``-sparse_incr_values``.

**Removals.** A delta may name, per table, the ids the trainer removed: ``<table>-removed_keys``
(int64), beside ``-keys`` / ``-values`` (or DeepRec's ``-sparse_incr_keys`` /
``-sparse_incr_values``) or alone. Within one delta removals come first, then the rows: an id
in both ends up held, with its row. A removed id is then served as an id never seen: the
feature stores drop it (:mod:`processor.features`); an engine-resident table of fixed size (a
TensorFlow variable, an ONNX initializer) has no absent rows, so :func:`read_delta` turns its
removals into rows reset to the default value (zeros).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ..errors import Internal
from .tensor_file import read_tensors


class CheckpointError(Internal):
    """A checkpoint is unreadable, incomplete or does not fit the model."""


@dataclass(frozen=True)
class VariableInfo:
    shape: tuple[int, ...]
    dtype: np.dtype


# The step of the checkpoint a delta was computed against (its full, or in a chain the previous
# delta), written by our CheckpointWriter (demo/trainer/writer.py); deltas from other writers have none.
PARENT_TENSOR = "_delta_parent_step"
# When the trainer wrote the checkpoint (float64 seconds since the epoch), written by our
# CheckpointWriter into fulls and deltas; the processor's freshness falls back to the files' mtime.
WRITTEN_AT_TENSOR = "_written_at"
# The ids a delta removes from a table: ``<table>-removed_keys`` (see the module doc).
REMOVED_SUFFIX = "-removed_keys"
MARKERS = (PARENT_TENSOR, WRITTEN_AT_TENSOR)  # scalars of the writer's, no variable of the model


@dataclass
class Delta:
    """Changed rows per table (row ids, values), removed ids per table and whole dense values,
    keyed by variable name. ``removed``: the ids the delta removes (applied before ``rows``);
    for engine-resident tables they are in ``rows`` too, as rows of the default value
    (:func:`read_delta`), and ``removed`` only counts them."""

    step: int
    rows: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    dense: dict[str, np.ndarray] = field(default_factory=dict)
    parent_step: int | None = None  # PARENT_TENSOR, when the delta carries it
    removed: dict[str, np.ndarray] = field(default_factory=dict)
    written_at: float | None = None  # WRITTEN_AT_TENSOR, when the delta carries it

    @property
    def changed_rows(self) -> int:
        """Rows written (resets of removed rows of engine-resident tables included)."""
        return sum(len(k) for k, _ in self.rows.values())

    @property
    def removed_rows(self) -> int:
        return sum(len(k) for k in self.removed.values())

    def set_dense(self, prefix: str, name: str, value: np.ndarray, info: VariableInfo) -> None:
        """``dense[name] = value`` in the variable's dtype; CheckpointError naming the delta
        ``prefix`` when the shape is not the model's."""
        if tuple(value.shape) != info.shape:
            raise CheckpointError(f"delta {prefix!r}: {name!r} has shape {list(value.shape)}, "
                                  f"the model's is {list(info.shape)}")
        self.dense[name] = value.astype(info.dtype, copy=False)

    def check_not_empty(self, prefix: str) -> None:
        """CheckpointError when the delta holds no tensor of the model."""
        if not self.rows and not self.dense and not self.removed:
            raise CheckpointError(f"delta {prefix!r} holds no tensor of the model")

    def set_marker(self, name: str, value: np.ndarray) -> None:
        """Take one of the writer's scalar :data:`MARKERS` (parent step, written at)."""
        if name == PARENT_TENSOR:
            self.parent_step = int(value)
        else:
            self.written_at = float(value)


def removed_ids(prefix: str, name: str, keys: np.ndarray) -> np.ndarray:
    """``<table>-removed_keys`` as distinct int64 ids; CheckpointError unless it is a vector."""
    if keys.ndim != 1:
        raise CheckpointError(f"delta {prefix!r}: {name!r} has shape {list(keys.shape)}, expected [n]")
    return np.unique(keys.astype(np.int64, copy=False))


_KEY_SUFFIXES = ("-keys", "-sparse_incr_keys")
_VALUE_SUFFIX = {"-keys": "-values", "-sparse_incr_keys": "-sparse_incr_values"}
_METADATA = ("-freqs", "-versions", "-keys_filtered", "-freqs_filtered")


def read_delta(prefix: str, step: int, variables: Mapping[str, VariableInfo]) -> Delta:
    """Read ``prefix`` and check every tensor against ``variables``; raise CheckpointError."""
    try:
        tensors = read_tensors(prefix)
    except Exception as exc:  # the reader raises several types for a corrupt bundle
        raise CheckpointError(f"cannot read delta {prefix!r}: {type(exc).__name__}: {exc}") from exc
    delta = Delta(step)
    used: set[str] = set()
    for name, ids in tensors.items():  # removals first: the rows below fold them in
        if name.endswith(REMOVED_SUFFIX):
            table = name[: -len(REMOVED_SUFFIX)]
            info = variables.get(table)
            if info is None or len(info.shape) != 2:
                raise CheckpointError(f"delta {prefix!r}: {name!r} names no 2-D variable of the model")
            ids = removed_ids(prefix, name, ids)
            if len(ids) and (ids[0] < 0 or ids[-1] >= info.shape[0]):
                raise CheckpointError(f"delta {prefix!r}: {name!r} holds row ids outside [0, {info.shape[0]})")
            delta.removed[table] = ids
            used.add(name)
    for name, keys in tensors.items():
        suffix = next((s for s in _KEY_SUFFIXES if name.endswith(s)), None)
        if suffix is None:
            continue
        table = name[: -len(suffix)]
        values_name = table + _VALUE_SUFFIX[suffix]
        values = tensors.get(values_name)
        info = variables.get(table)
        if info is None:
            raise CheckpointError(f"delta {prefix!r}: table {table!r} is not a variable of the model")
        if values is None:
            raise CheckpointError(f"delta {prefix!r}: {name!r} has no {values_name!r}")
        if len(info.shape) != 2 or values.ndim != 2 or values.shape != (len(keys), info.shape[1]):
            raise CheckpointError(f"delta {prefix!r}: {values_name!r} has shape {list(values.shape)}, "
                                  f"expected [{len(keys)}, {info.shape[1] if len(info.shape) == 2 else '?'}]")
        keys = keys.astype(np.int64, copy=False)
        if len(keys) and (keys.min() < 0 or keys.max() >= info.shape[0]):
            raise CheckpointError(f"delta {prefix!r}: {name!r} holds row ids outside [0, {info.shape[0]})")
        delta.rows[table] = (keys, values.astype(info.dtype, copy=False))
        used.update({name, values_name})
        used.update(table + m for m in _METADATA)
    for table, ids in delta.removed.items():  # fixed-size tables: a removed row is reset
        info = variables[table]
        keys, values = delta.rows.get(table, (np.empty(0, np.int64), np.empty((0, info.shape[1]), info.dtype)))
        reset = np.setdiff1d(ids, keys)  # an id the delta also writes keeps its row
        delta.rows[table] = (np.concatenate((reset, keys)),
                             np.concatenate((np.zeros((len(reset), info.shape[1]), info.dtype), values)))
    for name, value in tensors.items():
        if name in MARKERS:
            delta.set_marker(name, value)
            continue
        if name in used or name == "global_step" and name not in variables:
            continue
        info = variables.get(name)
        if info is None:
            raise CheckpointError(f"delta {prefix!r}: tensor {name!r} is not a variable of the model")
        delta.set_dense(prefix, name, value, info)
    delta.check_not_empty(prefix)
    return delta
