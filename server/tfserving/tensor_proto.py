"""``tensorflow.TensorProto`` <-> numpy, for the TF Serving gRPC API (no TensorFlow ops needed).

Inputs may use ``tensor_content`` (what ``tf.make_tensor_proto`` writes for numbers) or the typed
repeated fields (one value is broadcast, as TensorFlow does); outputs are written the way TF
Serving writes them (``Tensor::AsProtoField``): the typed field of the dtype (``float_val``,
``int64_val``, ``int_val`` for the small integers, ``half_val`` holding float16 / bfloat16 bits,
``string_val``, ...), or with ``tensor_content=True`` (its
``enable_serialization_as_tensor_content``) numbers as ``tensor_content`` bytes; either way
``tf.make_ndarray`` reads them back. Problems raise InvalidArgument naming the input.
"""

from __future__ import annotations

import math

import numpy as np

from processor.dtypes import DT_BOOL, DT_HALF, DT_STRING, WIRE_TYPES, dtype_name, dtype_of_array
from processor.errors import InvalidArgument, PayloadTooLarge

_TYPED_FIELD = {  # dtype -> TensorProto repeated field holding its values
    1: "float_val", 2: "double_val", 3: "int_val", 4: "int_val", 5: "int_val", 6: "int_val",
    9: "int64_val", 10: "bool_val", 17: "int_val", 8: "scomplex_val", 18: "dcomplex_val",
}


def to_numpy(name: str, proto, max_bytes: int | None = None) -> np.ndarray:
    """Input ``name``'s array. ``max_bytes``: the most bytes one value broadcast to the shape may
    build (the server's ``max_request_bytes``: a tensor the client could not have sent whole); a
    larger broadcast is PayloadTooLarge, before any memory is taken."""
    wire = WIRE_TYPES.get(proto.dtype)
    if wire is None:
        raise InvalidArgument(f"input {name!r}: dtype {dtype_name(proto.dtype)} is not supported")
    if proto.tensor_shape.unknown_rank:
        raise InvalidArgument(f"input {name!r}: the tensor has unknown rank")
    shape = tuple([d.size for d in proto.tensor_shape.dim])
    if shape and min(shape) < 0:
        raise InvalidArgument(f"input {name!r}: negative dimension in shape {list(shape)}")
    count = math.prod(shape)  # exact (a Python int): a shape past int64 is no smaller than it is
    if proto.dtype == DT_STRING:
        values = list(proto.string_val)
        return _fit(name, np.array(values, dtype=object) if values else np.empty(0, object), shape, count,
                    max_bytes)
    content = proto.tensor_content  # (each read of the field makes a bytes object)
    if content:
        item = wire.numpy.itemsize
        if len(content) != count * item:
            raise InvalidArgument(f"input {name!r}: tensor_content holds {len(content)} "
                                  f"bytes, shape {list(shape)} of {dtype_name(proto.dtype)} needs {count * item}")
        return np.frombuffer(content, dtype=wire.numpy).reshape(shape)
    if proto.dtype == DT_HALF:
        flat = np.array(proto.half_val, dtype=np.uint16).view(np.float16)
    elif proto.dtype in _TYPED_FIELD:
        raw = getattr(proto, _TYPED_FIELD[proto.dtype])
        if wire.pairs:
            base = np.float32 if proto.dtype == 8 else np.float64
            flat = np.array(raw, dtype=base).view(wire.numpy)
        else:
            flat = np.array(raw, dtype=np.bool_ if proto.dtype == DT_BOOL else wire.numpy)
    else:
        raise InvalidArgument(f"input {name!r}: send {dtype_name(proto.dtype)} in tensor_content")
    return _fit(name, flat, shape, count, max_bytes)


def _fit(name: str, flat: np.ndarray, shape: tuple[int, ...], count: int, max_bytes: int | None) -> np.ndarray:
    if flat.size == count:
        return flat.reshape(shape)
    if flat.size == 1:  # TensorFlow broadcasts a single value
        if max_bytes is not None and count * flat.dtype.itemsize > max_bytes:
            raise PayloadTooLarge(f"input {name!r}: one value broadcast to shape {list(shape)} makes "
                                  f"{count} elements, over {max_bytes} bytes (max_request_bytes)")
        return np.full(shape, flat[0], dtype=flat.dtype)
    raise InvalidArgument(f"input {name!r}: shape {list(shape)} holds {count} values but "
                          f"{flat.size} were given")


_HALF_BITS = (DT_HALF, 14)  # half, bfloat16: their bits in half_val


def from_numpy(array: np.ndarray, proto, tensor_content: bool = False) -> None:
    """Fill ``proto`` (a TensorProto) from ``array``: the dtype's typed field, or (numbers, with
    ``tensor_content``) the raw bytes."""
    dt = dtype_of_array(array)
    proto.dtype = dt
    for d in array.shape:
        proto.tensor_shape.dim.add(size=d)
    flat = array.ravel()
    if dt == DT_STRING:
        proto.string_val.extend(v if isinstance(v, bytes) else str(v).encode() for v in flat.tolist())
    elif tensor_content or dt not in _TYPED_FIELD and dt not in _HALF_BITS:
        proto.tensor_content = np.ascontiguousarray(array).tobytes()
    elif dt in _HALF_BITS:
        proto.half_val.extend(flat.view(np.uint16).tolist())
    elif dt in (8, 18):  # complex: (real, imaginary) pairs
        getattr(proto, _TYPED_FIELD[dt]).extend(flat.view(np.float32 if dt == 8 else np.float64).tolist())
    else:
        getattr(proto, _TYPED_FIELD[dt]).extend(flat.tolist())
