"""The Open Inference Protocol (KServe v2), transport-neutral: datatypes, tensors, metadata, infer.

The REST routes (:mod:`server.kserve.rest_routes`) and the gRPC service (:mod:`server.kserve.grpc_service`) parse their
wire format into :class:`InferInput` values and call :func:`infer`, which goes through the
DataPlane like every other front-end (batching included). Datatypes map to the signature's
dtypes; a tensor whose datatype, shape or element count does not fit is an InvalidArgument
(400 / INVALID_ARGUMENT) naming the tensor; names and values from the request are echoed at
most about 80 characters long. Versions: a served version's number (TF Serving's numbering,
:func:`processor.request.version_number`), named as 1 to 19 ASCII digits
(:func:`processor.request.parse_version`; anything else is INVALID_ARGUMENT); a model may serve
several side by side (``model_version_policy``), all listed in its metadata; a request naming one
runs on it, one naming none on the default (or the model's traffic split, by its routing key);
asking for a version that is not served is NOT_FOUND.

Raw tensor bytes (the binary extension, gRPC ``raw_*_contents``) are row-major elements in
little-endian order; a BYTES tensor is each element's 4-byte little-endian length, then its bytes;
a BOOL element is one byte, 0 or 1 (other bytes are refused; outputs are written as 0 or 1). BF16
is bfloat16: 2 raw bytes per element; JSON numbers go through float32 (inputs and outputs). JSON
outputs carry only what JSON can: a float output holding NaN or Infinity, or a BYTES output that
is not UTF-8, is refused with a hint to ask for it as binary data. Functions only; thread-safe.
"""

from __future__ import annotations

import importlib.metadata
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from processor import dtypes
from processor.echo import shorten
from processor.config_text import parse_json
from processor.errors import Internal, InvalidArgument, NotFound, PayloadTooLarge
from processor.request import MAX_VERSION, PredictCall, parse_version, version_number

from .. import native_json

SERVER_NAME = "serving-processor"
# The binary tensor extension over HTTP (Inference-Header-Content-Length); gRPC raw contents.
# The model repository extension (load, unload, index: server/repository.py), admin-protected.
EXTENSIONS = ("binary_tensor_data", "model_repository")

BF16 = np.dtype(ml_dtypes.bfloat16)
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_), "UINT8": np.dtype(np.uint8), "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32), "UINT64": np.dtype(np.uint64), "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16), "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64),
    "BF16": BF16, "BYTES": np.dtype(object),
}
_DATATYPE_NAMES = {dtype: name for name, dtype in DATATYPES.items() if name != "BYTES"}
_SIGNATURE_DATATYPES = {dtypes.DT_FLOAT: "FP32", dtypes.DT_DOUBLE: "FP64", dtypes.DT_INT32: "INT32",
                        dtypes.DT_UINT8: "UINT8", dtypes.DT_INT16: "INT16", dtypes.DT_INT8: "INT8",
                        dtypes.DT_STRING: "BYTES", dtypes.DT_INT64: "INT64", dtypes.DT_BOOL: "BOOL",
                        dtypes.DT_UINT16: "UINT16", dtypes.DT_HALF: "FP16", dtypes.DT_BFLOAT16: "BF16"}
MAX_RANK = 32  # numpy's limit before 2.0 (64 since); far above any served signature's rank
_ECHO = 80  # characters of a client's value repeated in an error
_BINARY_HINT = ("ask for it as binary data (parameters.binary_data_output for the request, or "
                "parameters.binary_data for this output)")


@dataclass(frozen=True)
class InferInput:
    """One input tensor as a transport parsed it: ``data`` a JSON value (nested lists or flat),
    :class:`DataPieces`, or a numpy array (gRPC's typed contents); or ``raw`` bytes."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: Any = None
    raw: bytes | memoryview | None = None


class DataPieces:
    """JSON ``data`` too large to parse at once: ``pieces()`` yields it as JSON values (lists,
    possibly nested) whose elements, flattened and in order, are the tensor's."""

    def __init__(self, pieces: Callable[[], Iterable[list]]) -> None:
        self.pieces = pieces


