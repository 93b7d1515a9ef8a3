"""KeyReplay: a store-served graph's lookup keys computed in numpy, without a TensorFlow run.

The split run (:mod:`.embedding_lookup`) first runs the graph up to the key tensors of its
lookups. In recommendation graphs that part is small and regular: the id inputs, a ``FloorMod``
by the table's rows, an ``Unpack`` per feature, a ``StringToHashBucketFast`` of string features,
reshapes and casts. A TensorFlow run of it costs more than the work (a Session call, its
executor, the inter-op pool's hand-offs: ~0.3 ms of a batch-256 request here). When every op
between the inputs and the keys is one of :data:`OPS`, this module replays them in numpy with
TensorFlow's semantics (floor and truncated modulo, ``Fingerprint64`` bucket hashing via
:mod:`processor.engine.string_hash`'s native hash, C casts); otherwise :meth:`KeyReplay.build` returns None and the
TensorFlow run stays. Tested equal, values, dtypes and shapes, to the TensorFlow run.

Immutable after :meth:`build`; thread-safe.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...errors import InvalidArgument
from ..string_hash import hash_buckets

Step = tuple[tuple[str, ...], Callable[..., Any], tuple[str, ...]]  # (outputs, fn, inputs)


def _unpack(op) -> Callable[[np.ndarray], tuple[np.ndarray, ...]]:
    axis, num = op.get_attr("axis"), op.get_attr("num")

    def run(x):
        if x.shape[axis] != num:
            raise ValueError(f"{op.name}: dimension {axis} of {list(x.shape)} is not {num}")
        # one copy with the axis first; its rows are the outputs, each contiguous (what the
        # store's lookup reads without another copy)
        first = axis % x.ndim
        if first:
            x = x.transpose((first, *range(first), *range(first + 1, x.ndim)))
        return tuple(np.ascontiguousarray(x))

    return run


def _cast(op) -> Callable[[np.ndarray], np.ndarray]:
    dtype = op.get_attr("DstT").as_numpy_dtype
    return lambda x: x.astype(dtype)


def _squeeze(op) -> Callable[[np.ndarray], np.ndarray]:
    dims = tuple(op.get_attr("squeeze_dims"))
    return lambda x: np.squeeze(x, axis=dims or None)


def _hash(op) -> Callable[[np.ndarray], np.ndarray]:
    buckets = op.get_attr("num_buckets")
    return lambda x: hash_buckets(x, buckets)  # native where built (GIL released)


def _int_mod(np_mod):
    def make(op):
        divisor = op.inputs[1]
        if divisor.op.type == "Const" and np.all(_const(divisor) != 0):
            return np_mod  # a constant divisor is checked here, once, not on every request
        return lambda x, y: np_mod(x, y) if np.all(y != 0) else _zero_division(op)
    return make


def _const(tensor) -> np.ndarray:
    from tensorflow.python.framework import tensor_util

    return tensor_util.MakeNdarray(tensor.op.get_attr("value"))


def _zero_division(op):
    raise ValueError(f"{op.name}: Integer division by zero")


# op type -> (op -> the function of its input values); a tuple result is the op's outputs
OPS: dict[str, Callable[[Any], Callable[..., Any]]] = {
    "Identity": lambda op: lambda x: x,
    "StopGradient": lambda op: lambda x: x,
    "FloorMod": _int_mod(np.mod),  # numpy's % is floor modulo, as TensorFlow's FloorMod
    "Mod": _int_mod(np.fmod),  # truncated, as TensorFlow's Mod / TruncateMod on integers
    "TruncateMod": _int_mod(np.fmod),
    "Unpack": _unpack,
    "StringToHashBucketFast": _hash,
    "Cast": _cast,
    "Reshape": lambda op: lambda x, shape: np.reshape(x, tuple(int(d) for d in shape)),
    "ExpandDims": lambda op: lambda x, axis: np.expand_dims(x, int(np.asarray(axis).reshape(-1)[0])),
    "Squeeze": _squeeze,
}
_INTEGER_ONLY = {"FloorMod", "Mod", "TruncateMod"}


class KeyReplay:
    """See the module doc. Call it with the feeds (in ``feed_tensors`` order) of :meth:`build`;
    it returns the key tensors' values in ``key_tensors`` order. Raises InvalidArgument where
    TensorFlow's run refuses the input (a wrong dimension, a zero divisor, a bad value)."""

    def __init__(self, feeds: tuple[str, ...], constants: dict[str, np.ndarray], steps: list[Step],
                 keys: tuple[str, ...], op_types: tuple[str, ...]) -> None:
        self._feeds = feeds
        self._constants = constants
        self._steps = steps
        self._keys = keys
        self.op_types = op_types

    @classmethod
    def build(cls, feed_tensors: Sequence[Any], key_tensors: Sequence[Any]) -> KeyReplay | None:
        """The replay of the graph part from ``feed_tensors`` to ``key_tensors`` (graph
        tensors), or None when it holds an op that is not replayed."""
        feeds = tuple(t.name for t in feed_tensors)
        constants: dict[str, np.ndarray] = {}
        steps: list[Step] = []
        types: set[str] = set()
        done: set[str] = set(feeds)

        def visit(tensor) -> bool:
            if tensor.name in done:
                return True
            op = tensor.op
            if op.type == "Const":
                constants[tensor.name] = _const(tensor)
                done.add(tensor.name)
                return True
            make = OPS.get(op.type)
            if make is None or op.control_inputs:
                return False
            if op.type in _INTEGER_ONLY and not op.outputs[0].dtype.is_integer:
                return False
            if not all(visit(t) for t in op.inputs):
                return False
            steps.append((tuple(t.name for t in op.outputs), make(op), tuple(t.name for t in op.inputs)))
            types.add(op.type)
            done.update(t.name for t in op.outputs)
            return True

        if not all(visit(t) for t in key_tensors):
            return None
        return cls(feeds, constants, steps, tuple(t.name for t in key_tensors), tuple(sorted(types)))

    def __call__(self, *feeds: np.ndarray) -> list[np.ndarray]:
        values = dict(self._constants)
        values.update(zip(self._feeds, (np.asarray(f) for f in feeds)))
        try:
            for outputs, fn, inputs in self._steps:
                result = fn(*(values[name] for name in inputs))
                if len(outputs) == 1 and not isinstance(result, tuple):
                    values[outputs[0]] = result
                else:
                    values.update(zip(outputs, result))
        except (ValueError, TypeError, IndexError) as exc:  # numpy's words for what TF refuses
            raise InvalidArgument(f"the model rejected the input: {exc}") from None
        return [values[name] for name in self._keys]
