"""TensorFlow Serving's REST JSON responses: numpy outputs -> ``{"predictions": ...}`` (row
requests: a list of objects with several outputs, the bare list with one) or ``{"outputs": ...}``
(columnar requests: an object, or the bare value with one output). String outputs whose alias
ends in ``_bytes``, or that are not UTF-8, are returned as ``{"b64": ...}``; non-finite floats as
``NaN`` / ``Infinity`` tokens, as TF Serving writes them.

Large outputs are written a run of rows at a time into one ``bytearray``, so their Python objects
stay small. The requests are :mod:`server.tfserving.rest_json`'s. Pure functions; thread-safe.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np

from processor.errors import InvalidArgument

from .. import native_json
from ..http.json_stream import clip
from .rest_json import COLUMNAR

_ENCODE_RUN = 1 << 16  # output elements turned into Python objects at once


def encode_predict(outputs: dict[str, np.ndarray], fmt: str) -> bytes | bytearray:
    """``{"predictions": ...}`` (ROW) or ``{"outputs": ...}`` (COLUMNAR) as JSON bytes.

    Large outputs are written a run of rows at a time into one ``bytearray`` (the bytes of one
    ``dumps`` of the whole document), so their Python objects stay small."""
    fast = _native_predict(outputs, fmt)
    if fast is not None:
        return fast
    # orjson writes non-finite floats as null; TF Serving writes NaN / Infinity tokens
    dumps = _fast_dumps if all(_finite(a) for a in outputs.values()) else _dumps
    out = bytearray()
    if fmt == COLUMNAR:
        if len(outputs) == 1:
            name, array = next(iter(outputs.items()))
            out += b'{"outputs":'
            _encode_array(out, name, array, dumps)
            out += b"}"
        else:
            out += b'{"outputs":{'
            for i, (name, array) in enumerate(outputs.items()):
                out += b"," if i else b""
                out += dumps(name) + b":"
                _encode_array(out, name, array, dumps)
            out += b"}}"
        return _done(out)
    sizes = {name: (array.shape[0] if array.ndim else None) for name, array in outputs.items()}
    if None in sizes.values() or len(set(sizes.values())) > 1:
        raise InvalidArgument(f"the outputs have different 0-th dimensions {clip(sizes, 400)}; send "
                              f"the request in the columnar format (\"inputs\") instead")
    n = next(iter(sizes.values()))
    per_row = max(1, sum(a[:1].size for a in outputs.values()))
    step = max(1, _ENCODE_RUN // per_row)
    names = list(outputs)
    out += b'{"predictions":['
    for i in range(0, n, step):
        columns = [_to_json(name, outputs[name][i:i + step]) for name in names]
        rows: Any = columns[0] if len(names) == 1 else [dict(zip(names, values)) for values in zip(*columns)]
        out += b"," if i else b""
        out += memoryview(dumps(rows))[1:-1]
    out += b"]}"
    return _done(out)


def _native_predict(outputs: dict[str, np.ndarray], fmt: str) -> bytes | None:
    """:func:`encode_predict`'s bytes written natively (``native_json.numbers``: orjson's bytes
    of the same values, no Python object per element) where every output is numeric and finite,
    all of them hold at most ``_ENCODE_RUN`` elements (a larger answer is written a run at a
    time, its text never held twice) and, for a row request, there is one output (more are rows
    of objects); None: not taken."""
    if sum(array.size for array in outputs.values()) > _ENCODE_RUN:
        return None
    if fmt == COLUMNAR and len(outputs) > 1:
        parts = []
        for name, array in outputs.items():
            text = native_json.numbers(array)
            if text is None:
                return None
            parts.append(_fast_dumps(name) + b":" + text)
        return b'{"outputs":{' + b",".join(parts) + b"}}"
    if len(outputs) != 1:
        return None
    array = next(iter(outputs.values()))
    if fmt != COLUMNAR and array.ndim == 0:
        return None  # the reference's error: a row request's output must have rows
    text = native_json.numbers(array)
    if text is None:
        return None
    return (b'{"outputs":' if fmt == COLUMNAR else b'{"predictions":') + text + b"}"


def _done(out: bytearray) -> bytes | bytearray:
    return bytes(out) if len(out) <= _ENCODE_RUN else out  # a large one is not copied again


def _encode_array(out: bytearray, name: str, array: np.ndarray, dumps) -> None:
    """``dumps(_to_json(name, array))`` onto ``out``, a run of rows at a time for large arrays."""
    if array.ndim == 0 or array.size <= _ENCODE_RUN or array.shape[0] <= 1:
        out += dumps(_to_json(name, array))
        return
    step = max(1, _ENCODE_RUN * array.shape[0] // array.size)
    out += b"["
    for i in range(0, array.shape[0], step):
        out += b"," if i else b""
        out += memoryview(dumps(_to_json(name, array[i:i + step])))[1:-1]
    out += b"]"


def _finite(array: np.ndarray) -> bool:
    return array.dtype.kind not in "fc" or bool(np.isfinite(array).all())


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


try:  # orjson: several times faster than the json module; optional
    import orjson

    def _fast_dumps(doc: Any) -> bytes:
        return orjson.dumps(doc)
except ImportError:  # pragma: no cover - orjson is in the server extra
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
