"""TensorFlow's string fingerprint (``Fingerprint64`` = farmhash ``na::Hash64``), vectorised in numpy.

``tf.strings.to_hash_bucket_fast(s, n)`` is ``Fingerprint64(s) mod n`` (unsigned). ONNX Runtime
has no such op (the ``StringToHashBucketFast`` of onnxruntime-extensions computes a different
hash, so a converted model would look up other rows), so the ONNX Runtime backend hashes string
inputs here, before the engine, and the converted graph takes the 64-bit fingerprints as
``uint64`` and only does the ``mod n`` (see :mod:`processor.engine.onnx.convert`).

Strings are grouped by byte length and each group is hashed with whole-array uint64 arithmetic,
so the cost is a few dozen numpy operations per distinct length. ``str`` elements are encoded as
UTF-8 (what TensorFlow receives for them). Pure functions; thread-safe.
"""

from __future__ import annotations

import numpy as np

from .. import native

_K0 = np.uint64(0xC3A5C85C97CB3127)
_K1 = np.uint64(0xB492B66FBE98F273)
_K2 = np.uint64(0x9AE16A3B2F90404F)
_SEED = np.uint64(81)
_U64 = np.uint64


def _rot(v: np.ndarray, shift: int) -> np.ndarray:
    return (v >> _U64(shift)) | (v << _U64(64 - shift))


def _shift_mix(v: np.ndarray) -> np.ndarray:
    return v ^ (v >> _U64(47))


def _len16(u: np.ndarray, v: np.ndarray, mul) -> np.ndarray:
    a = (u ^ v) * mul
    a ^= a >> _U64(47)
    b = (v ^ a) * mul
    b ^= b >> _U64(47)
    return b * mul


class _Rows:
    """``n`` strings of one byte length as an ``[n, length]`` uint8 array, with little-endian fetches."""

    def __init__(self, rows: np.ndarray) -> None:
        self.rows = rows

    def f64(self, offset: int) -> np.ndarray:
        return np.ascontiguousarray(self.rows[:, offset:offset + 8]).view("<u8").reshape(-1).astype(np.uint64)

    def f32(self, offset: int) -> np.ndarray:
        return np.ascontiguousarray(self.rows[:, offset:offset + 4]).view("<u4").reshape(-1).astype(np.uint64)

    def byte(self, offset: int) -> np.ndarray:
        return self.rows[:, offset].astype(np.uint64)


def _weak32(r: _Rows, off: int, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    w, x, y, z = r.f64(off), r.f64(off + 8), r.f64(off + 16), r.f64(off + 24)
    a = a + w
    b = _rot(b + a + z, 21)
    c = a
    a = a + x + y
    b = b + _rot(a, 44)
    return a + z, b + c


def _hash_rows(r: _Rows, n: int, length: int) -> np.ndarray:
    """Fingerprint64 of ``n`` strings, each ``length`` bytes."""
    if length == 0:
        return np.full(n, _K2, np.uint64)
    mul = _K2 + _U64(length * 2)
    if length <= 3:
        y = r.byte(0) + (r.byte(length >> 1) << _U64(8))
        z = _U64(length) + (r.byte(length - 1) << _U64(2))
        return _shift_mix(y * _K2 ^ z * _K0) * _K2
    if length <= 7:
        a = r.f32(0)
        return _len16(_U64(length) + (a << _U64(3)), r.f32(length - 4), mul)
    if length <= 16:
        a = r.f64(0) + _K2
        b = r.f64(length - 8)
        c = _rot(b, 37) * mul + a
        d = (_rot(a, 25) + b) * mul
        return _len16(c, d, mul)
    if length <= 32:
        a = r.f64(0) * _K1
        b = r.f64(8)
        c = r.f64(length - 8) * mul
        d = r.f64(length - 16) * _K2
        return _len16(_rot(a + b, 43) + _rot(c, 30) + d, a + _rot(b + _K2, 18) + c, mul)
    if length <= 64:
        a = r.f64(0) * _K2
        b = r.f64(8)
        c = r.f64(length - 8) * mul
        d = r.f64(length - 16) * _K2
        y = _rot(a + b, 43) + _rot(c, 30) + d
        z = _len16(y, a + _rot(b + _K2, 18) + c, mul)
        e = r.f64(16) * mul
        f = r.f64(24)
        g = (y + r.f64(length - 32)) * mul
        h = (z + r.f64(length - 24)) * mul
        return _len16(_rot(e + f, 43) + _rot(g, 30) + h, e + _rot(f + a, 18) + g, mul)
    return _hash_long(r, n, length)


def _hash_long(r: _Rows, n: int, length: int) -> np.ndarray:
    zeros = np.zeros(n, np.uint64)
    x = np.full(n, _SEED, np.uint64)
    y = np.full(n, _SEED * _K1 + _U64(113), np.uint64)
    z = _shift_mix(y * _K2 + _U64(113)) * _K2
    v = (zeros, zeros)
    w = (zeros, zeros)
    x = x * _K2 + r.f64(0)
    end = ((length - 1) // 64) * 64
    s = 0
    while True:
        x = _rot(x + y + v[0] + r.f64(s + 8), 37) * _K1
        y = _rot(y + v[1] + r.f64(s + 48), 42) * _K1
        x = x ^ w[1]
        y = y + v[0] + r.f64(s + 40)
        z = _rot(z + w[0], 33) * _K1
        v = _weak32(r, s, v[1] * _K1, x + w[0])
        w = _weak32(r, s + 32, z + w[1], y + r.f64(s + 16))
        z, x = x, z
        s += 64
        if s == end:
            break
    mul = _K1 + ((z & _U64(0xFF)) << _U64(1))
    s = length - 64
    w0 = w[0] + _U64((length - 1) & 63)
    v0 = v[0] + w0
    w0 = w0 + v0
    v, w = (v0, v[1]), (w0, w[1])
    x = _rot(x + y + v[0] + r.f64(s + 8), 37) * mul
    y = _rot(y + v[1] + r.f64(s + 48), 42) * mul
    x = x ^ (w[1] * _U64(9))
    y = y + v[0] * _U64(9) + r.f64(s + 40)
    z = _rot(z + w[0], 33) * mul
    v = _weak32(r, s, v[1] * mul, x + w[0])
    w = _weak32(r, s + 32, z + w[1], y + r.f64(s + 16))
    z, x = x, z
    return _len16(_len16(v[0], w[0], mul) + _shift_mix(y) * _K0 + z, _len16(v[1], w[1], mul) + x, mul)


def _as_bytes(value) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytearray, memoryview, np.bytes_)):
        return bytes(value)
    raise TypeError(f"expected bytes or str, got {type(value).__name__}")