def server_metadata() -> dict[str, Any]:
    return {"name": SERVER_NAME, "version": _version(), "extensions": list(EXTENSIONS)}


def load_config(parameters: dict[str, Any]) -> Any:
    """The model config a repository load request's ``parameters`` carry (Triton's override
    form: ``config``, a JSON string of the model's ``model_config``; an object is taken too),
    None without one. File overrides (``file:<path>``, Triton's model directory sent in the
    request) are refused: a model's files are read from its ``savedmodel_dir``. Other
    parameters (``unload_dependents``...) are ignored."""
    files = sorted(k for k in parameters if k.startswith("file:"))
    if files:
        raise InvalidArgument(f"parameters.{echo(files[0])}: file overrides are not supported; name the "
                              f"model's files in its model_config's savedmodel_dir")
    config = parameters.get("config")
    if config is None:
        return None
    if isinstance(config, (str, bytes)):
        return parse_json(config, "parameters.config")  # ConfigError naming the parameter
    if not isinstance(config, dict):
        raise InvalidArgument(f"parameters.config: expected the model_config as a JSON string, got "
                              f"{type(config).__name__}")
    return config


def _version() -> str:
    try:
        return importlib.metadata.version("serving-processor")
    except importlib.metadata.PackageNotFoundError:
        return "0.0.0"


def echo(value: Any) -> str:
    """A client's value for a message, cut to about 80 characters (:func:`processor.config.shorten`)."""
    return shorten(value, _ECHO)


def _wanted(version: str | None) -> int | None:
    """The version number a URL or a field names (None: the served one)."""
    return parse_version(version) if version else None


def served(rt, name: str, version: str | None):
    """What serves ``name``'s version ``version`` (None: the default) (:class:`~processor.request.Served`);
    NOT_FOUND for a version that is not served, INVALID_ARGUMENT for a malformed one."""
    return rt.dataplane.served(name, _wanted(version))


def model_metadata(rt, name: str, version: str | None = None) -> dict[str, Any]:
    """The v2 model metadata: name, every served version (ascending, as strings), platform, and
    the inputs and outputs of the signature of ``version`` (None: the default version)."""
    serving = served(rt, name, version)
    platform = {"onnxruntime": "onnxruntime_onnx", "tensorflow": "tensorflow_savedmodel"}[serving.engine_name]
    numbers = sorted({version_number(v) for v in rt.model(name).served_versions()} | {serving.version_number})
    return {"name": name, "versions": [str(n) for n in numbers], "platform": platform,
            "inputs": [tensor_metadata(s) for s in serving.signature.inputs.values()],
            "outputs": [tensor_metadata(s) for s in serving.signature.outputs.values()]}


def tensor_metadata(spec) -> dict[str, Any]:
    return {"name": spec.alias, "datatype": _SIGNATURE_DATATYPES.get(spec.dtype, dtypes.dtype_name(spec.dtype)),
            "shape": list(spec.shape) if spec.shape is not None else [-1]}


def model_ready(rt, name: str, version: str | None = None, unserved_version: bool = True) -> bool:
    """Whether the model (and the version, when named) is ready: False while it loads or the
    server drains. NotFound for an unknown model and, with ``unserved_version``, for a version
    that is not served (as metadata and infer answer; else False); InvalidArgument for a
    malformed version."""
    wanted = _wanted(version)
    if not rt.model_ready(name):  # NotFound for an unknown model
        return False
    try:
        rt.dataplane.served(name, wanted)
    except NotFound:
        if unserved_version:
            raise
        return False
    return True


