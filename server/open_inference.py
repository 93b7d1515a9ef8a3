"""The Open Inference Protocol (KServe v2), transport-neutral: datatypes, tensors, metadata, infer.

The REST routes (:mod:`server.http.v2`) and the gRPC service (:mod:`server.grpc.v2`) parse their
wire format into :class:`InferInput` values and call :func:`infer`, which goes through the
DataPlane like every other front-end (batching included). Datatypes map to the signature's
dtypes; a tensor whose datatype, shape or element count does not fit is an InvalidArgument
(400 / INVALID_ARGUMENT) naming the tensor. Versions: the served version's number (TF Serving's
numbering, :func:`processor.request.version_number`); asking for another one is NOT_FOUND.

Raw tensor bytes (the binary extension, gRPC ``raw_*_contents``) are row-major elements in
little-endian order; a BYTES tensor is each element's 4-byte little-endian length, then its bytes.
Functions only; thread-safe.
"""

from __future__ import annotations

import importlib.metadata
import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from processor import dtypes
from processor.errors import InvalidArgument, NotFound
from processor.request import PredictCall

SERVER_NAME = "serving-processor"
# The binary tensor extension over HTTP (Inference-Header-Content-Length); gRPC raw contents.
EXTENSIONS = ("binary_tensor_data",)

DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_), "UINT8": np.dtype(np.uint8), "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32), "UINT64": np.dtype(np.uint64), "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16), "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}
_SIGNATURE_DATATYPES = {dtypes.DT_FLOAT: "FP32", dtypes.DT_DOUBLE: "FP64", dtypes.DT_INT32: "INT32",
                        dtypes.DT_UINT8: "UINT8", dtypes.DT_INT16: "INT16", dtypes.DT_INT8: "INT8",
                        dtypes.DT_STRING: "BYTES", dtypes.DT_INT64: "INT64", dtypes.DT_BOOL: "BOOL",
                        dtypes.DT_UINT16: "UINT16", dtypes.DT_HALF: "FP16", dtypes.DT_BFLOAT16: "BF16"}
_MAX_ECHO = 64  # characters of a client's value repeated in an error


