"""PredictRequest bytes -> numpy feeds, numpy outputs -> PredictResponse bytes.

Every check a request needs happens here, before an engine sees it: known aliases (or tensor
names), every input present once, dtype equal to the signature's, value count equal to the
shape's element count, rank and fixed dimensions equal to the signature's. Failures raise
:class:`~processor.errors.InvalidArgument` with a message naming the input. Functions are pure
and thread-safe.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
from google.protobuf.message import DecodeError

from .dtypes import DT_STRING, WIRE_TYPES, dtype_name, dtype_of_array
from .errors import InvalidArgument
from .proto import predict_pb2
from .signature import Signature, TensorSpec

# Below this many values a list copy beats numpy's sequence protocol on upb containers.
_SMALL = 64


class DecodedRequest(NamedTuple):
    """Feeds keyed by input alias, and the outputs to fetch as (response key, output alias)."""

    feeds: dict[str, np.ndarray]
    fetches: tuple[tuple[str, str], ...]


def parse_request(data: bytes) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    try:
        request.ParseFromString(data)
    except DecodeError:
        raise InvalidArgument(
            f"request is not a serialized tensorflow.eas.PredictRequest ({len(data)} bytes)") from None
    return request


def decode_request(data: bytes, signature: Signature) -> DecodedRequest:
    """Parse and check a serialized PredictRequest against ``signature``."""
    return decode_message(parse_request(data), signature)


def decode_message(request: predict_pb2.PredictRequest, signature: Signature) -> DecodedRequest:
    """Check a parsed PredictRequest against ``signature`` and convert its inputs."""
    feeds = _feeds(request.inputs.items(), signature, array_from_proto)
    return DecodedRequest(feeds, _fetches(request.output_filter, signature))


def decode_arrays(inputs: Mapping[str, Any], output_filter: Sequence[str] | None,
                  signature: Signature, check_shapes: bool = True) -> DecodedRequest:
    """Check numpy inputs (keyed by alias or tensor name) exactly as protobuf requests are.

    For front-ends that parse their own wire format (JSON); no protobuf round trip.
    ``check_shapes=False``: TF Serving's rule, ranks and fixed dimensions are not checked (the
    graph decides; its refusal is InvalidArgument from the engine).
    """
    convert = array_from_numpy if check_shapes else _array_any_shape
    return DecodedRequest(_feeds(inputs.items(), signature, convert),
                          _fetches(output_filter or (), signature))


def _feeds(items: Iterable[tuple[str, Any]], signature: Signature,
           convert: Callable[[Any, TensorSpec], np.ndarray]) -> dict[str, np.ndarray]:
    feeds: dict[str, np.ndarray] = {}
    for key, value in items:
        spec = signature.input(key)
        if spec.alias in feeds:
            raise InvalidArgument(f"input {spec.alias!r} given twice (as alias and tensor name)")
        feeds[spec.alias] = convert(value, spec)
    if len(feeds) != len(signature.inputs):
        missing = sorted(set(signature.inputs) - set(feeds))
        raise InvalidArgument(f"missing input(s) {missing}; signature {signature.name!r} takes "
                              f"{sorted(signature.inputs)}")
    return feeds


def _fetches(output_filter: Sequence[str], signature: Signature) -> tuple[tuple[str, str], ...]:
    if not output_filter:
        return tuple((alias, alias) for alias in signature.outputs)
    fetches = []
    for key in output_filter:
        if not key:
            raise InvalidArgument("output_filter holds an empty name")
        fetches.append((key, signature.output(key).alias))
    return tuple(fetches)


def _array_any_shape(value: Any, spec: TensorSpec) -> np.ndarray:
    """:func:`array_from_numpy` checking the dtype only."""
    return array_from_numpy(value, spec, check_shape=False)


def array_from_numpy(value: Any, spec: TensorSpec, check_shape: bool = True) -> np.ndarray:
    """Check a numpy input against its signature tensor (dtype and, with ``check_shape``, rank
    and fixed dimensions); strings as bytes."""
    try:
        array = np.asarray(value)
        dt = dtype_of_array(array)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"input {spec.alias!r}: bad value: {exc}") from None
    if dt != spec.dtype:
        raise InvalidArgument(f"input {spec.alias!r}: dtype {dtype_name(dt)} given, "
                              f"signature expects {dtype_name(spec.dtype)}")
    if check_shape:
        _check_shape(spec, array.shape)
    if dt == DT_STRING and array.dtype != object:
        array = np.array([v.encode() if isinstance(v, str) else bytes(v) for v in array.ravel().tolist()],
                         dtype=object).reshape(array.shape)
    return array


def array_from_proto(proto: predict_pb2.ArrayProto, spec: TensorSpec) -> np.ndarray:
    """Convert one ArrayProto to a numpy array of the signature's dtype and a checked shape."""
    if proto.dtype != spec.dtype:
        raise InvalidArgument(f"input {spec.alias!r}: dtype {dtype_name(proto.dtype)} given, "
                              f"signature expects {dtype_name(spec.dtype)}")
    wire = WIRE_TYPES.get(spec.dtype)
    if wire is None:
        raise InvalidArgument(f"input {spec.alias!r}: dtype {dtype_name(spec.dtype)} is not supported")
    shape = tuple(proto.array_shape.dim)
    if any(d < 0 for d in shape):
        raise InvalidArgument(f"input {spec.alias!r}: negative dimension in shape {list(shape)}")
    _check_shape(spec, shape)
    count = 1
    for d in shape:
        count *= d
    values = getattr(proto, wire.field)
    n = len(values)
    if wire.bits_field is not None and n == 0 and count:
        bits = getattr(proto, wire.bits_field)
        if len(bits) != count:
            raise InvalidArgument(f"input {spec.alias!r}: shape {list(shape)} holds {count} values "
                                  f"but {len(bits)} were given in {wire.bits_field}")
        return np.array(bits, dtype=np.uint16).view(wire.numpy).reshape(shape)
    expected = count * 2 if wire.pairs else count
    if n != expected:
        raise InvalidArgument(f"input {spec.alias!r}: shape {list(shape)} holds {count} values "
                              f"but {n // 2 if wire.pairs else n} were given in {wire.field}")
    if spec.dtype == DT_STRING:
        array = np.empty(n, dtype=object)
        array[:] = values[:] if n else []
        return array.reshape(shape)
    raw = values[:] if n < _SMALL else values
    if wire.pairs:
        base = np.float32 if wire.numpy == np.complex64 else np.float64
        return np.array(raw, dtype=base).view(wire.numpy).reshape(shape)
    try:
        return np.array(raw, dtype=wire.numpy).reshape(shape)
    except OverflowError:
        raise InvalidArgument(f"input {spec.alias!r}: a value is out of range for "
                              f"{dtype_name(spec.dtype)}") from None


