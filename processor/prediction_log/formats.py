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

A shadow copy's record (processor/shadow.py: a copy run on another version, never answered to
a client) says so: ``"shadow": true`` in JSON; in a PredictionLog, ``log_metadata.model_spec``
has the version label ``shadow`` (the request's and response's model specs keep the version
number: in a ModelSpec the two are one choice).

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
from ..request import version_number
from . import transcode
from .proto import PredictionLog
from .record import Pending, Resolved, request_id, resolve

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


def whole_tfrecords(data: bytes) -> int:
    """How many leading bytes of ``data`` are whole TFRecords (:func:`tfrecord`'s framing, both
    checksums holding): what a reader keeps of a file a crash cut short."""
    at, header = 0, _LENGTH.size + _CRC.size
    while at + header <= len(data):
        (length,) = _LENGTH.unpack_from(data, at)
        body, end = at + header, at + header + length + _CRC.size
        if (end > len(data)
                or _CRC.unpack_from(data, at + _LENGTH.size)[0] != masked_crc32c(data[at:at + _LENGTH.size])
                or _CRC.unpack_from(data, end - _CRC.size)[0] != masked_crc32c(data[body:end - _CRC.size])):
            break
        at = end
    return at


def prediction_log(call: Resolved, sampling_rate: float) -> bytes:
    """The call as one TFRecord of a ``tensorflow.serving.PredictionLog``."""
    entry = _entry(call.model, call.version, call.signature_name, call.request_id, call.time_ns,
                   sampling_rate, call.shadow)
    predict = entry.predict_log
    request = predict.request
    for key, array in call.inputs.items():
        _fill_tensor(request.inputs[key], array)
    request.output_filter.extend(call.output_filter)
    if call.outputs is not None:
        response = predict.response
        response.model_spec.CopyFrom(request.model_spec)
        for key, array in call.outputs.items():
            _fill_tensor(response.outputs[key], array)
    if call.error is not None:
        entry.log_metadata.error_code = call.error.code.name
        entry.log_metadata.error_message = call.error.message
    return tfrecord(entry.SerializeToString())


def prediction_log_pending(pending: Pending, sampling_rate: float) -> bytes:
    """:func:`prediction_log` of a sampled call: a call served from wire bytes is transcoded
    (:mod:`.transcode`: its tensors' bytes renumbered, no arrays built), every other call, and
    a wire call the transcoder does not take, goes through :func:`~.record.resolve`."""
    result = pending.result
    if (pending.wire is not None and result is not None and not result.introspection
            and result.outputs.__class__ is bytes):
        signature = result.signature
        tail = transcode.predict_log_tail(pending.wire, result.outputs, signature.input_aliases)
        if tail is not None:
            entry = _entry(pending.model, version_number(result.version), signature.name,
                           request_id(pending.request_id), pending.time_ns, sampling_rate, pending.shadow)
            entry.predict_log.response.model_spec.CopyFrom(entry.predict_log.request.model_spec)
            return tfrecord(entry.SerializeToString() + tail)
    return prediction_log(resolve(pending), sampling_rate)


def _entry(model: str, version: int | None, signature_name: str, request_id: str, time_ns: int,
           sampling_rate: float, shadow: bool = False):
    """A PredictionLog with its metadata and the request's model spec filled in (``shadow``:
    the metadata's spec labelled so, see the module doc)."""
    entry = PredictionLog()
    meta = entry.log_metadata
    spec = meta.model_spec
    spec.name = model
    spec.signature_name = signature_name
    if version is not None:
        spec.version.value = version
    meta.sampling_config.sampling_rate = sampling_rate
    meta.timestamp_secs = time_ns // 1_000_000_000
    meta.timestamp_micros = time_ns // 1000
    meta.request_id = request_id
    entry.predict_log.request.model_spec.CopyFrom(spec)
    if shadow:
        spec.version_label = "shadow"
    return entry


def _fill_tensor(tensor, array: np.ndarray) -> None:
    array = np.asarray(array)
    dt = dtype_of_array(array)
    tensor.dtype = dt
    dims = tensor.tensor_shape.dim
    for size in array.shape:
        dims.add(size=size)
    if dt == DT_STRING:
        values = array.ravel().tolist()
        try:  # decoded requests hold bytes: one C-level extend
            tensor.string_val.extend(values)
        except TypeError:  # str (an array call's inputs) or other objects: converted one by one
            del tensor.string_val[:]
            tensor.string_val.extend([_bytes(v) for v in values])
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
    if call.shadow:
        out["shadow"] = True
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


def jsonl_pending(pending: Pending, sampling_rate: float) -> bytes:
    """:func:`jsonl` of a sampled call."""
    return jsonl(resolve(pending), sampling_rate)


FORMATS: dict[str, Callable[[Pending, float], bytes]] = {"prediction_log": prediction_log_pending,
                                                         "jsonl": jsonl_pending}
