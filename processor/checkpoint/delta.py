"""Reads an incremental checkpoint and checks it against the served model's variables.

Reading and checking happen off the request path; the result is a :class:`Delta` that an engine
applies in one step. Accepts DeepRec's own naming too: ``<table>-sparse_incr_keys`` /
``-sparse_incr_values``.
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
# delta), written by our CheckpointWriter; deltas from other writers have none.
PARENT_TENSOR = "_delta_parent_step"


@dataclass
class Delta:
    """Changed rows per table (row ids, values) and whole dense values, keyed by variable name."""

    step: int
    rows: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    dense: dict[str, np.ndarray] = field(default_factory=dict)
    parent_step: int | None = None  # PARENT_TENSOR, when the delta carries it

    @property
    def changed_rows(self) -> int:
        return sum(len(k) for k, _ in self.rows.values())

    def set_dense(self, prefix: str, name: str, value: np.ndarray, info: VariableInfo) -> None:
        """``dense[name] = value`` in the variable's dtype; CheckpointError naming the delta
        ``prefix`` when the shape is not the model's."""
        if tuple(value.shape) != info.shape:
            raise CheckpointError(f"delta {prefix!r}: {name!r} has shape {list(value.shape)}, "
                                  f"the model's is {list(info.shape)}")
        self.dense[name] = value.astype(info.dtype, copy=False)

    def check_not_empty(self, prefix: str) -> None:
        """CheckpointError when the delta holds no tensor of the model."""
        if not self.rows and not self.dense:
            raise CheckpointError(f"delta {prefix!r} holds no tensor of the model")


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
    for name, value in tensors.items():
        if name == PARENT_TENSOR:
            delta.parent_step = int(value)
            continue
        if name in used or name == "global_step" and name not in variables:
            continue
        info = variables.get(name)
        if info is None:
            raise CheckpointError(f"delta {prefix!r}: tensor {name!r} is not a variable of the model")
        delta.set_dense(prefix, name, value, info)
    delta.check_not_empty(prefix)
    return delta
