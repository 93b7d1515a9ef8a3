"""TF Serving's ``Input`` (``ExampleList`` / ``ExampleListWithContext``) read feature by feature
into a signature's named inputs (issue 47; beyond TF Serving, which takes serialized examples
only).

A signature that does not take one tensor of serialized ``tf.Example``s (a ranking model's
signature of named features: ``user_seq``, ``item_id``...) gets each input from the examples'
feature of the input's alias:

* every example has the feature: one row per example;
* no example has it and the ``ExampleListWithContext``'s context does: ONE row, the context's,
  which applies to every row (the processor broadcasts it, and a model that declares the input in
  ``context_inputs`` computes its part once: :mod:`processor.context`). This is the request
  TF Serving would answer by merging the context into each example; the answer is the same;
* some examples have it and the context too: the context's value fills the others (TF
  Serving's merge: the example's value wins);
* else InvalidArgument naming the feature and the first example without it.

Values: ``float_list`` for floating inputs, ``int64_list`` for integer and bool inputs,
``bytes_list`` for DT_STRING; another kind is InvalidArgument. Every row of an input must hold
the same number of values, which fills the signature's shape after the first dimension (a
rank-1 input takes one value per row). Pure; thread-safe.
"""

from __future__ import annotations

import math

import numpy as np

from processor.dtypes import DT_BOOL, DT_STRING, dtype_name
from processor.errors import InvalidArgument
from processor.signature import Signature, TensorSpec

_FLOATS = {1: np.float32, 2: np.float64, 19: np.float16}  # DT_FLOAT, DT_DOUBLE, DT_HALF
_INTS = {3: np.int32, 4: np.uint8, 5: np.int16, 6: np.int8, 9: np.int64, 17: np.uint16, DT_BOOL: np.bool_}


def takes_features(signature: Signature) -> bool:
    """Whether ``signature`` takes named features (not one DT_STRING tensor of serialized examples)."""
    return not (len(signature.inputs) == 1 and next(iter(signature.inputs.values())).dtype == DT_STRING)


def feature_arrays(input_proto, signature: Signature) -> dict[str, np.ndarray]:
    """The inputs of ``signature`` from ``input_proto``'s examples (see the module doc)."""
    kind = input_proto.WhichOneof("kind")
    if kind == "example_list":
        examples, context = list(input_proto.example_list.examples), None
    elif kind == "example_list_with_context":
        listed = input_proto.example_list_with_context
        examples, context = list(listed.examples), listed.context.features.feature
    else:
        examples, context = [], None
    if not examples:
        raise InvalidArgument("Input is empty.")
    maps = [e.features.feature for e in examples]
    out = {}
    for alias, spec in signature.inputs.items():
        held = [alias in m for m in maps]
        in_context = context is not None and alias in context
        if not any(held) and in_context:
            rows = [_values(context[alias], spec, "the context")]
        else:
            rows = []
            for i, (m, has) in enumerate(zip(maps, held)):
                if has:
                    rows.append(_values(m[alias], spec, f"example {i}"))
                elif in_context:
                    rows.append(_values(context[alias], spec, "the context"))
                else:
                    raise InvalidArgument(f"feature {alias!r} (an input of signature {signature.name!r}) is "
                                          f"missing from example {i}" + ("" if context is None else " and the context"))
        out[alias] = _array(rows, spec)
    return out


def _values(feature, spec: TensorSpec, where: str):
    kind = feature.WhichOneof("kind")
    want = "bytes_list" if spec.dtype == DT_STRING else "float_list" if spec.dtype in _FLOATS else "int64_list"
    if spec.dtype not in _FLOATS and spec.dtype not in _INTS and spec.dtype != DT_STRING:
        raise InvalidArgument(f"input {spec.alias!r}: dtype {dtype_name(spec.dtype)} cannot be read from a tf.Example")
    if kind != want:
        raise InvalidArgument(f"feature {spec.alias!r} of {where}: {kind or 'no values'} given, input "
                              f"{spec.alias!r} ({dtype_name(spec.dtype)}) takes {want}")
    return getattr(feature, kind).value


def _array(rows: list, spec: TensorSpec) -> np.ndarray:
    count = len(rows[0])
    if any(len(r) != count for r in rows):
        bad = next(i for i, r in enumerate(rows) if len(r) != count)
        raise InvalidArgument(f"feature {spec.alias!r}: row {bad} holds {len(rows[bad])} values, row 0 holds {count}; "
                              f"every row of an input holds the same number")
    inner = _inner_shape(spec, count)
    if spec.dtype == DT_STRING:
        array = np.empty(len(rows) * count, dtype=object)
        array[:] = [v for r in rows for v in r]
    else:
        numpy = _FLOATS.get(spec.dtype) or _INTS[spec.dtype]
        try:
            array = np.array([v for r in rows for v in r] if count != 1 else [r[0] for r in rows], dtype=numpy)
        except OverflowError:
            raise InvalidArgument(f"feature {spec.alias!r}: a value is out of range for {dtype_name(spec.dtype)}") from None
    return array.reshape((len(rows), *inner))


def _inner_shape(spec: TensorSpec, count: int) -> tuple[int, ...]:
    """The shape after the first dimension that ``count`` values per row fill."""
    shape = spec.shape
    if shape is None or len(shape) < 1:
        return (count,) if count != 1 else ()
    rest = shape[1:]
    if not rest:
        if count != 1:
            raise InvalidArgument(f"feature {spec.alias!r}: {count} values per row given, input {spec.alias!r} "
                                  f"(shape {list(shape)}) takes one")
        return ()
    free = [i for i, d in enumerate(rest) if d < 0]
    fixed = math.prod(d for d in rest if d >= 0)
    if len(free) > 1 or (not free and fixed != count) or (free and (fixed == 0 or count % fixed)):
        raise InvalidArgument(f"feature {spec.alias!r}: {count} values per row do not fill input {spec.alias!r}'s "
                              f"shape {list(shape)}")
    return tuple(count // fixed if d < 0 else d for d in rest)