def element_count(name: str, shape: Any) -> int:
    """The elements of input ``name``'s ``shape``: non-negative int64 dimensions, rank at most
    MAX_RANK, a size numpy can index (zero-size shapes included); InvalidArgument otherwise."""
    if len(shape) > MAX_RANK:  # first: no product of a million dimensions
        raise _bad_shape(name, shape)
    count = nonzero = 1
    for d in shape:  # a loop, not generators: this runs for every input of every request
        if not isinstance(d, int) or isinstance(d, bool) or not 0 <= d <= MAX_VERSION:
            raise _bad_shape(name, shape)
        count *= d
        nonzero *= d or 1
    if nonzero > MAX_VERSION // 16:  # numpy's bound, zero-size or not
        raise InvalidArgument(f"input {echo(name)}: shape {echo(list(shape))} is too large for a tensor")
    return count


def _bad_shape(name: str, shape: Any) -> InvalidArgument:
    return InvalidArgument(f"input {echo(name)}: shape must list at most {MAX_RANK} non-negative "
                           f"64-bit integers, got {echo(list(shape))}")


def to_array(tensor: InferInput, max_elements: int | None = None,
             charge: Callable[[int], None] | None = None) -> np.ndarray:
    """The numpy array of one input tensor; InvalidArgument naming it when it does not fit.

    The element count is checked against the shape before anything is converted. For JSON data,
    ``max_elements``: a shape of more elements is refused (PayloadTooLarge); ``charge(nbytes)``
    is told the array's size before it is assembled from pieces (the decode memory budget; it
    raises to refuse)."""
    dtype = DATATYPES.get(tensor.datatype)
    if dtype is None:
        raise InvalidArgument(f"input {echo(tensor.name)}: unknown datatype {echo(tensor.datatype)}; "
                              f"expected one of {sorted(DATATYPES)}")
    shape = tensor.shape
    count = element_count(tensor.name, shape)
    if tensor.raw is not None:
        array = _from_raw(tensor.name, tensor.datatype, dtype, tensor.raw, count)
    elif isinstance(tensor.data, np.ndarray):
        array = _from_typed(tensor.name, tensor.datatype, dtype, tensor.data, count)
    else:
        if max_elements is not None and count > max_elements:
            raise PayloadTooLarge(f"input {echo(tensor.name)}: shape {echo(list(shape))} holds {count} "
                                  f"elements, more than {max_elements} (json_max_elements)")
        array = _from_data(tensor.name, tensor.datatype, dtype, tensor.data, count, charge)
    return array.reshape(shape)


RAW_FORM = "a raw binary request (Inference-Header-Content-Length: 0, no JSON header)"


def raw_input(rt, name: str, version: str | None, raw: bytes | memoryview) -> InferInput:
    """The one input of a raw binary infer request, :data:`RAW_FORM`: the body is the bytes of
    the model's single input, its datatype and shape the model's metadata says
    (:func:`tensor_metadata`), with one variable dimension inferred from the byte count (the
    element count for BYTES, walking the length prefixes). InvalidArgument for a model of
    several inputs, for a byte count no shape of the signature's fits, and for a signature
    with more than one variable dimension (the count cannot say how to split)."""
    specs = list(served(rt, name, version).signature.inputs.values())
    if len(specs) != 1:
        names = ", ".join(echo(s.alias) for s in specs[:8]) + (", ..." if len(specs) > 8 else "")
        raise InvalidArgument(f"model {echo(name)} has {len(specs)} inputs ({names}); {RAW_FORM} carries a "
                              f"model's only input: send a JSON header that names each input")
    meta = tensor_metadata(specs[0])
    input_name, datatype, dims = meta["name"], meta["datatype"], meta["shape"]
    dtype = DATATYPES[datatype]
    if dtype == object:
        count = _bytes_count(input_name, raw)
    else:
        if len(raw) % dtype.itemsize:
            raise InvalidArgument(f"input {echo(input_name)}: {len(raw)} raw bytes are not a whole number "
                                  f"of {datatype} elements ({dtype.itemsize} bytes each); {RAW_FORM}")
        count = len(raw) // dtype.itemsize
    variable = [i for i, d in enumerate(dims) if d is None or d < 0]
    known = 1
    for d in dims:
        known *= d if d is not None and d >= 0 else 1
    if len(variable) > 1:
        raise InvalidArgument(f"input {echo(input_name)}: its shape {dims} has {len(variable)} variable "
                              f"dimensions, which {RAW_FORM} cannot infer; send a JSON header with the shape")
    if variable and known and count % known == 0:
        shape = list(dims)
        shape[variable[0]] = count // known
    elif not variable and count == known:
        shape = list(dims)
    else:
        raise InvalidArgument(f"input {echo(input_name)}: {count} {datatype} elements do not fit its "
                              f"shape {dims}; {RAW_FORM}")
    return InferInput(input_name, datatype, tuple(shape), raw=raw)


