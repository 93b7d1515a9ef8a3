"""Protobuf's wire format, written by hand where bytes are spliced rather than messages built:
a varint, a length-delimited field. Used by the prediction log's transcoder
(:mod:`processor.prediction_log.transcode`) and the server's span export envelope
(:mod:`server.otel_export`). Pure functions."""

from __future__ import annotations

LEN = 2  # the wire type of a length-delimited field


def varint(value: int) -> bytes:
    """``value`` (a non-negative int below 2**64) as a protobuf varint."""
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def length_field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its encoded ``tag`` (field number << 3 | 2), the length, the bytes."""
    return tag + varint(len(payload)) + payload


def tag(number: int) -> bytes:
    """The encoded tag of length-delimited field ``number``."""
    return varint(number << 3 | LEN)
