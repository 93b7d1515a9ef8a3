"""A served wire call straight to a ``PredictionLog`` record: protobuf bytes renumbered, never
decoded to arrays.

Our wire ``ArrayProto`` is TensorFlow's ``TensorProto`` with other field numbers: the same
dtype numbering, the same packed value encodings (``float_val`` 3 -> 5, ``double_val`` 4 -> 6,
``int_val`` 5 -> 7, ``string_val`` 6 -> 8, ``int64_val`` 7 -> 10, ``bool_val`` 8 -> 11); only
the shape differs (packed ``dim`` -> ``TensorShapeProto.dim`` messages). So a call that was
served from wire bytes becomes a record by copying each tensor's value bytes under a new tag:
the writer's work is per field, not per value (a 256-row request costs what a 1-row one does),
which keeps the writer thread's hold on the GIL short.

The record is the small upb-built :data:`~.proto.PredictionLog` (metadata, model specs, output
filter) followed by one more ``predict_log`` field holding the request's and response's map
entries: protobuf parsers merge repeated occurrences of a message field, so readers see one
``PredictLog`` with the inputs and outputs in it.

Only what maps exactly is copied: the dtypes whose values sit in the same typed field in both
protos (float, double, the 8-to-32-bit integers, string, int64, bool), packed as the protobuf
runtimes write them. Anything else (complex, half, bfloat16, an unpacked or unknown field, bytes
that do not parse) raises :class:`NotTranscodable`; the caller then writes the record through
the decoding path (:func:`~.record.resolve` and :func:`~.formats.prediction_log`), which
handles every case.

:func:`predict_log_tail` runs the native twin (``native/src/predict_log.cc``, without the GIL
for large calls) when the extension is built; :func:`predict_log_tail_reference` is the Python
it is tested against. Pure functions; thread-safe.
"""

from __future__ import annotations

from collections.abc import Mapping

from .. import native
from ..protobuf_wire import LEN as _LEN, length_field, varint

# dtype -> the wire field (ArrayProto) that carries its values, for the dtypes copied as they are
_VALUE_FIELD = {1: 3, 2: 4, 3: 5, 4: 5, 5: 5, 6: 5, 7: 6, 9: 7, 10: 8, 17: 5}
# ArrayProto value field -> TensorProto's tag byte (same payload, length-delimited)
_TENSOR_TAG = {3: bytes([5 << 3 | 2]), 4: bytes([6 << 3 | 2]), 5: bytes([7 << 3 | 2]),
               6: bytes([8 << 3 | 2]), 7: bytes([10 << 3 | 2]), 8: bytes([11 << 3 | 2])}
_VARINT = 0


class NotTranscodable(ValueError):
    """The call holds something only the decoding path writes (see the module doc)."""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        try:
            byte = data[pos]
        except IndexError:
            raise NotTranscodable("truncated varint") from None
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift >= 70 or result >> 64:
            raise NotTranscodable("varint too long")


def _fields(data: bytes):
    """(field number, payload) of each length-delimited field; varints as (field, int)."""
    pos, end = 0, len(data)
    while pos < end:
        tag, pos = _varint(data, pos)
        field, wire = tag >> 3, tag & 7
        if field == 0 or tag > 0xFFFFFFFF:
            raise NotTranscodable("bad tag")
        if wire == _LEN:
            size, pos = _varint(data, pos)
            if pos + size > end:
                raise NotTranscodable("truncated field")
            yield field, data[pos:pos + size]
            pos += size
        elif wire == _VARINT:
            value, pos = _varint(data, pos)
            yield field, value
        else:
            raise NotTranscodable(f"field {field} of wire type {wire}")


def _shape(data: bytes) -> bytes:
    """A packed ``ArrayShape`` -> a ``TensorShapeProto`` (one ``Dim`` message per size)."""
    dims = []
    for field, payload in _fields(data):
        if field != 1 or isinstance(payload, int):
            raise NotTranscodable("unexpected shape field")
        pos = 0
        while pos < len(payload):
            size, pos = _varint(payload, pos)
            dims.append(length_field(b"\x12", b"\x08" + varint(size) if size else b""))
    return b"".join(dims)


def tensor(array_proto: bytes) -> bytes:
    """One serialized ``ArrayProto`` as a serialized ``TensorProto``."""
    dtype, shape, value_field, values = 0, b"", 0, []
    for field, payload in _fields(array_proto):
        if field == 1 and isinstance(payload, int):
            dtype = payload
        elif field == 2 and not isinstance(payload, int):
            shape = _shape(payload)
        elif field in _TENSOR_TAG and not isinstance(payload, int):
            # strings come one field each; a packed field may come in chunks: kept in order
            if value_field and field != value_field:
                raise NotTranscodable("values in two fields")
            value_field = field
            values.append(payload)
        else:
            raise NotTranscodable(f"ArrayProto field {field}")
    wanted = _VALUE_FIELD.get(dtype)
    if wanted is None or (value_field and value_field != wanted):
        raise NotTranscodable(f"dtype {dtype}")
    out = [b"\x08" + varint(dtype)]
    if shape:
        out.append(length_field(b"\x12", shape))
    if value_field:
        tag = _TENSOR_TAG[value_field]
        out.extend(length_field(tag, payload) for payload in values)
    return b"".join(out)


def map_entries(message: bytes, field: int, aliases: Mapping[str, str] | None = None) -> bytes:
    """The ``map<string, ArrayProto>`` entries under ``field`` of a serialized message, as
    ``map<string, TensorProto>`` entries of the same field number (keys through ``aliases``,
    where a key it lacks fails); the message's other fields are left out."""
    tag = bytes([field << 3 | _LEN])
    out = []
    for number, entry in _fields(message):
        if number != field:
            continue
        if isinstance(entry, int):
            raise NotTranscodable("map entry as a varint")
        key, value = b"", b""
        for part, payload in _fields(entry):
            if isinstance(payload, int):
                raise NotTranscodable("map entry field as a varint")
            if part == 1:
                key = payload
            elif part == 2:
                value = payload
        if aliases is not None:
            try:
                key = aliases[key.decode()].encode()
            except (KeyError, UnicodeDecodeError):
                raise NotTranscodable("a key the signature does not take") from None
        out.append(length_field(tag, length_field(b"\x0a", key) + length_field(b"\x12", tensor(value))))
    return b"".join(out)


def predict_log_tail(request: bytes, response: bytes, aliases: Mapping[str, str]) -> bytes | None:
    """The ``PredictionLog.predict_log`` field (6) carrying the request's inputs (keys through
    ``aliases``: every name the signature takes -> its alias) and output filter and the
    response's outputs, to append to a serialized ``PredictionLog``; None when the call holds
    something not transcoded (see the module doc)."""
    if native.MODULE is not None:
        return native.MODULE.predict_log_tail(request, response, aliases)
    try:
        return predict_log_tail_reference(request, response, aliases)
    except NotTranscodable:
        return None


def predict_log_tail_reference(request: bytes, response: bytes, aliases: Mapping[str, str]) -> bytes:
    """:func:`predict_log_tail` in Python; raises NotTranscodable instead of returning None."""
    output_filter = b"".join(length_field(b"\x1a", name) for number, name in _fields(request)
                             if number == 3 and not isinstance(name, int))
    inner = (length_field(b"\x0a", map_entries(request, 2, aliases) + output_filter) +
             length_field(b"\x12", map_entries(response, 1)))
    return length_field(b"\x32", inner)