def _bytes_count(name: str, raw: bytes | memoryview) -> int:
    """How many length-prefixed BYTES elements ``raw`` holds (it must end after the last)."""
    view, at, count = memoryview(raw), 0, 0
    while at < len(view):
        if at + 4 > len(view):
            raise InvalidArgument(f"input {echo(name)}: BYTES contents end inside a length prefix")
        at += 4 + struct.unpack_from("<I", view, at)[0]
        count += 1
    if at > len(view):
        raise InvalidArgument(f"input {echo(name)}: a BYTES element runs past the contents")
    return count


def _from_raw(name: str, datatype: str, dtype: np.dtype, raw: bytes | memoryview, count: int) -> np.ndarray:
    if dtype == object:
        return _bytes_elements(name, raw, count)
    if len(raw) != count * dtype.itemsize:
        raise InvalidArgument(f"input {echo(name)}: {len(raw)} raw bytes for {count} elements of "
                              f"{dtype.itemsize} byte(s)")
    if datatype == "BOOL" and count and int(np.frombuffer(raw, np.uint8).max()) > 1:
        raise InvalidArgument(f"input {echo(name)}: BOOL raw contents must be bytes 0 (false) or 1 (true)")
    if dtype == BF16:
        return np.frombuffer(raw, "<u2").astype(np.uint16).view(BF16)
    return np.frombuffer(raw, dtype.newbyteorder("<")).astype(dtype, copy=True)


def _bytes_elements(name: str, raw: bytes | memoryview, count: int) -> np.ndarray:
    """``count`` length-prefixed BYTES elements, which must be the whole contents; the walk stops
    at the count, so a flood of empty elements costs no more than the shape says."""
    view = memoryview(raw)
    end = len(view)
    out = np.empty(count, object)
    at = 0
    for i in range(count):
        if at + 4 > end:
            if at == end:
                raise InvalidArgument(f"input {echo(name)}: {i} BYTES elements for a shape of {count}")
            raise InvalidArgument(f"input {echo(name)}: BYTES contents end inside a length prefix")
        (n,) = struct.unpack_from("<I", view, at)
        at += 4
        if at + n > end:
            raise InvalidArgument(f"input {echo(name)}: a BYTES element of {n} bytes runs past the contents")
        out[i] = bytes(view[at:at + n])
        at += n
    if at != end:
        raise InvalidArgument(f"input {echo(name)}: more BYTES elements than the shape's {count} "
                              f"({end - at} bytes left after them)")
    return out


def _from_typed(name: str, datatype: str, dtype: np.dtype, values: np.ndarray, count: int) -> np.ndarray:
    """gRPC typed contents, already of their field's type, as ``dtype`` (narrower integer types
    range-checked)."""
    if values.size != count:
        raise InvalidArgument(f"input {echo(name)}: {values.size} elements for a shape of {count}")
    if dtype.kind in "iu" and values.size and values.dtype != dtype:
        info = np.iinfo(dtype)
        if values.min() < info.min or values.max() > info.max:
            raise InvalidArgument(f"input {echo(name)}: {datatype} contents must be integers in "
                                  f"[{info.min}, {info.max}]")
    return values.astype(dtype, copy=False)


