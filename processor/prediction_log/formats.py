"""Record formats: a :class:`~.record.Resolved` call -> the bytes appended to a log file.

* ``prediction_log``: one TFRecord (``tf.data.TFRecordDataset``'s framing: length, masked
  CRC-32C of the length, data, masked CRC-32C of the data) holding a serialized
  ``tensorflow.serving.PredictionLog`` (see :mod:`.proto`): numeric tensors as
  ``tensor_content`` (little-endian), strings as ``string_val``; written without TensorFlow.
* ``jsonl``: one JSON object and a newline: ``model``, ``version``, ``signature_name``,
  ``request_id``, ``time`` (RFC 3339, UTC, microseconds), ``timestamp_micros``,
  ``sampling_rate``, ``inputs`` and ``outputs`` (``{"dtype": "DT_FLOAT", "shape": [...],
  "values": nested lists}``; a string value that is not UTF-8 is ``{"b64": ...}``; half and
  bfloat16 as floats; complex as ``[real, imaginary]``; non-finite floats as ``NaN`` /
  ``Infinity``, as TF Serving's REST API writes them) and, for a failed call, ``error``
  (``{"code": "INVALID_ARGUMENT", "message": ...}``) instead of ``outputs``.

Pure functions; thread-safe.
"""

from __future__ import annotations

import base64
import datetime
import json
import struct
from collections.abc import Callable

import google_crc32c
import numpy as np

from ..dtypes import DT_STRING, dtype_name, dtype_of_array
from .proto import PredictionLog
from .record import Resolved

_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")


def masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: CRC-32C rotated right by 15 bits plus a constant (TensorFlow's
    ``crc32c::Mask``)."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(data: bytes) -> bytes:
    """``data`` framed as one TFRecord."""
    length = _LENGTH.pack(len(data))
    return b"".join((length, _CRC.pack(masked_crc32c(length)), data, _CRC.pack(masked_crc32c(data))))


def prediction_log(call: Resolved, sampling_rate: float) -> bytes:
    """The call as one TFRecord of a ``tensorflow.serving.PredictionLog``."""
    entry = PredictionLog()
    meta = entry.log_metadata
    spec = meta.model_spec
    spec.name = call.model
    spec.signature_name = call.signature_name
    if call.version is not None:
        spec.version.value = call.version
    meta.sampling_config.sampling_rate = sampling_rate
    meta.timestamp_secs = call.time_ns // 1_000_000_000
    meta.timestamp_micros = call.time_ns // 1000
    meta.request_id = call.request_id
    predict = entry.predict_log
    request = predict.request
    request.model_spec.CopyFrom(spec)
    for key, array in call.inputs.items():
        _fill_tensor(request.inputs[key], array)
    request.output_filter.extend(call.output_filter)
    if call.outputs is not None:
        response = predict.response
        response.model_spec.CopyFrom(spec)
        for key, array in call.outputs.items():
            _fill_tensor(response.outputs[key], array)
    if call.error is not None:
        meta.error_code = call.error.code.name
        meta.error_message = call.error.message
    return tfrecord(entry.SerializeToString())


def _fill_tensor(tensor, array: np.ndarray) -> None:
    array = np.asarray(array)
    dt = dtype_of_array(array)
    tensor.dtype = dt
    dims = tensor.tensor_shape.dim
    for size in array.shape:
        dims.add(size=size)
    if dt == DT_STRING:
        tensor.string_val.extend([_bytes(v) for v in array.ravel().tolist()])
    else:
        tensor.tensor_content = np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes()


def _bytes(value) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def jsonl(call: Resolved, sampling_rate: float) -> bytes:
    """The call as one JSON line (see the module doc)."""
    micros = call.time_ns // 1000
    when = datetime.datetime.fromtimestamp(micros / 1e6, datetime.timezone.utc)
    out = {"model": call.model, "version": call.version, "signature_name": call.signature_name,
           "request_id": call.request_id,
           "time": when.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), "timestamp_micros": micros,
           "sampling_rate": sampling_rate,
           "inputs": {key: _json_tensor(a) for key, a in call.inputs.items()}}
    if call.output_filter:
        out["output_filter"] = list(call.output_filter)
    if call.outputs is not None:
        out["outputs"] = {key: _json_tensor(a) for key, a in call.outputs.items()}
    if call.error is not None:
        out["error"] = {"code": call.error.code.name, "message": call.error.message}
    return json.dumps(out, separators=(",", ":")).encode() + b"\n"


def _json_tensor(array: np.ndarray) -> dict:
    array = np.asarray(array)
    dt = dtype_of_array(array)
    if dt == DT_STRING:
        values = np.vectorize(_json_string, otypes=[object])(array).tolist() if array.size else array.tolist()
    elif array.dtype.kind == "c":
        values = np.stack([array.real, array.imag], axis=-1).tolist()
    else:  # half and bfloat16 (ml_dtypes) list as Python floats too
        values = array.tolist()
    return {"dtype": dtype_name(dt), "shape": list(array.shape), "values": values}


def _json_string(value) -> str | dict:
    raw = _bytes(value)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return {"b64": base64.b64encode(raw).decode("ascii")}


FORMATS: dict[str, Callable[[Resolved, float], bytes]] = {"prediction_log": prediction_log, "jsonl": jsonl}
