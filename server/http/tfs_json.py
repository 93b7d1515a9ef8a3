"""TensorFlow Serving's REST JSON <-> numpy, checked against the served signature.

Request ``{"signature_name", "instances" | "inputs"}``:

* row format (``instances``): a list, one element per example; with several inputs each element
  is an object ``{input: value}`` and every input gets the same 0-th dimension;
* columnar format (``inputs``): one tensor (a single-input signature) or ``{input: tensor}``;
* string inputs take JSON strings (UTF-8) or ``{"b64": "<base64>"}`` for binary values;
  numbers may be ``NaN`` / ``Infinity`` / ``-Infinity``.

Response: ``{"predictions": ...}`` for row requests (a list of objects with several outputs, the
bare list with one), ``{"outputs": ...}`` for columnar ones (an object, or the bare value with
one output). String outputs whose alias ends in ``_bytes``, or that are not UTF-8, are returned
as ``{"b64": ...}``.

Every problem raises :class:`~processor.errors.InvalidArgument` with a message naming the input.
Pure functions; thread-safe.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

import numpy as np

from processor.dtypes import DT_BOOL, DT_STRING, WIRE_TYPES, dtype_name
from processor.errors import InvalidArgument
from processor.signature import Signature, TensorSpec

ROW, COLUMNAR = "row", "columnar"


def parse_body(body: bytes) -> dict[str, Any]:
    if not body:
        raise InvalidArgument("JSON Parse error: the request body is empty")
    try:
        doc = _fast_loads(body)
    except ValueError:  # orjson is strict JSON: NaN/Infinity tokens (and errors) take the slow path
        try:
            doc = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InvalidArgument(f"JSON Parse error: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidArgument("JSON Value is not an object: expected {\"instances\": ...} or {\"inputs\": ...}")
    return doc


def decode_predict(doc: dict[str, Any], signature: Signature) -> tuple[dict[str, np.ndarray], str]:
    """The request's inputs as numpy arrays keyed by alias, and its format (ROW or COLUMNAR)."""
    has_rows, has_cols = "instances" in doc, "inputs" in doc
    if has_rows and has_cols:
        raise InvalidArgument("Not both 'instances' and 'inputs' can be specified in the request")
    if not has_rows and not has_cols:
        raise InvalidArgument("Missing 'inputs' or 'instances' key")
    if has_rows:
        return _decode_rows(doc["instances"], signature), ROW
    return _decode_columns(doc["inputs"], signature), COLUMNAR


def _decode_rows(instances: Any, signature: Signature) -> dict[str, np.ndarray]:
    if not isinstance(instances, list):
        raise InvalidArgument("'instances' must be a list, one element per example")
    if not instances:
        raise InvalidArgument("'instances' is an empty list")
    if all(isinstance(row, dict) and not _is_b64(row) for row in instances):
        names = list(instances[0])
        for i, row in enumerate(instances):
            if set(row) != set(names):
                raise InvalidArgument(f"instances[{i}] has inputs {sorted(row)}, instances[0] has "
                                      f"{sorted(names)}; every example must name the same inputs")
        return {name: to_array([row[name] for row in instances], signature.input(name), name)
                for name in names}
    if any(isinstance(row, dict) and not _is_b64(row) for row in instances):
        raise InvalidArgument("'instances' mixes objects and plain values")
    spec = _only_input(signature, "instances")
    return {spec.alias: to_array(instances, spec, spec.alias)}


def _decode_columns(inputs: Any, signature: Signature) -> dict[str, np.ndarray]:
    if isinstance(inputs, dict) and not _is_b64(inputs):
        if not inputs:
            raise InvalidArgument("'inputs' is an empty object")
        return {name: to_array(value, signature.input(name), name) for name, value in inputs.items()}
    spec = _only_input(signature, "inputs")
    return {spec.alias: to_array(inputs, spec, spec.alias)}


def _only_input(signature: Signature, key: str) -> TensorSpec:
    if len(signature.inputs) != 1:
        raise InvalidArgument(f"'{key}' holds plain values but signature {signature.name!r} takes "
                              f"{len(signature.inputs)} inputs {sorted(signature.inputs)}; name them "
                              f"with objects")
    return next(iter(signature.inputs.values()))


