"""ArrayDataType numbers (TensorFlow's DataType numbering) and their numpy / ArrayProto forms."""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

DT_INVALID, DT_FLOAT, DT_DOUBLE, DT_INT32, DT_UINT8, DT_INT16, DT_INT8, DT_STRING = range(8)
DT_COMPLEX64, DT_INT64, DT_BOOL = 8, 9, 10
DT_BFLOAT16, DT_UINT16, DT_COMPLEX128, DT_HALF, DT_RESOURCE, DT_VARIANT = 14, 17, 18, 19, 20, 21

DTYPE_NAMES: dict[int, str] = {
    0: "DT_INVALID", 1: "DT_FLOAT", 2: "DT_DOUBLE", 3: "DT_INT32", 4: "DT_UINT8", 5: "DT_INT16",
    6: "DT_INT8", 7: "DT_STRING", 8: "DT_COMPLEX64", 9: "DT_INT64", 10: "DT_BOOL", 11: "DT_QINT8",
    12: "DT_QUINT8", 13: "DT_QINT32", 14: "DT_BFLOAT16", 15: "DT_QINT16", 16: "DT_QUINT16",
    17: "DT_UINT16", 18: "DT_COMPLEX128", 19: "DT_HALF", 20: "DT_RESOURCE", 21: "DT_VARIANT",
}


@dataclass(frozen=True)
class WireType:
    """How one dtype travels in an ArrayProto.

    ``field`` is the repeated field holding the values; ``pairs`` means complex values interleaved
    as (real, imag); ``bits_field`` is the alternative field carrying raw 16-bit patterns
    (TensorFlow's TensorProto convention for half/bfloat16), accepted on input.
    """

    numpy: np.dtype
    field: str
    pairs: bool = False
    bits_field: str | None = None


WIRE_TYPES: dict[int, WireType] = {
    DT_FLOAT: WireType(np.dtype(np.float32), "float_val"),
    DT_DOUBLE: WireType(np.dtype(np.float64), "double_val"),
    DT_INT32: WireType(np.dtype(np.int32), "int_val"),
    DT_UINT8: WireType(np.dtype(np.uint8), "int_val"),
    DT_INT16: WireType(np.dtype(np.int16), "int_val"),
    DT_INT8: WireType(np.dtype(np.int8), "int_val"),
    DT_UINT16: WireType(np.dtype(np.uint16), "int_val"),
    DT_INT64: WireType(np.dtype(np.int64), "int64_val"),
    DT_BOOL: WireType(np.dtype(np.bool_), "bool_val"),
    DT_STRING: WireType(np.dtype(object), "string_val"),
    DT_COMPLEX64: WireType(np.dtype(np.complex64), "float_val", pairs=True),
    DT_COMPLEX128: WireType(np.dtype(np.complex128), "double_val", pairs=True),
    DT_HALF: WireType(np.dtype(np.float16), "float_val", bits_field="int_val"),
    DT_BFLOAT16: WireType(np.dtype(ml_dtypes.bfloat16), "float_val", bits_field="int_val"),
}

_NUMPY_TO_DT: dict[np.dtype, int] = {w.numpy: dt for dt, w in WIRE_TYPES.items()}
_NUMPY_TO_DT[np.dtype("S")] = DT_STRING


def dtype_of_array(array: np.ndarray) -> int:
    """The ArrayDataType of a numpy array (bytes and str arrays are DT_STRING)."""
    if array.dtype.kind in ("S", "U", "O"):
        return DT_STRING
    try:
        return _NUMPY_TO_DT[array.dtype]
    except KeyError:
        raise TypeError(f"numpy dtype {array.dtype} has no ArrayDataType") from None


def dtype_name(dt: int) -> str:
    return DTYPE_NAMES.get(dt, f"DT_{dt}")
