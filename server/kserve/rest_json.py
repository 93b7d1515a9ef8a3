"""The JSON of a KServe v2 infer request, parsed within bounded memory.

A body up to ``SMALL_BODY`` is parsed whole (orjson), and a larger one when the decode memory
budget holds orjson's peak for it (:func:`server.http.json_stream.parse_whole`). Any other is
indexed the way TF Serving's large bodies are (:mod:`server.http.json_stream`: brackets, commas and colons found
with numpy, no Python object per value): the top-level object and each input object are split
into members, every member but ``data`` is parsed (each at most ``MAX_VALUE`` bytes of text), and
each input's ``data`` is left as :class:`~server.kserve.open_inference.DataPieces`, parsed a run of about
256 KiB of text at a time while :func:`server.kserve.open_inference.to_array` converts it into one array
(checked against the shape's element count before each run is converted). So a 32 MB body holds
its text, its array and one run's Python objects, not a Python list of every element; the GIL is
given up between runs.

Members unknown to the protocol are parsed (a run at a time) only to check that the document is
JSON; of duplicate members the last counts, as orjson and the json module take them. Every problem
raises :class:`~processor.errors.InvalidArgument` with a bounded message. Pure functions over an
immutable buffer; thread-safe.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from processor.errors import InvalidArgument

from ..http.json_stream import CHUNK, MAX_DEPTH, SMALL_BODY, Document, Span, check_depth, loads
from . import open_inference as oip

MAX_MEMBERS = 4096  # members of an object; inputs of a request
MAX_VALUE = 1 << 20  # bytes of JSON text of a member other than an input's data (large bodies)
_BIG_RUN = 4 * CHUNK  # a run this big holds a big element: split it into its elements
_NOT_AN_OBJECT = "the request must be a JSON object with 'inputs'"


def parse(text: bytes | bytearray | memoryview, max_depth: int = MAX_DEPTH,
          whole: bool | None = None) -> dict[str, Any]:
    """The request object: parsed values, except that a body parsed a run at a time has its
    input ``data`` as :class:`~server.kserve.open_inference.DataPieces`. ``whole``: parse it
    whole (None: when it is at most ``SMALL_BODY`` long; the HTTP route decides by
    :func:`server.http.json_stream.parse_whole`)."""
    if (len(text) <= SMALL_BODY) if whole is None else whole:
        text = bytes(text)
        check_depth(text, max_depth)
        doc = loads(text)
        if not isinstance(doc, dict):
            raise InvalidArgument(_NOT_AN_OBJECT)
        return doc
    document = Document(text, max_depth)
    root = document.root()
    if not document.is_object(root):
        raise InvalidArgument(_NOT_AN_OBJECT)
    return {key: _inputs(document, span) if key == "inputs" else _value(document, span, key)
            for key, span in _members(document, root, 1).items()}


def _members(document: Document, span: Span, depth: int) -> dict[str, Span]:
    """An object's members by key (the last of duplicates); values nobody reads are checked."""
    members = document.members(span, depth, MAX_MEMBERS)
    out = dict(members)
    for key, value in members:
        if out[key] is not value:
            document.validate(value, depth + 1, CHUNK)
    return out


def _value(document: Document, span: Span, key: str) -> Any:
    if span.size > MAX_VALUE:
        raise InvalidArgument(f"{oip.echo(key)} holds {span.size} bytes of JSON, more than the "
                              f"{MAX_VALUE} a member other than an input's 'data' may")
    return document.load(span)


def _inputs(document: Document, span: Span) -> Any:
    if not document.is_array(span):
        return _value(document, span, "inputs")  # refused by the caller's checks
    index = document.scan(span, 2, max_members=MAX_MEMBERS)
    if index.count == 0:
        return []
    items = []
    for element in document.elements(Span(span.lo + 1, span.hi - 1), 2):
        if not document.is_object(element):
            items.append(_value(document, element, "input"))
            continue
        item = {}
        for key, value in _members(document, element, 3).items():
            if key == "data" and value.size > CHUNK and document.is_array(value):
                item[key] = oip.DataPieces(lambda value=value: _pieces(document, value, 4))
            else:
                item[key] = _value(document, value, key)
        items.append(item)
    return items


def _pieces(document: Document, span: Span, depth: int) -> Iterator[list]:
    """The array at ``span`` as JSON values of about ``CHUNK`` bytes of text each, in order
    (a big element that is itself an array is split in turn)."""
    index = document.scan(span, depth, every=CHUNK)
    if index.count == 0:
        yield []
        return
    for run in document.runs(index):
        if run.size <= _BIG_RUN:
            yield document.load_run(run)
            continue
        group: list[Span] = []
        for element in document.elements(run, depth):
            if element.size > CHUNK and document.is_array(element):
                if group:
                    yield document.load_run(Span(group[0].lo, group[-1].hi))
                    group = []
                yield from _pieces(document, element, depth + 1)
            else:
                group.append(element)
                if group[-1].hi - group[0].lo > CHUNK:
                    yield document.load_run(Span(group[0].lo, group[-1].hi))
                    group = []
        if group:
            yield document.load_run(Span(group[0].lo, group[-1].hi))