def _check_shape(spec: TensorSpec, shape: tuple[int, ...]) -> None:
    """``shape`` (no negative dimension: a numpy array's, or checked) against the signature's."""
    expected = spec.shape
    if expected is None:
        return
    if len(shape) != len(expected):
        raise InvalidArgument(f"input {spec.alias!r}: rank {len(shape)} (shape {list(shape)}) given, "
                              f"signature expects rank {len(expected)} (shape {list(expected)})")
    for got, want in zip(shape, expected):
        if want >= 0 and got != want:
            # one row for every row (a ranking request's context) is taken only where the first
            # dimension is free: say so, since that is what such a client meant
            why = ("; only an input whose first dimension the signature leaves free may be sent as one row "
                   "for every row" if shape[0] == 1 and expected[0] > 1 else "")
            raise InvalidArgument(f"input {spec.alias!r}: shape {list(shape)} given, "
                                  f"signature expects {list(expected)}{why}")


def fill_proto(proto: predict_pb2.ArrayProto, array: np.ndarray) -> None:
    """Write ``array`` into an ArrayProto (dtype, shape, values)."""
    dt = dtype_of_array(array)
    wire = WIRE_TYPES[dt]
    proto.dtype = dt
    proto.array_shape.dim[:] = array.shape
    flat = array.ravel()
    if dt == DT_STRING:
        proto.string_val[:] = [v if isinstance(v, bytes) else str(v).encode() for v in flat.tolist()]
    elif wire.pairs:
        base = np.float32 if array.dtype == np.complex64 else np.float64
        getattr(proto, wire.field)[:] = flat.view(base).tolist()
    elif wire.bits_field is not None:  # half / bfloat16 travel as floats, DeepRec's way
        proto.float_val[:] = flat.astype(np.float32).tolist()
    else:
        getattr(proto, wire.field)[:] = flat.tolist()


def encode_response(outputs: dict[str, np.ndarray]) -> bytes:
    """Serialize outputs (keyed by response key) as a PredictResponse."""
    response = predict_pb2.PredictResponse()
    for key, array in outputs.items():
        fill_proto(response.outputs[key], array)
    # Deterministic: map order must not depend on the process (hosts compare bytes).
    return response.SerializeToString(deterministic=True)


def encode_request(inputs: dict[str, np.ndarray], output_filter: list[str] | None = None,
                   signature_name: str = "") -> bytes:
    """Build a serialized PredictRequest from numpy inputs (clients, warmup, tests)."""
    request = predict_pb2.PredictRequest(signature_name=signature_name,
                                         output_filter=output_filter or [])
    for key, array in inputs.items():
        fill_proto(request.inputs[key], np.asarray(array))
    return request.SerializeToString()


def decode_response(data: bytes) -> dict[str, np.ndarray]:
    """Parse a serialized PredictResponse into numpy arrays (clients and tests)."""
    response = predict_pb2.PredictResponse()
    response.ParseFromString(data)
    out = {}
    for key, proto in response.outputs.items():
        spec = TensorSpec(key, key, proto.dtype, tuple(proto.array_shape.dim))
        out[key] = array_from_proto(proto, spec)
    return out
