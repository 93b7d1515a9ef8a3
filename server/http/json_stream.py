"""Bounded-memory access to a large JSON document: a structural index built with numpy, and
parsing of one piece at a time.

A 60 MB TF Serving request parsed whole becomes millions of Python lists, floats and dicts
(20 to 60 times the body). Here the body is scanned instead, block by block, for its structure:
the brackets, commas and colons outside strings and their nesting depth (numpy over the bytes;
no Python object per value). That finds the members of an object and splits a big array into
runs of elements of about ``CHUNK`` bytes; each run is parsed on its own (orjson, or the json
module for ``NaN``/``Infinity``) and can be turned into numpy before the next one is read.

Validity: a run is parsed as ``[`` + its text + ``]``, so every byte of a value is parsed by a
strict parser; a document this module accepts is valid JSON, whatever the scan concluded (a
wrong split only makes a run fail to parse). Nesting deeper than ``max_depth`` is refused before
anything is parsed.

Whole or a run at a time (:func:`parse_whole`): orjson on the whole body is about 2.5 times
faster (a 4,096-row TF Serving body of 2.4 MB: 24 ms, against 59 ms a run at a time) but holds
every value as a Python object at once, 3 to 19 times the body where a run at a time holds
about 2 times. So a body up to :data:`SMALL_BODY` is parsed whole, and a larger one too when the
decode memory budget (``json_decode_memory_bytes``, :mod:`server.http.memory_budget`) can hold
orjson's peak for it now: it streams only when a whole-body decode would exceed the memory that
setting allows.

One nesting limit holds for every JSON body on every route, :data:`MAX_DEPTH` levels of arrays
and objects inside each other: a large body's :class:`Document` checks it as it indexes, and a
body parsed whole is checked first (:func:`check_depth`): the parsers themselves allow ~1,000.

Every problem raises :class:`~processor.errors.InvalidArgument` with a bounded message. Pure
functions over an immutable buffer; thread-safe.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from processor.errors import InvalidArgument

from .. import native_json
from .memory_budget import Hold

MAX_DEPTH = 64  # arrays and objects inside each other: numpy's most dimensions (a rank-60 tensor fits)
SMALL_BODY = 256 * 1024  # bodies up to this size are parsed whole, always (see parse_whole)
DEFAULT_MAX_ELEMENTS = 1 << 25  # tensor elements per request (a 64 MiB body holds at most ~32M)
CHUNK = 256 * 1024  # bytes of JSON text parsed at once when a value is split into runs
BLOCK = 1 << 20  # bytes scanned per numpy step

_OPEN, _CLOSE, _COMMA, _COLON, _QUOTE, _BSLASH = 1, 2, 3, 4, 5, 6
_LUT = np.zeros(256, np.int8)
_LUT[[ord("["), ord("{")]] = _OPEN
_LUT[[ord("]"), ord("}")]] = _CLOSE
_LUT[ord(",")] = _COMMA
_LUT[ord(":")] = _COLON
_LUT[ord('"')] = _QUOTE
_LUT[ord("\\")] = _BSLASH
_DELTA = np.zeros(8, np.int64)
_DELTA[_OPEN], _DELTA[_CLOSE] = 1, -1
_WS = np.zeros(256, bool)
_WS[[0x20, 0x09, 0x0A, 0x0D]] = True


def parse_whole(size: int, hold: Hold | None) -> bool:
    """Whether a JSON body (a TF Serving REST body, a KServe v2 JSON header) of ``size`` bytes
    is parsed whole with orjson rather than indexed and parsed a run at a time (:class:`Document`).

    * Up to :data:`SMALL_BODY`: whole.
    * Larger: whole when the request's share of the decode memory budget can grow from
      ``FACTOR`` to ``WHOLE_FACTOR`` times ``size`` now (:meth:`~server.http.memory_budget.Hold.try_whole`:
      orjson's peak, estimated as that multiple of the body, within ``json_decode_memory_bytes``
      beside what other requests hold; then it is held). Else a run at a time: a body whose
      whole-body peak alone is over the budget (with the default 1 GiB, one over about 44 MB),
      or one arriving while other requests hold the room, streams within its 2 x.
    * Larger with no ``hold`` (a caller outside a request) or no budget
      (``json_decode_memory_bytes`` 0: nothing to hold orjson's peak against): a run at a time.
    """
    if size <= SMALL_BODY:
        return True
    return hold is not None and hold.try_whole(size)


def clip(value: Any, limit: int = 80) -> str:
    """``repr`` of a value for a message: ASCII-safe (lone surrogates escaped) and at most about
    ``limit`` characters, with the original length when cut."""
    if isinstance(value, (str, bytes)) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value)} characters)"
    text = repr(value)
    if len(text) > limit + 20:
        text = f"{text[:limit]}... ({len(text)} characters)"
    return text


def parse_error(exc: ValueError, offset: int = 0) -> InvalidArgument:
    """A json/orjson decode error as InvalidArgument, its position made absolute."""
    msg = getattr(exc, "msg", None)
    pos = getattr(exc, "pos", None)
    if isinstance(exc, UnicodeDecodeError):
        return InvalidArgument(f"JSON Parse error: the body is not valid UTF-8 (byte {offset + exc.start})")
    if msg is None or pos is None:
        return InvalidArgument(f"JSON Parse error: {clip(str(exc), 200)}")
    # rapidjson's words (TF Serving's parser) where clients match them: "Invalid value."
    text = "Invalid value" if msg == "Expecting value" else clip(msg, 200)[1:-1]
    return InvalidArgument(f"JSON Parse error: {text} at byte {offset + pos}")


def loads(text: bytes | bytearray | memoryview, offset: int = 0) -> Any:
    """One JSON text: orjson, and the json module where orjson refuses (``NaN``/``Infinity``,
    numbers beyond float range, lone surrogate escapes). ``offset``: where ``text`` starts in the
    body, for messages."""
    try:
        return _fast_loads(text)
    except ValueError:
        return slow_loads(text, offset)


def slow_loads(text: bytes | bytearray | memoryview, offset: int = 0) -> Any:
    """:func:`loads` with the json module only (what orjson refused)."""
    try:
        return json.loads(text if isinstance(text, (bytes, bytearray)) else bytes(text))
    except RecursionError:
        raise InvalidArgument("JSON Parse error: the document is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise parse_error(exc, offset) from None


def too_deep(max_depth: int) -> InvalidArgument:
    return InvalidArgument(f"JSON Parse error: nesting deeper than {max_depth} levels (arrays and "
                           f"objects inside each other)")


def check_depth(body: bytes | bytearray, max_depth: int = MAX_DEPTH) -> None:
    """InvalidArgument when ``body`` nests arrays and objects more than ``max_depth`` levels deep
    (see the module doc), whatever else is wrong with it. Only a body with more brackets than
    that can be too deep: for any other this costs two counts."""
    if body.count(b"[") + body.count(b"{") <= max_depth:
        return
    depth = native_json.depth(body, max_depth)
    if depth is None:
        depth = nesting_depth(body, max_depth)
    if depth > max_depth:
        raise too_deep(max_depth)


# a string (to its closing quote, or the end of an unclosed one), or a bracket
_NESTING_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"?|[\[\]{}]', re.S)


def nesting_depth(text: bytes | bytearray, limit: int) -> int:
    """The deepest nesting of arrays and objects in ``text`` (brackets in strings do not count),
    counted up to ``limit + 1``; invalid JSON is counted as it comes (a stray closing bracket
    never takes the level below 0). The reference ``native_json.depth`` is tested against."""
    level = deepest = 0
    for token in _NESTING_TOKENS.finditer(text):
        c = token.group()[0]
        if c in b"[{":
            level += 1
            if level > deepest:
                deepest = level
                if deepest > limit:
                    break
        elif c in b"]}" and level:
            level -= 1
    return deepest


try:  # the server extra has orjson
    import orjson

    _fast_loads = orjson.loads
except ImportError:  # pragma: no cover
    _fast_loads = json.loads


@dataclass(frozen=True)
class Span:
    """A JSON value in the body: ``buf[lo:hi]``, whitespace stripped."""

    lo: int
    hi: int

    @property
    def size(self) -> int:
        return self.hi - self.lo


@dataclass(frozen=True)
class Container:
    """The index of one array or object: separator positions at its own level."""

    span: Span
    count: int  # elements (array) or members (object)
    commas: np.ndarray  # depth-1 commas: all of them, or a sample (see scan's ``every``)
    colons: np.ndarray  # depth-1 colons (objects; empty for arrays)


class Document:
    """A JSON body and its structure, scanned on demand (see the module doc)."""

    def __init__(self, body: bytes | bytearray, max_depth: int) -> None:
        self.body = body
        self.buf = np.frombuffer(body, np.uint8)
        self.max_depth = max_depth

    # --- spans ------------------------------------------------------------------------------

    def root(self) -> Span:
        lo = self._skip_ws(0, len(self.buf))
        hi = self._skip_ws_back(lo, len(self.buf))
        if lo >= hi:
            raise InvalidArgument("JSON Parse error: The document is empty")
        return Span(lo, hi)

    def is_array(self, span: Span) -> bool:
        return self.buf[span.lo] == 0x5B

    def is_object(self, span: Span) -> bool:
        return self.buf[span.lo] == 0x7B

    def load(self, span: Span) -> Any:
        return loads(self.body[span.lo:span.hi], span.lo)

    def _skip_ws(self, lo: int, hi: int) -> int:
        step = 64
        while lo < hi:
            window = self.buf[lo:min(hi, lo + step)]
            hits = np.flatnonzero(~_WS[window])
            if hits.size:
                return lo + int(hits[0])
            lo += window.size
            step = min(step * 8, BLOCK)
        return hi

    def _skip_ws_back(self, lo: int, hi: int) -> int:
        step = 64
        while hi > lo:
            start = max(lo, hi - step)
            hits = np.flatnonzero(~_WS[self.buf[start:hi]])
            if hits.size:
                return start + int(hits[-1]) + 1
            hi = start
            step = min(step * 8, BLOCK)
        return lo

    def _trim(self, lo: int, hi: int) -> Span:
        lo = self._skip_ws(lo, hi)
        return Span(lo, self._skip_ws_back(lo, hi))

    # --- structure --------------------------------------------------------------------------

    def scan(self, span: Span, depth: int, every: int = 0, max_members: int | None = None) -> Container:
        """Index the array or object ``span`` (at nesting level ``depth``, 1 for the document).

        ``every``: keep about one comma per ``every`` bytes (split points for runs); 0: keep all.
        The closing bracket must be the last byte of the span; nesting deeper than
        ``max_depth`` and more than ``max_members`` members are refused."""
        lo, hi = span.lo, span.hi
        commas, colons, n_commas, end = self._index(lo, hi, 0, depth - 1, every, max_members)
        if end != hi - 1:
            if end < 0:
                raise InvalidArgument(f"JSON Parse error: unexpected end of the document; an array or "
                                      f"object opened at byte {lo} is not closed")
            raise InvalidArgument(f"JSON Parse error: unexpected text after the value at byte {end + 1}")
        if self.buf[end] != (0x5D if self.is_array(span) else 0x7D):
            raise InvalidArgument(f"JSON Parse error: mismatched bracket at byte {end}")
        empty = self._skip_ws(lo + 1, end) == end
        return Container(span, 0 if empty else n_commas + 1, commas, colons)

    def _index(self, lo: int, hi: int, level: int, depth: int, every: int,
               max_members: int | None) -> tuple[np.ndarray, np.ndarray, int, int]:
        """Scan ``buf[lo:hi]`` starting at ``level`` (nesting relative to the container being
        indexed; ``depth``: the container's own nesting in the document, less one). Returns the
        level-1 commas (all, or sampled with ``every``), the level-1 colons, how many level-1
        commas there are, and where the level drops to 0 (-1: it does not)."""
        buf = self.buf
        in_string = False
        backslashes = 0  # parity of the backslash run that ends the previous block
        commas: list[np.ndarray] = []
        colons: list[np.ndarray] = []
        n_commas = 0
        last_bucket = -1
        end = -1
        limit = self.max_depth - depth  # deepest relative level allowed
        pos = lo
        while pos < hi and end < 0:
            stop = min(pos + BLOCK, hi)
            codes = _LUT[buf[pos:stop]]
            idx = np.flatnonzero(codes)
            if idx.size == 0:
                backslashes = 0
                pos = stop
                continue
            code = codes[idx]
            is_bs = code == _BSLASH
            if backslashes or is_bs.any():
                escaped, backslashes = _escapes(idx, is_bs, backslashes, stop - pos)
                keep = ~(is_bs | escaped)
                idx, code = idx[keep], code[keep]
            is_quote = code == _QUOTE
            quotes = np.cumsum(is_quote)
            outside = ((quotes - is_quote + in_string) & 1) == 0
            if quotes.size:
                in_string = bool((int(quotes[-1]) + in_string) & 1)
            outside &= ~is_quote
            idx, code = idx[outside], code[outside]
            if idx.size == 0:
                pos = stop
                continue
            levels = np.cumsum(_DELTA[code]) + level
            closed = np.flatnonzero(levels <= 0)
            if closed.size:
                cut = int(closed[0])
                end = pos + int(idx[cut])
                idx, code, levels = idx[:cut], code[:cut], levels[:cut]
            if levels.size:
                if int(levels.max()) > limit:
                    raise too_deep(self.max_depth)
                level = int(levels[-1])
                top = levels == 1
                found = pos + idx[top & (code == _COMMA)]
                n_commas += found.size
                if found.size:
                    if every:
                        buckets = (found - lo) // every
                        first = np.r_[True, buckets[1:] != buckets[:-1]] & (buckets != last_bucket)
                        last_bucket = int(buckets[-1])
                        found = found[first]
                    commas.append(found)
                found = pos + idx[top & (code == _COLON)]
                if found.size:
                    colons.append(found)
                if max_members is not None and n_commas >= max_members:
                    raise InvalidArgument(f"JSON object has more than {max_members} members")
            pos = stop
        empty = np.zeros(0, np.int64)
        return (np.concatenate(commas) if commas else empty,
                np.concatenate(colons) if colons else empty, n_commas, end)

    def members(self, span: Span, depth: int, max_members: int) -> list[tuple[str, Span]]:
        """An object's members in order: (key, value span)."""
        if not self.is_object(span):
            raise InvalidArgument("JSON Value is not an object")
        index = self.scan(span, depth, max_members=max_members)
        if index.count == 0:
            return []
        if index.colons.size != index.count:
            raise InvalidArgument(f"JSON Parse error: malformed object at byte {span.lo}")
        out = []
        starts = [span.lo + 1, *(index.commas + 1).tolist()]
        ends = [*index.commas.tolist(), span.hi - 1]
        for start, colon, stop in zip(starts, index.colons.tolist(), ends):
            if not start < colon < stop:
                raise InvalidArgument(f"JSON Parse error: malformed object at byte {start}")
            key = self.load(self._trim(start, colon))
            if not isinstance(key, str):
                raise InvalidArgument(f"JSON Parse error: object key at byte {start} is not a string")
            value = self._trim(colon + 1, stop)
            if value.size == 0:
                raise InvalidArgument(f"JSON Parse error: missing value at byte {colon + 1}")
            out.append((key, value))
        return out

    def runs(self, index: Container) -> Iterator[Span]:
        """An array's elements in runs of about ``every`` bytes (the text between two sampled
        commas, brackets excluded); parse one with :meth:`load_run`."""
        start = index.span.lo + 1
        for stop in [*index.commas.tolist(), index.span.hi - 1]:
            yield Span(start, stop)
            start = stop + 1

    def load_run(self, run: Span) -> list:
        """The elements of a run (``[`` + text + ``]`` parsed)."""
        text = bytearray(run.size + 2)
        text[0] = 0x5B
        text[1:-1] = self.body[run.lo:run.hi]
        text[-1] = 0x5D
        value = loads(text, run.lo - 1)
        if not isinstance(value, list) or not value:  # "[]": the run is empty, a value is missing
            raise InvalidArgument(f"JSON Parse error: expected a value at byte {run.lo}")
        return value

    def validate(self, span: Span, depth: int, chunk: int) -> None:
        """Parse a value nobody uses (an unknown member), a run at a time: the document is valid
        JSON only if it is."""
        if span.size <= chunk:
            self.load(span)
        elif self.is_array(span):
            index = self.scan(span, depth, every=chunk)
            if index.count:
                for run in self.runs(index):
                    if run.size <= 4 * chunk:
                        self.load_run(run)
                    else:
                        for element in self.elements(run, depth):
                            self.validate(element, depth + 1, chunk)
        elif self.is_object(span):
            for _, value in self.members(span, depth, 1 << 30):
                self.validate(value, depth + 1, chunk)
        else:
            self.load(span)

    def elements(self, run: Span, depth: int) -> list[Span]:
        """The elements of a run as spans (``depth``: the array's nesting level)."""
        commas, _, _, end = self._index(run.lo, run.hi, 1, depth - 1, 0, None)
        if end >= 0:
            raise InvalidArgument(f"JSON Parse error: unexpected bracket at byte {end}")
        cuts = commas.tolist()
        spans = [self._trim(a, b) for a, b in zip([run.lo, *(c + 1 for c in cuts)], [*cuts, run.hi])]
        if any(s.size == 0 for s in spans):
            raise InvalidArgument(f"JSON Parse error: missing value near byte {run.lo}")
        return spans


def _escapes(idx: np.ndarray, is_bs: np.ndarray, carry: int, size: int) -> tuple[np.ndarray, int]:
    """Which special bytes of a block a backslash escapes, and the parity of the block's trailing
    backslash run. ``idx``: positions of the block's special bytes, ``is_bs``: which are
    backslashes, ``carry``: parity of the run ending the previous block."""
    b = idx[is_bs]
    if b.size == 0:
        escaped_at = np.array([0], np.int64) if carry else np.zeros(0, np.int64)
        return np.isin(idx, escaped_at), 0
    breaks = np.flatnonzero(np.diff(b) != 1)
    starts = np.r_[0, breaks + 1]
    ends = np.r_[breaks, b.size - 1]
    lengths = ends - starts + 1
    if carry and b[0] == 0:
        lengths[0] += carry
    odd = (lengths & 1) == 1
    escaped_at = b[ends[odd]] + 1
    if carry and b[0] != 0:
        escaped_at = np.r_[0, escaped_at]
    trailing = int(lengths[-1] & 1) if b[-1] == size - 1 else 0
    return np.isin(idx, escaped_at), trailing