def _from_data(name: str, datatype: str, dtype: np.dtype, data: Any, count: int,
               charge: Callable[[int], None] | None) -> np.ndarray:
    """JSON data (a value, or :class:`DataPieces`) as ``count`` elements of ``dtype``; a piece
    that would go past the count is refused before it is converted."""
    if data is None:
        raise InvalidArgument(f"input {echo(name)}: no data (give 'data', or binary contents)")
    fast = native_json.array(data, dtype, count)  # a whole list: what follows, in one pass
    if fast is not None:
        return fast
    pieces = data.pieces() if isinstance(data, DataPieces) else (data,)
    out: np.ndarray | None = None
    filled = 0
    for piece in pieces:
        flat = _flatten(name, piece)
        if filled + len(flat) > count:
            raise InvalidArgument(f"input {echo(name)}: more than {count} elements for a shape of {count}")
        part = _convert(name, datatype, dtype, flat)
        if out is None and len(flat) == count:  # all the data in one piece: no copy
            out, filled = part, count
            continue
        if out is None:
            if charge is not None:
                charge(count * dtype.itemsize)
            out = np.empty(count, dtype)
        out[filled:filled + len(flat)] = part
        filled += len(flat)
    if filled != count:
        raise InvalidArgument(f"input {echo(name)}: {filled} elements for a shape of {count}")
    return out if out is not None else np.empty(0, dtype)


def _convert(name: str, datatype: str, dtype: np.dtype, flat: list) -> np.ndarray:
    """Flat JSON values as an array of ``dtype``; InvalidArgument when they are not of its kind
    or not within its range (a finite number that would become infinity included)."""
    if dtype == object:
        if not all(isinstance(v, str) for v in flat):
            raise InvalidArgument(f"input {echo(name)}: BYTES data must be strings")
        out = np.empty(len(flat), object)
        out[:] = [v.encode("utf-8", "surrogatepass") for v in flat]
        return out
    try:
        values = np.asarray(flat)  # one pass in C; the checks below read its dtype, not each element
    except (ValueError, TypeError, OverflowError):
        values = np.asarray(flat, dtype=object)
    kind = values.dtype.kind if values.size else dtype.kind
    if datatype == "BOOL":
        if kind != "b":
            raise InvalidArgument(f"input {echo(name)}: BOOL data must be true/false")
        return values.astype(dtype, copy=False)
    if kind not in "iuf" or any(type(v) is bool for v in flat):  # numpy would take true as 1
        raise InvalidArgument(f"input {echo(name)}: {datatype} data must be numbers")
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        if kind == "f" or (values.size and (values.min() < info.min or values.max() > info.max)):
            raise InvalidArgument(f"input {echo(name)}: {datatype} data must be integers in "
                                  f"[{info.min}, {info.max}]")
        return values.astype(dtype, copy=False)
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused below, never printed
        wide = values.astype(np.float64, copy=False)
        out = (wide.astype(np.float32) if dtype == BF16 else wide).astype(dtype, copy=False)
        if out.size and not np.isfinite(out).all() and (np.isinf(out) & np.isfinite(wide)).any():
            biggest = float(ml_dtypes.finfo(dtype).max)
            raise InvalidArgument(f"input {echo(name)}: {datatype} data must be within ±{biggest:.4g} "
                                  f"(NaN and Infinity may be sent as such)")
    return out


def _flatten(name: str, data: Any) -> list:
    if not isinstance(data, list):
        raise InvalidArgument(f"input {echo(name)}: 'data' must be a JSON array")
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
    """An output's datatype; Internal for a dtype the protocol has no name for (the model's
    problem, not the client's)."""
    if array.dtype.kind in "OSU":
        return "BYTES"
    name = _DATATYPE_NAMES.get(array.dtype)
    if name is not None:
        return name
    raise Internal(f"an output of dtype {array.dtype} has no Open Inference Protocol datatype")