def _is_b64(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and "b64" in value


def to_array(value: Any, spec: TensorSpec, name: str) -> np.ndarray:
    """A JSON value (nested lists) as an array of the input's dtype; InvalidArgument if it is not."""
    if spec.dtype == DT_STRING:
        return _string_array(value, name)
    wire = WIRE_TYPES.get(spec.dtype)
    if wire is None:
        raise InvalidArgument(f"input {name!r}: dtype {dtype_name(spec.dtype)} cannot be sent as JSON")
    try:
        array = np.asarray(value)
    except ValueError:
        raise InvalidArgument(f"input {name!r}: the nested lists are ragged; every row must have "
                              f"the same length") from None
    kind = array.dtype.kind
    if spec.dtype == DT_BOOL:
        ok = kind == "b"
    elif wire.numpy.kind in "iu":
        ok = kind in "iu"
    else:  # floating and complex
        ok = kind in "iuf" and kind != "b"
    if not ok:
        want = "true/false" if spec.dtype == DT_BOOL else (
            "integers" if wire.numpy.kind in "iu" else "numbers")
        raise InvalidArgument(f"input {name!r} expects {want} ({dtype_name(spec.dtype)}); got "
                              f"{_describe_kind(array)}")
    if wire.numpy.kind in "iu" and array.size:
        info = np.iinfo(wire.numpy)
        if array.min() < info.min or array.max() > info.max:
            raise InvalidArgument(f"input {name!r}: a value is out of range for {dtype_name(spec.dtype)}")
    return array.astype(wire.numpy, copy=False)


def _describe_kind(array: np.ndarray) -> str:
    return {"U": "strings", "O": "mixed values", "b": "booleans", "f": "floating point numbers",
            "i": "integers", "u": "integers"}.get(array.dtype.kind, str(array.dtype))


def _string_array(value: Any, name: str) -> np.ndarray:
    if _is_b64(value) or not isinstance(value, list):
        array = np.empty((), dtype=object)
        array[()] = _string_value(value, name)
        return array
    try:  # numpy finds the shape of the nested lists (leaves: str or {"b64"} objects)
        array = np.array(value, dtype=object)
    except ValueError:
        raise InvalidArgument(f"input {name!r}: the nested lists are ragged; every row must have "
                              f"the same length") from None
    flat = array.reshape(-1)
    out = [v.encode() if type(v) is str else _string_value(v, name) for v in flat.tolist()]
    flat[:] = out
    return array


def _string_value(v: Any, name: str) -> bytes:
    if isinstance(v, str):
        return v.encode()
    if _is_b64(v):
        encoded = v["b64"]
        if not isinstance(encoded, str):
            raise InvalidArgument(f"input {name!r}: the value of \"b64\" must be a string")
        try:
            return base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidArgument(f"input {name!r}: invalid base64 in {{\"b64\": {encoded[:40]!r}}}") from None
    if isinstance(v, list):
        raise InvalidArgument(f"input {name!r}: the nested lists are ragged")
    raise InvalidArgument(f"input {name!r} expects strings or {{\"b64\": ...}} objects; got "
                          f"{type(v).__name__}")


# --- response ---------------------------------------------------------------------------------

def encode_predict(outputs: dict[str, np.ndarray], fmt: str) -> bytes:
    """``{"predictions": ...}`` (ROW) or ``{"outputs": ...}`` (COLUMNAR) as JSON bytes."""
    columns = {name: _to_json(name, array) for name, array in outputs.items()}
    # orjson writes non-finite floats as null; TF Serving writes NaN / Infinity tokens
    dumps = _fast_dumps if all(_finite(a) for a in outputs.values()) else _dumps
    if fmt == COLUMNAR:
        body: Any = next(iter(columns.values())) if len(columns) == 1 else columns
        return dumps({"outputs": body})
    sizes = {name: (array.shape[0] if array.ndim else None) for name, array in outputs.items()}
    if None in sizes.values() or len(set(sizes.values())) > 1:
        raise InvalidArgument(f"the outputs have different 0-th dimensions {sizes}; send the "
                              f"request in the columnar format (\"inputs\") instead")
    if len(columns) == 1:
        rows: Any = next(iter(columns.values()))
    else:
        names = list(columns)
        rows = [dict(zip(names, values)) for values in zip(*columns.values())]
    return dumps({"predictions": rows})


def _finite(array: np.ndarray) -> bool:
    return array.dtype.kind not in "fc" or bool(np.isfinite(array).all())


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


try:  # orjson: several times faster than the json module on both sides; optional
    import orjson

    _fast_loads = orjson.loads

    def _fast_dumps(doc: Any) -> bytes:
        return orjson.dumps(doc)
except ImportError:  # pragma: no cover - orjson is in the server extra
    _fast_loads = json.loads
    _fast_dumps = _dumps


def _to_json(name: str, array: np.ndarray) -> Any:
    if array.dtype.kind not in ("O", "S", "U"):
        return array.tolist()
    binary = name.endswith("_bytes")

    def conv(v: Any) -> Any:
        if isinstance(v, list):
            return [conv(x) for x in v]
        if isinstance(v, str):
            v = v.encode()
        if not binary:
            try:
                return v.decode()
            except UnicodeDecodeError:
                pass
        return {"b64": base64.b64encode(v).decode()}

    return conv(array.tolist())
