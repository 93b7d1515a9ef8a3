"""The one JSON nesting limit (issue 51): ``json_stream.nesting_depth`` (the Python reference)
and ``native_json.depth`` (``native/src/json_depth.cc``) agree on every text, valid JSON or not,
and ``check_depth`` refuses 65 levels and passes 64, whatever the parser would allow."""

from __future__ import annotations

import random

import pytest

from processor.errors import InvalidArgument
from server import native_json
from server.http.json_stream import MAX_DEPTH, check_depth, nesting_depth

needs_native = pytest.mark.skipif(native_json.depth(b"[]", 1) is None,
                                  reason="processor._native not built (scripts/setup.sh builds it)")


def nested(levels: int, inner: bytes = b"1") -> bytes:
    return b'{"a":' * (levels // 2) + b"[" * (levels - levels // 2) + inner + b"]" * (levels - levels // 2) + b"}" * (levels // 2)


CASES = [
    (b"", 0), (b"3", 0), (b"[1]", 1), (b"[[],[[]]]", 3), (b'{"a": [1, {"b": []}]}', 4),
    (b'["[[[[", "\\"[[", 1]', 1),            # brackets in strings, an escaped quote
    (b'["\\\\", [2]]', 2),                    # an escaped backslash ends before the quote
    (b'["unclosed [[[', 1),                   # an unclosed string ends the count
    (b"]]][[", 2), (b"[}]{", 1),              # stray closers never go below 0
    (nested(64), 64), (nested(65), 65), (nested(300), MAX_DEPTH + 1),
]


@pytest.mark.parametrize("text,depth", CASES)
def test_reference_depth(text, depth):
    assert nesting_depth(text, MAX_DEPTH) == depth


@needs_native
@pytest.mark.parametrize("text,depth", CASES)
def test_native_depth_equals_the_reference(text, depth):
    assert native_json.depth(text, MAX_DEPTH) == depth == nesting_depth(text, MAX_DEPTH)


@needs_native
def test_native_depth_equals_the_reference_on_random_texts():
    rng = random.Random(51)
    alphabet = b'[]{}"\\,: a1'
    for _ in range(3000):
        text = bytes(rng.choice(alphabet) for _ in range(rng.randrange(0, 200)))
        limit = rng.randrange(0, 12)
        assert native_json.depth(text, limit) == nesting_depth(text, limit), text
    big = nested(64, b'"' + b"[" * 100_000 + b'"')  # over the GIL-release size: the same answer
    assert native_json.depth(big, MAX_DEPTH) == nesting_depth(big, MAX_DEPTH) == 64


def test_check_depth_refuses_65_levels_and_passes_64():
    check_depth(nested(64))
    check_depth(b"[" + b"[1]," * 10_000 + b"[1]]")  # many brackets, 2 levels
    for body in (nested(65), nested(120), nested(65, b"[1, 2")):  # invalid JSON too: the depth first
        with pytest.raises(InvalidArgument, match="nesting deeper than 64 levels"):
            check_depth(body)