def fingerprint64(values: np.ndarray) -> np.ndarray:
    """TensorFlow's ``Fingerprint64`` of every element of a string array; uint64, same shape.

    Raises TypeError for an element that is neither ``bytes`` nor ``str``.
    """
    values = np.asarray(values, dtype=object)
    flat = values.reshape(-1).tolist()
    if set(map(type, flat)) - {bytes}:
        flat = [_as_bytes(v) for v in flat]
    out = np.empty(len(flat), np.uint64)
    if not flat:
        return out.reshape(values.shape)
    lengths = np.fromiter(map(len, flat), np.int64, len(flat))
    with np.errstate(over="ignore"):
        first = int(lengths[0])
        if (lengths == first).all():  # the common case: one width (ids, fixed-format tokens)
            rows = np.frombuffer(b"".join(flat), np.uint8).reshape(len(flat), first)
            out[:] = _hash_rows(_Rows(rows), len(flat), first)
        else:
            for length in np.unique(lengths).tolist():
                index = np.flatnonzero(lengths == length)
                joined = b"".join([flat[i] for i in index.tolist()])
                rows = np.frombuffer(joined, np.uint8).reshape(len(index), length)
                out[index] = _hash_rows(_Rows(rows), len(index), length)
    return out.reshape(values.shape)


def fingerprint(values: np.ndarray) -> np.ndarray:
    """:func:`fingerprint64` computed by the native extension (GIL released) when it is built.

    Same result and errors: whatever the extension does not take (elements other than bytes and
    str, arrays other than object arrays) goes to :func:`fingerprint64`, the reference.
    """
    if native.MODULE is not None:
        out = native.MODULE.fingerprint64(values)
        if out is not None:
            return out
    return fingerprint64(values)


def to_hash_bucket_fast(values: np.ndarray, num_buckets: int) -> np.ndarray:
    """``tf.strings.to_hash_bucket_fast``: int64 bucket of every element."""
    return (fingerprint64(values) % np.uint64(num_buckets)).astype(np.int64)


def hash_buckets(values: np.ndarray, num_buckets: int) -> np.ndarray:
    """:func:`to_hash_bucket_fast` computed by the native extension (hash and modulo in one
    pass, GIL released) when it is built; the reference otherwise, and for what it does not take."""
    if native.MODULE is not None:
        out = native.MODULE.fingerprint64(values, num_buckets)
        if out is not None:
            return out
    return to_hash_bucket_fast(values, num_buckets)
