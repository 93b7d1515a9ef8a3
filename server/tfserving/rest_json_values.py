"""One JSON value of a TensorFlow Serving REST request -> the numpy array of an input.

Numbers and booleans are read the way numpy reads nested lists (:func:`natural`) and checked
against the input's dtype (:func:`check_kind`); strings are UTF-8 JSON strings or ``{"b64": ...}``
objects (:func:`string_array`). :mod:`server.tfserving.rest_json` calls these for a whole small body
and, a run of elements at a time, for a large one. Every problem raises
:class:`~processor.errors.InvalidArgument` naming the input (echoed at most about 80 characters,
ASCII-escaped). Pure functions; thread-safe.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import numpy as np

from processor.dtypes import DT_BOOL, DT_STRING, WIRE_TYPES, dtype_name
from processor.errors import InvalidArgument
from processor.signature import TensorSpec

from .. import native_json
from ..http.json_stream import MAX_DEPTH, clip


def is_b64(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and "b64" in value


def to_array(value: Any, spec: TensorSpec, name: str) -> np.ndarray:
    """A JSON value (nested lists) as an array of the input's dtype; InvalidArgument if it is not."""
    if spec.dtype == DT_STRING:
        return string_array(value, name)
    wire = wire_type(spec, name)
    fast = native_json.array(value, wire.numpy)  # what follows, in one pass (None: not taken)
    if fast is not None:
        return fast
    array = natural(value, name)
    check_kind(array, spec, wire, name, final=True)
    return array.astype(wire.numpy, copy=False)


def wire_type(spec: TensorSpec, name: str):
    wire = WIRE_TYPES.get(spec.dtype)
    if wire is None:
        raise InvalidArgument(f"input {clip(name)}: dtype {dtype_name(spec.dtype)} cannot be sent as JSON")
    return wire


def natural(value: Any, name: str) -> np.ndarray:
    """``np.asarray(value)``: the dtype numpy finds for the JSON values."""
    try:
        return np.asarray(value)
    except (ValueError, OverflowError):
        depth = 0
        while isinstance(value, list) and value and depth <= MAX_DEPTH:
            value, depth = value[0], depth + 1
        if depth > MAX_DEPTH:  # numpy arrays have 64 dimensions at most
            raise InvalidArgument(f"input {clip(name)}: nesting deeper than {MAX_DEPTH} levels") from None
        raise InvalidArgument(f"input {clip(name)}: the nested lists are ragged; every row must have "
                              f"the same length") from None


def check_kind(array: np.ndarray, spec: TensorSpec, wire, name: str, final: bool) -> None:
    """InvalidArgument unless ``array`` (numpy's reading of the JSON values) fits the input.

    ``final``: ``array`` holds all the input's values. For a run (``final`` false) booleans pass
    for a numeric input (numpy reads booleans mixed with numbers as numbers); the caller checks
    that not all were booleans."""
    kind = array.dtype.kind
    if spec.dtype == DT_BOOL:
        ok = kind == "b"
    elif wire.numpy.kind in "iu":
        ok = kind in "iu" or (kind == "b" and not final)
    else:  # floating and complex
        ok = kind in "iuf" or (kind == "b" and not final)
    if not ok:
        want = "true/false" if spec.dtype == DT_BOOL else (
            "integers" if wire.numpy.kind in "iu" else "numbers")
        # "not of expected type": TF Serving's words, which its clients match
        raise InvalidArgument(f"input {clip(name)} expects {want} ({dtype_name(spec.dtype)}); got "
                              f"{describe_kind(array)}, not of expected type: {dtype_name(spec.dtype)[3:].lower()}")
    if wire.numpy.kind in "iu" and kind in "iu" and array.size:
        info = np.iinfo(wire.numpy)
        if array.min() < info.min or array.max() > info.max:
            raise InvalidArgument(f"input {clip(name)}: a value is out of range for {dtype_name(spec.dtype)}")


def describe_kind(array: np.ndarray) -> str:
    return {"U": "strings", "O": "mixed values", "b": "booleans", "f": "floating point numbers",
            "i": "integers", "u": "integers"}.get(array.dtype.kind, str(array.dtype))


def string_array(value: Any, name: str) -> np.ndarray:
    if is_b64(value) or not isinstance(value, list):
        array = np.empty((), dtype=object)
        array[()] = string_value(value, name)
        return array
    try:  # numpy finds the shape of the nested lists (leaves: str or {"b64"} objects)
        array = np.array(value, dtype=object)
    except ValueError:
        raise InvalidArgument(f"input {clip(name)}: the nested lists are ragged; every row must have "
                              f"the same length") from None
    flat = array.reshape(-1)
    try:
        out = [v.encode() if type(v) is str else string_value(v, name) for v in flat.tolist()]
    except UnicodeEncodeError as exc:
        raise surrogate(name, exc) from None
    flat[:] = out
    return array


def surrogate(name: str, exc: UnicodeEncodeError) -> InvalidArgument:
    bad = exc.object[exc.start:exc.end]
    return InvalidArgument(f"input {clip(name)}: a string holds an unpaired UTF-16 surrogate "
                           f"({ascii(bad)[1:-1]}); JSON strings must be valid Unicode (send bytes "
                           f"as {{\"b64\": ...}})")


def string_value(v: Any, name: str) -> bytes:
    if isinstance(v, str):
        try:
            return v.encode()
        except UnicodeEncodeError as exc:
            raise surrogate(name, exc) from None
    if is_b64(v):
        encoded = v["b64"]
        if not isinstance(encoded, str):
            raise InvalidArgument(f"input {clip(name)}: the value of \"b64\" must be a string")
        try:
            return base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidArgument(f"input {clip(name)}: invalid base64 in {{\"b64\": {clip(encoded, 40)}}}") from None
    if isinstance(v, list):
        raise InvalidArgument(f"input {clip(name)}: the nested lists are ragged")
    raise InvalidArgument(f"input {clip(name)} expects strings or {{\"b64\": ...}} objects; got "
                          f"{type(v).__name__}")
