"""TensorFlow Serving's REST JSON <-> numpy, checked against the served signature.

Request ``{"signature_name", "instances" | "inputs"}``:

* row format (``instances``): a list, one element per example; with several inputs each element
  is an object ``{input: value}`` and every input gets the same 0-th dimension;
* columnar format (``inputs``): one tensor (a single-input signature) or ``{input: tensor}``;
* string inputs take JSON strings (UTF-8) or ``{"b64": "<base64>"}`` for binary values;
  numbers may be ``NaN`` / ``Infinity`` / ``-Infinity``.

One value -> one input's array is :mod:`server.tfserving.rest_json_values`; what the decoders share
(the top level, input names, element limits) :mod:`server.tfserving.rest_json_inputs`; responses are
:mod:`server.tfserving.rest_json_encode`'s.

Memory: a body up to ``SMALL_BODY`` is parsed whole, and a larger one when the decode memory
budget holds orjson's peak for it (the route decides: :func:`server.http.json_stream.parse_whole`).
Any other is indexed (:mod:`server.http.json_stream`) and its arrays are decoded a run of about
256 KiB of text at a time (:mod:`.rest_json_runs`), so the Python objects of one run exist at a
time. The arrays are those the whole-body path makes.

Every problem raises :class:`~processor.errors.InvalidArgument` (413 ``PayloadTooLarge`` over
``max_elements``) with a message naming the input; values from the request are echoed at most
about 80 characters long, ASCII-escaped. Nesting deeper than ``MAX_DEPTH`` is refused. Pure
functions; thread-safe.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np

from processor import dtypes
from processor.errors import InvalidArgument
from processor.signature import Signature

from ..http.json_stream import MAX_DEPTH, SMALL_BODY, Document, check_depth, slow_loads
from .rest_json_inputs import (COLUMNAR, DEFAULT_MAX_ELEMENTS, MAX_MEMBERS, ROW, Limits, Request, count_elements,
                               different_inputs, input_spec, last_of_each, only_input)
from .rest_json_runs import RunDecoder
from .rest_json_values import is_b64, to_array

# the formats, limits and top level are rest_json_inputs'; SMALL_BODY json_stream's; this module is
# where callers find them
__all__ = ["COLUMNAR", "DEFAULT_MAX_ELEMENTS", "ROW", "SMALL_BODY", "Limits", "Request", "decode_predict",
           "decode_request", "decode_scan", "parse_body", "parse_request"]



def parse_request(body: bytes | bytearray, limits: Limits = Limits(), whole: bool | None = None) -> Request:
    """The body's top level, checked (a JSON object with ``instances`` or ``inputs`` and an
    optional string ``signature_name``): parsed whole when ``whole`` (None: when it is at most
    ``SMALL_BODY`` long; the HTTP route decides by :func:`server.http.json_stream.parse_whole`),
    else indexed, not parsed."""
    if not body:
        raise InvalidArgument("JSON Parse error: The document is empty")
    if (len(body) <= SMALL_BODY) if whole is None else whole:
        doc = parse_body(body, limits.max_depth)
        name = _signature_name(doc.get("signature_name", ""))  # checked first, as TF Serving does
        fmt, value = _which(doc)
        return Request(name, fmt, value, None, limits)
    document = Document(body, limits.max_depth)
    root = document.root()
    if not document.is_object(root):
        document._index(root.lo, root.hi, 0, 0, 0, None)  # refuses deep nesting before parsing
        document.load(root)  # a parse error if it is not JSON at all
        raise InvalidArgument(_NOT_AN_OBJECT)
    members = last_of_each(document, document.members(root, 1, MAX_MEMBERS), 1, {"instances", "inputs"})
    fmt, value = _which(members)
    name = members.get("signature_name")
    name = "" if name is None else _signature_name(document.load(name))
    return Request(name, fmt, value, document, limits)


_NOT_AN_OBJECT = "JSON Value is not an object: expected {\"instances\": ...} or {\"inputs\": ...}"


def _which(doc: dict[str, Any]) -> tuple[str, Any]:
    has_rows, has_cols = "instances" in doc, "inputs" in doc
    if has_rows and has_cols:
        raise InvalidArgument("Not both 'instances' and 'inputs' can be specified in the request")
    if not has_rows and not has_cols:
        raise InvalidArgument("Missing 'inputs' or 'instances' key")
    return (ROW, doc["instances"]) if has_rows else (COLUMNAR, doc["inputs"])


def _signature_name(value: Any) -> str:
    if not isinstance(value, str):
        raise InvalidArgument("'signature_name' key must be a string value.")
    return value


def decode_request(request: Request, signature: Signature, charge: Callable[[int], None] | None = None
                   ) -> tuple[dict[str, np.ndarray], str]:
    """The request's inputs as numpy arrays keyed by alias, and its format (ROW or COLUMNAR).

    ``charge(nbytes)``: called with the size of each array as it is allocated (the decode memory
    budget; it raises to refuse)."""
    if request.doc is None:
        doc = {"instances" if request.fmt == ROW else "inputs": request.value}
        arrays, fmt = decode_predict(doc, signature)
        count_elements(list(arrays.values()), request.limits, charge)
        return arrays, fmt
    decoder = RunDecoder(request, signature, {}, charge)
    arrays = decoder.run()
    if decoder.finals:  # integers beyond 2**53 met floats in a float input: once more, exactly
        arrays = RunDecoder(request, signature, decoder.finals, charge).run()
    return arrays, request.fmt


def parse_body(body: bytes | bytearray, max_depth: int = MAX_DEPTH) -> dict[str, Any]:
    """A whole (small) body as a Python object; InvalidArgument for anything but a JSON object."""
    if not body:
        raise InvalidArgument("JSON Parse error: The document is empty")
    check_depth(body, max_depth)  # orjson allows 1,024 levels, the json module ~1,000
    try:
        doc = _fast_loads(body)
    except ValueError:  # NaN / Infinity, lone surrogates, errors: the json module
        doc = slow_loads(body)
    if not isinstance(doc, dict):
        raise InvalidArgument(_NOT_AN_OBJECT)
    return doc


def decode_predict(doc: dict[str, Any], signature: Signature) -> tuple[dict[str, np.ndarray], str]:
    """The inputs of a parsed request ``doc`` as numpy arrays keyed by alias, and its format."""
    fmt, value = _which(doc)
    if fmt == ROW:
        return _decode_rows(value, signature), ROW
    return _decode_columns(value, signature), COLUMNAR


def _decode_rows(instances: Any, signature: Signature) -> dict[str, np.ndarray]:
    if not isinstance(instances, list):
        raise InvalidArgument("'instances' must be a list, one element per example")
    if not instances:
        raise InvalidArgument("'instances' is an empty list")
    objects, other = 0, None  # rows that are objects (not {"b64"}); the first whose inputs differ
    first = instances[0]
    names = first.keys() if isinstance(first, dict) else None
    for i, row in enumerate(instances):  # one plain loop: it runs once per example
        if isinstance(row, dict) and not is_b64(row):
            objects += 1
            if other is None and row.keys() != names:
                other = i
    if objects == len(instances):
        if other is not None:
            raise different_inputs(other, instances[other], list(names))
        return {name: to_array([row[name] for row in instances], input_spec(signature, name), name)
                for name in names}
    if objects:
        raise InvalidArgument("'instances' mixes objects and plain values")
    spec = only_input(signature, "instances")
    return {spec.alias: to_array(instances, spec, spec.alias)}


def decode_scan(scan: Any, signature: Signature, limits: Limits = Limits(),
                charge: Callable[[int], None] | None = None) -> dict[str, np.ndarray] | None:
    """The arrays :func:`decode_request` makes of a body ``native_json.scan_tfs`` read (numbers
    and lists of them only), keyed as it keys them; None where the reference must decode the
    parsed body (an error it reports in its own order, a dtype it converts itself)."""
    names = scan.names
    try:
        if names == [""]:  # bare values: the only input's
            specs = [only_input(signature, "inputs" if scan.columnar else "instances")]
            names = [specs[0].alias]
        else:
            specs = [input_spec(signature, name) for name in names]
    except InvalidArgument:
        return None
    wires = [dtypes.WIRE_TYPES.get(spec.dtype) for spec in specs]
    if None in wires:
        return None
    arrays = scan.arrays([wire.numpy.num for wire in wires])
    if arrays is None:
        return None
    count_elements(arrays, limits, charge)
    return dict(zip(names, arrays))


def _decode_columns(inputs: Any, signature: Signature) -> dict[str, np.ndarray]:
    if isinstance(inputs, dict) and not is_b64(inputs):
        if not inputs:
            raise InvalidArgument("'inputs' is an empty object")
        return {name: to_array(value, input_spec(signature, name), name) for name, value in inputs.items()}
    spec = only_input(signature, "inputs")
    return {spec.alias: to_array(inputs, spec, spec.alias)}


try:  # orjson: several times faster than the json module; optional
    import orjson

    _fast_loads = orjson.loads
except ImportError:  # pragma: no cover - orjson is in the server extra
    _fast_loads = json.loads