def raw_bytes(array: np.ndarray) -> bytes:
    """An output's raw contents (see the module doc)."""
    if array.dtype.kind in "OSU":
        parts = []
        for v in array.reshape(-1):
            b = v.encode() if isinstance(v, str) else bytes(v)
            parts.append(struct.pack("<I", len(b)))
            parts.append(b)
        return b"".join(parts)
    if array.dtype == np.bool_:  # one byte, 0 or 1, whatever byte the engine left
        return np.not_equal(np.ascontiguousarray(array).view(np.uint8), 0).tobytes()
    if array.dtype == BF16:
        return np.ascontiguousarray(array).view(np.uint16).astype("<u2").tobytes()
    return np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes()


def json_data(name: str, array: np.ndarray) -> list:
    """Output ``name``'s ``data``: the flat row-major elements. InvalidArgument, with the hint to
    ask for binary data, for what JSON cannot carry: NaN / Infinity, BYTES that are not UTF-8."""
    flat = array.reshape(-1)
    if array.dtype.kind in "OSU":
        try:
            return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in flat]
        except UnicodeDecodeError:
            raise InvalidArgument(f"output {echo(name)} holds bytes that are not UTF-8 text, which JSON "
                                  f"cannot carry; {_BINARY_HINT}") from None
    if array.dtype.kind == "f" or array.dtype == BF16:
        if array.dtype.itemsize < 4:  # float16 / bfloat16: as float32, exactly
            flat = flat.astype(np.float32)
        if not np.isfinite(flat).all():
            raise InvalidArgument(f"output {echo(name)} holds NaN or Infinity, which JSON cannot carry; "
                                  f"{_BINARY_HINT}")
    return flat.tolist()


def infer(rt, name: str, version: str | None, inputs: list[InferInput], outputs: list[str] | None,
          deadline: float | None = None, max_elements: int | None = None,
          charge: Callable[[int], None] | None = None,
          routing_key: str | None = None, prepare: bool = False) -> tuple[str, dict[str, np.ndarray], Any]:
    """Run one inference: (the number of the version that answered, as a string; outputs by
    name in request order; with ``prepare``, the PreparedCall of its form, if it has one, made
    from this one decode: ``InferForms.learn``'s). ``max_elements``, ``charge``:
    :func:`to_array`'s, for JSON data; ``routing_key``: :func:`infer_call`'s."""
    call = infer_call(name, version, inputs, outputs, max_elements, charge, deadline, routing_key)
    result = rt.dataplane.predict(call._replace(prepare=True) if prepare else call)
    return str(result.version_number), result.outputs, result.prepared


def infer_call(name: str, version: str | None, inputs: list[InferInput], outputs: list[str] | None,
               max_elements: int | None = None, charge: Callable[[int], None] | None = None,
               deadline: float | None = None, routing_key: str | None = None) -> PredictCall:
    """The PredictCall of an infer request: its inputs as arrays (:func:`to_array`), in order;
    InvalidArgument for a tensor that does not fit, an input or output named twice.
    ``routing_key``: what the model's traffic split hashes when ``version`` is None."""
    wanted = _wanted(version)
    arrays: dict[str, np.ndarray] = {}
    for tensor in inputs:
        if tensor.name in arrays:
            raise InvalidArgument(f"input {echo(tensor.name)} given twice")
        arrays[tensor.name] = to_array(tensor, max_elements, charge)
    if outputs is not None and len(set(outputs)) != len(outputs):
        raise InvalidArgument(f"an output is requested twice: {echo(outputs)}")
    return PredictCall(name, arrays, version=wanted, output_filter=outputs or None, deadline=deadline,
                       routing_key=routing_key)
