"""Which inputs of a request are its context: sent as one row for every row.

An input is *per row* when the signature fixes its rank and leaves its first dimension free
(``[-1, ...]``). A request whose per-row inputs do not all have the same number of rows, where
the larger number is N > 1, some have exactly one row and all others N, is a broadcast request:
each one-row input applies to every row, and the answer is that of the request with that row
repeated N times (:func:`tile`). Every other request runs as it is (inputs agreeing on their rows
run as always; other disagreements are the engine's to accept or refuse, as before).

With declared ``context_inputs`` only those may come as one row: a one-row per-row input the
model does not declare, beside inputs of N rows, is refused (InvalidArgument, 400) naming it and
the declared ones, so that a client's mistake is never broadcast.

Pure and thread-safe (a RowPlan is immutable).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..echo import shorten
from ..errors import ConfigError, InvalidArgument
from ..signature import Signature


def per_row_inputs(signature: Signature) -> tuple[str, ...]:
    """The aliases of the inputs ``signature`` takes per row (rank fixed, first dimension free)."""
    return tuple(alias for alias, spec in signature.inputs.items() if spec.shape and spec.shape[0] == -1)


class RowPlan:
    """One signature's broadcast rule. ``declared``: the model's ``context_inputs`` as aliases
    (None: any per-row input may come as one row)."""

    def __init__(self, signature: Signature, declared: frozenset[str] | None = None) -> None:
        self.signature = signature
        self.per_row = per_row_inputs(signature)
        self.declared = declared

    @classmethod
    def for_config(cls, signature: Signature, context_inputs: Iterable[str] | None) -> RowPlan:
        """The plan of ``signature`` with the config's ``context_inputs`` (names: aliases or tensor
        names); ConfigError naming one the signature lacks or does not take per row."""
        if context_inputs is None:
            return cls(signature)
        aliases = []
        for name in context_inputs:
            spec = signature.inputs.get(name) or next(
                (s for s in signature.inputs.values() if s.name == name), None)
            if spec is None:
                raise ConfigError(f"context_inputs: {shorten(name, 80)} is not an input of signature "
                                  f"{signature.name!r} (it takes {sorted(signature.inputs)})")
            if not spec.shape or spec.shape[0] != -1:
                raise ConfigError(f"context_inputs: input {spec.alias!r} has shape "
                                  f"{list(spec.shape) if spec.shape is not None else 'unknown'}; a context "
                                  f"input must be taken per row (a known rank, its first dimension free)")
            aliases.append(spec.alias)
        return cls(signature, frozenset(aliases))

    def broadcast(self, feeds: dict[str, np.ndarray]) -> tuple[int, frozenset[str]] | None:
        """(N, the aliases of the one-row inputs) of a broadcast request, else None (see the
        module doc); InvalidArgument for a one-row input the declared context does not name.
        The request path's check: one pass over the per-row inputs' first dimensions."""
        low = high = -1
        for alias in self.per_row:
            array = feeds.get(alias)
            if array is None or not array.ndim:
                continue
            n = array.shape[0]
            if low < 0:
                low = high = n
            elif n < low:
                low = n
            elif n > high:
                high = n
        if low != 1 or high <= 1:
            return None
        ones = []
        for alias in self.per_row:
            array = feeds.get(alias)
            if array is None or not array.ndim:
                continue
            n = array.shape[0]
            if n == 1:
                ones.append(alias)
            elif n != high:
                return None  # three different row counts: not a broadcast, the engine decides
        declared = self.declared
        if declared is not None:
            stray = [alias for alias in ones if alias not in declared]
            if stray:
                raise InvalidArgument(
                    f"input {stray[0]!r} has 1 row where the request's other inputs have {high}: this model "
                    f"takes only its context_inputs {sorted(declared)} as one row for every row; send "
                    f"{stray[0]!r} with {high} rows")
        return high, frozenset(ones)


def tile(feeds: dict[str, np.ndarray], ones: Iterable[str], rows: int) -> dict[str, np.ndarray]:
    """``feeds`` with each one-row input of ``ones`` repeated to ``rows`` rows (contiguous): the
    tiled request, whose answer a broadcast request gets."""
    out = dict(feeds)
    for alias in ones:
        out[alias] = repeat_rows(feeds[alias], rows)
    return out


def repeat_rows(array: np.ndarray, rows: int) -> np.ndarray:
    """A one-row array repeated to ``rows`` rows, as a new contiguous array (engines read it)."""
    return np.ascontiguousarray(np.broadcast_to(array, (rows, *array.shape[1:])))