@dataclass(frozen=True)
class InferInput:
    """One input tensor as a transport parsed it: ``data`` a JSON value (nested lists or flat),
    or ``raw`` bytes."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: Any = None
    raw: bytes | memoryview | None = None


def server_metadata() -> dict[str, Any]:
    return {"name": SERVER_NAME, "version": _version(), "extensions": list(EXTENSIONS)}


def _version() -> str:
    try:
        return importlib.metadata.version("serving-processor")
    except importlib.metadata.PackageNotFoundError:
        return "0.0.0"


def _echo(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_ECHO else text[:_MAX_ECHO] + "..."


def _wanted(name: str, version: str | None) -> int | None:
    """The version number a URL names (None: the served one); versions are numbers."""
    if not version:
        return None
    if not version.isdigit():
        raise NotFound(f"model {name!r} has no version {_echo(version)}; versions are numbers")
    return int(version)


def served(rt, name: str, version: str | None):
    """What serves ``name`` (:class:`~processor.request.Served`); NOT_FOUND for a version that
    is not the served one."""
    return rt.dataplane.served(name, _wanted(name, version))


def model_metadata(rt, name: str, version: str | None = None) -> dict[str, Any]:
    """The v2 model metadata: name, versions, platform, inputs and outputs of the signature."""
    serving = served(rt, name, version)
    platform = {"onnxruntime": "onnxruntime_onnx", "tensorflow": "tensorflow_savedmodel"}[serving.engine_name]
    return {"name": name, "versions": [str(serving.version_number)], "platform": platform,
            "inputs": [tensor_metadata(s) for s in serving.signature.inputs.values()],
            "outputs": [tensor_metadata(s) for s in serving.signature.outputs.values()]}


def tensor_metadata(spec) -> dict[str, Any]:
    return {"name": spec.alias, "datatype": _SIGNATURE_DATATYPES.get(spec.dtype, dtypes.dtype_name(spec.dtype)),
            "shape": list(spec.shape) if spec.shape is not None else [-1]}


def model_ready(rt, name: str, version: str | None = None) -> bool:
    if not rt.model(name).ready or rt.gate.draining:  # NotFound for an unknown model
        return False
    try:
        served(rt, name, version)
    except NotFound:
        return False
    return True


def to_array(tensor: InferInput) -> np.ndarray:
    """The numpy array of one input tensor; InvalidArgument naming it when it does not fit."""
    dtype = DATATYPES.get(tensor.datatype)
    if dtype is None:
        raise InvalidArgument(f"input {tensor.name!r}: unknown datatype {_echo(tensor.datatype)}; "
                              f"expected one of {sorted(DATATYPES)}")
    shape = tensor.shape
    if any(not isinstance(d, int) or isinstance(d, bool) or d < 0 for d in shape):
        raise InvalidArgument(f"input {tensor.name!r}: shape must list non-negative integers, got {_echo(list(shape))}")
    count = math.prod(shape)
    if tensor.raw is not None:
        array = _from_raw(tensor.name, dtype, bytes(tensor.raw), count)
    else:
        array = _from_data(tensor.name, tensor.datatype, dtype, tensor.data, count)
    return array.reshape(shape)


def _from_raw(name: str, dtype: np.dtype, raw: bytes, count: int) -> np.ndarray:
    if dtype == object:
        items, at = [], 0
        while at < len(raw):
            if at + 4 > len(raw):
                raise InvalidArgument(f"input {name!r}: BYTES contents end inside a length prefix")
            (n,) = struct.unpack_from("<I", raw, at)
            at += 4
            if at + n > len(raw):
                raise InvalidArgument(f"input {name!r}: a BYTES element of {n} bytes runs past the contents")
            items.append(raw[at:at + n])
            at += n
        if len(items) != count:
            raise InvalidArgument(f"input {name!r}: {len(items)} BYTES elements for a shape of {count}")
        out = np.empty(count, object)
        out[:] = items
        return out
    if len(raw) != count * dtype.itemsize:
        raise InvalidArgument(f"input {name!r}: {len(raw)} raw bytes for {count} elements of "
                              f"{dtype.itemsize} byte(s)")
    return np.frombuffer(raw, dtype.newbyteorder("<")).astype(dtype, copy=True)


def _from_data(name: str, datatype: str, dtype: np.dtype, data: Any, count: int) -> np.ndarray:
    if data is None:
        raise InvalidArgument(f"input {name!r}: no data (give 'data', or binary contents)")
    flat = _flatten(name, data)
    if len(flat) != count:
        raise InvalidArgument(f"input {name!r}: {len(flat)} elements for a shape of {count}")
    if dtype == object:
        if not all(isinstance(v, (str, bytes)) for v in flat):
            raise InvalidArgument(f"input {name!r}: BYTES data must be strings")
        out = np.empty(count, object)
        out[:] = [v.encode("utf-8", "surrogatepass") if isinstance(v, str) else v for v in flat]
        return out
    try:
        values = np.asarray(flat)  # one pass in C; the checks below read its dtype, not each element
    except (ValueError, TypeError):
        values = np.asarray(flat, dtype=object)
    kind = values.dtype.kind if values.size else dtype.kind
    if datatype == "BOOL":
        if kind != "b":
            raise InvalidArgument(f"input {name!r}: BOOL data must be true/false")
    elif kind not in "iuf" or any(type(v) is bool for v in flat):  # numpy would take true as 1
        raise InvalidArgument(f"input {name!r}: {datatype} data must be numbers")
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        if kind == "f" or (values.size and (values.min() < info.min or values.max() > info.max)):
            raise InvalidArgument(f"input {name!r}: {datatype} data must be integers in "
                                  f"[{info.min}, {info.max}]")
    return values.astype(dtype, copy=False)


def _flatten(name: str, data: Any) -> list:
    if not isinstance(data, list):
        raise InvalidArgument(f"input {name!r}: 'data' must be a JSON array")
    if not any(isinstance(v, list) for v in data):
        return data
    out: list = []
    stack = [iter(data)]
    while stack:  # iterative: a deep nesting cannot exhaust the recursion limit
        for v in stack[-1]:
            if isinstance(v, list):
                stack.append(iter(v))
                break
            out.append(v)
        else:
            stack.pop()
    return out


def datatype_of(array: np.ndarray) -> str:
    if array.dtype.kind in "OSU":
        return "BYTES"
    for name, dtype in DATATYPES.items():
        if dtype == array.dtype:
            return name
    raise InvalidArgument(f"output of dtype {array.dtype} has no Open Inference Protocol datatype")


def raw_bytes(array: np.ndarray) -> bytes:
    """An output's raw contents (see the module doc)."""
    if array.dtype.kind in "OSU":
        parts = []
        for v in array.reshape(-1):
            b = v.encode() if isinstance(v, str) else bytes(v)
            parts.append(struct.pack("<I", len(b)))
            parts.append(b)
        return b"".join(parts)
    return np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes()


def json_data(array: np.ndarray) -> list:
    """An output's ``data``: the flat row-major elements (BYTES as UTF-8 text where they are)."""
    flat = array.reshape(-1)
    if array.dtype.kind in "OSU":
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in flat]
    if array.dtype == np.float16:
        flat = flat.astype(np.float32)
    return flat.tolist()


def infer(rt, name: str, version: str | None, inputs: list[InferInput], outputs: list[str] | None,
          deadline: float | None = None) -> tuple[str, dict[str, np.ndarray]]:
    """Run one inference: (served version number as a string, outputs by name in request order)."""
    wanted = _wanted(name, version)
    arrays: dict[str, np.ndarray] = {}
    for tensor in inputs:
        if tensor.name in arrays:
            raise InvalidArgument(f"input {tensor.name!r} given twice")
        arrays[tensor.name] = to_array(tensor)
    if outputs is not None and len(set(outputs)) != len(outputs):
        raise InvalidArgument(f"an output is requested twice: {_echo(outputs)}")
    result = rt.dataplane.predict(PredictCall(name, arrays, version=wanted, output_filter=outputs or None,
                                              deadline=deadline))
    return str(result.version_number), result.outputs
