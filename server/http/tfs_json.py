"""TensorFlow Serving's REST JSON <-> numpy, checked against the served signature.

Request ``{"signature_name", "instances" | "inputs"}``:

* row format (``instances``): a list, one element per example; with several inputs each element
  is an object ``{input: value}`` and every input gets the same 0-th dimension;
* columnar format (``inputs``): one tensor (a single-input signature) or ``{input: tensor}``;
* string inputs take JSON strings (UTF-8) or ``{"b64": "<base64>"}`` for binary values;
  numbers may be ``NaN`` / ``Infinity`` / ``-Infinity``.

One value -> one input's array is :mod:`server.http.tfs_json_values`; responses are
:mod:`server.http.tfs_json_encode`'s.

Memory: a body up to ``SMALL_BODY`` is parsed whole. A larger one is indexed
(:mod:`server.http.json_stream`) and its arrays are decoded a run of about 256 KiB of text at a
time, each run straight into the input's numpy array, so the Python objects of one run exist at
a time. The arrays are those the whole-body path makes.

Every problem raises :class:`~processor.errors.InvalidArgument` (413 ``PayloadTooLarge`` over
``max_elements``) with a message naming the input; values from the request are echoed at most
about 80 characters long, ASCII-escaped. Nesting deeper than ``MAX_DEPTH`` is refused. Pure
functions; thread-safe.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from processor import dtypes
from processor.dtypes import DT_STRING
from processor.errors import InvalidArgument, PayloadTooLarge
from processor.signature import Signature, TensorSpec

from .json_stream import CHUNK, Document, Span, clip, slow_loads
from .tfs_json_values import MAX_DEPTH, check_kind, is_b64, natural, string_array, to_array, wire_type

ROW, COLUMNAR = "row", "columnar"

DEFAULT_MAX_ELEMENTS = 1 << 25  # tensor elements per request (a 64 MiB body holds at most ~32M)
SMALL_BODY = 256 * 1024  # bodies up to this size are parsed whole; larger ones a run at a time
_BIG_RUN = 4 * CHUNK  # a run this big holds a big element: split it into its elements
_MAX_MEMBERS = 4096  # members of the top-level object and of "inputs"
_EXACT_INT = 2 ** 53  # integers up to this convert to float32 the same directly or via float64


@dataclass(frozen=True)
class Limits:
    """What one request may hold (``DeploymentConfig.json_*`` keys)."""

    max_elements: int = DEFAULT_MAX_ELEMENTS
    max_depth: int = MAX_DEPTH


@dataclass
class Request:
    """A request's top level: ``signature_name`` and the value of ``instances`` (ROW) or
    ``inputs`` (COLUMNAR): a Python value for small bodies, a :class:`Span` of ``doc`` for large
    ones (decoded by :func:`decode_request` a run at a time)."""

    signature_name: str
    fmt: str
    value: Any
    doc: Document | None = None
    limits: Limits = field(default_factory=Limits)


def parse_request(body: bytes | bytearray, limits: Limits = Limits()) -> Request:
    """The body's top level, checked (a JSON object with ``instances`` or ``inputs`` and an
    optional string ``signature_name``); large bodies are indexed, not parsed."""
    if not body:
        raise InvalidArgument("JSON Parse error: The document is empty")
    if len(body) <= SMALL_BODY:
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
    members = _last_of_each(document, document.members(root, 1, _MAX_MEMBERS), 1, {"instances", "inputs"})
    fmt, value = _which(members)
    name = members.get("signature_name")
    name = "" if name is None else _signature_name(document.load(name))
    return Request(name, fmt, value, document, limits)


def _last_of_each(document: Document, members: list[tuple[str, Span]], depth: int,
                  used: set[str] | None = None) -> dict[str, Span]:
    """Members by key, the last of duplicates (as orjson); values nobody reads (other keys, and
    earlier duplicates) are parsed here, so that a document with invalid JSON in them fails."""
    out = dict(members)
    for key, span in members:
        if out[key] is not span or (used is not None and key not in used and key != "signature_name"):
            document.validate(span, depth + 1, CHUNK)
    return out


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
        _Elements(request.limits.max_elements, charge).take(
            sum(a.size for a in arrays.values()), sum(a.nbytes for a in arrays.values()))
        return arrays, fmt
    decoder = _Decoder(request, signature, {}, charge)
    arrays = decoder.run()
    if decoder.finals:  # integers beyond 2**53 met floats in a float input: once more, exactly
        arrays = _Decoder(request, signature, decoder.finals, charge).run()
    return arrays, request.fmt


def parse_body(body: bytes | bytearray, max_depth: int = MAX_DEPTH) -> dict[str, Any]:
    """A whole (small) body as a Python object; InvalidArgument for anything but a JSON object."""
    if not body:
        raise InvalidArgument("JSON Parse error: The document is empty")
    try:
        doc = _fast_loads(body)  # orjson: nesting up to 1024 levels, numpy refuses arrays over 64
    except ValueError:  # NaN / Infinity, lone surrogates, errors: the json module, depth first
        if body.count(b"[") + body.count(b"{") > max_depth:  # only then can it be too deep
            document = Document(body, max_depth)
            root = document.root()
            document._index(root.lo, root.hi, 0, 0, 0, None)  # raises when nested too deeply
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
        if isinstance(row, dict) and not (len(row) == 1 and "b64" in row):
            objects += 1
            if other is None and row.keys() != names:
                other = i
    if objects == len(instances):
        if other is not None:
            raise _different_inputs(other, instances[other], list(names))
        return {name: to_array([row[name] for row in instances], _input(signature, name), name)
                for name in names}
    if objects:
        raise InvalidArgument("'instances' mixes objects and plain values")
    spec = _only_input(signature, "instances")
    return {spec.alias: to_array(instances, spec, spec.alias)}


def decode_scan(scan: Any, signature: Signature, limits: Limits = Limits(),
                charge: Callable[[int], None] | None = None) -> dict[str, np.ndarray] | None:
    """The arrays :func:`decode_request` makes of a body ``native_json.scan_tfs`` read (numbers
    and lists of them only), keyed as it keys them; None where the reference must decode the
    parsed body (an error it reports in its own order, a dtype it converts itself)."""
    names = scan.names
    try:
        if names == [""]:  # bare values: the only input's
            specs = [_only_input(signature, "inputs" if scan.columnar else "instances")]
            names = [specs[0].alias]
        else:
            specs = [_input(signature, name) for name in names]
    except InvalidArgument:
        return None
    wires = [dtypes.WIRE_TYPES.get(spec.dtype) for spec in specs]
    if None in wires:
        return None
    arrays = scan.arrays([wire.numpy.num for wire in wires])
    if arrays is None:
        return None
    _Elements(limits.max_elements, charge).take(sum(a.size for a in arrays), sum(a.nbytes for a in arrays))
    return dict(zip(names, arrays))


def _different_inputs(i: int, row: dict, names: list[str]) -> InvalidArgument:
    return InvalidArgument(f"instances[{i}] has inputs {clip(sorted(row), 200)}, instances[0] has "
                           f"{clip(sorted(names), 200)}; every example must name the same inputs")


def _decode_columns(inputs: Any, signature: Signature) -> dict[str, np.ndarray]:
    if isinstance(inputs, dict) and not is_b64(inputs):
        if not inputs:
            raise InvalidArgument("'inputs' is an empty object")
        return {name: to_array(value, _input(signature, name), name) for name, value in inputs.items()}
    spec = _only_input(signature, "inputs")
    return {spec.alias: to_array(inputs, spec, spec.alias)}


def _input(signature: Signature, name: str) -> TensorSpec:
    """``signature.input(name)``, the name echoed at most 80 characters long."""
    if len(name) > 200 or not name.isprintable():
        raise InvalidArgument(f"unknown input {clip(name)}; signature {signature.name!r} takes "
                              f"{sorted(signature.inputs)}")
    return signature.input(name)


def _only_input(signature: Signature, key: str) -> TensorSpec:
    if len(signature.inputs) != 1:
        raise InvalidArgument(f"'{key}' holds plain values but signature {signature.name!r} takes "
                              f"{len(signature.inputs)} inputs {sorted(signature.inputs)}; name them "
                              f"with objects")
    return next(iter(signature.inputs.values()))


# --- large bodies: a run of elements at a time ---------------------------------------------------

class _Elements:
    """The request's tensor elements so far, against ``max_elements`` (413 above it); the bytes
    of its arrays go to ``charge`` (the decode memory budget) as they are allocated."""

    def __init__(self, limit: int, charge: Callable[[int], None] | None = None) -> None:
        self.limit = limit
        self.used = 0
        self.charge = charge

    def take(self, n: int, nbytes: int = 0) -> None:
        self.used += n
        if self.used > self.limit:
            raise PayloadTooLarge(f"the request holds more than {self.limit} tensor elements "
                                  f"(json_max_elements); send fewer examples per request")
        self.pay(nbytes)

    def pay(self, nbytes: int) -> None:
        if self.charge is not None and nbytes:
            self.charge(nbytes)


def _string_bytes(array: np.ndarray) -> int:
    """Memory of the bytes objects an object array points to."""
    return sum(map(len, array.reshape(-1).tolist())) + _BYTES_OVERHEAD * array.size


_BYTES_OVERHEAD = 33  # sys.getsizeof(b"")


class _Column:
    """One input's array, built from runs of elements: each run is read by numpy as
    :func:`to_array` reads the whole list, checked and converted, and written into one array
    allocated when the first run shows the element shape.

    Exactness: converting a run alone gives what converting the whole list gives, except for
    integers beyond 2**53 in a float input that also holds floats (numpy would read them as
    float64 first, rounding twice). ``kinds`` records the dtypes numpy found; when that case
    happened, ``final`` (the whole list's dtype) is known after the first pass and the decoder
    runs again with it."""

    def __init__(self, spec: TensorSpec, name: str, count: int, elements: _Elements,
                 final: np.dtype | None) -> None:
        self.spec, self.name, self.count, self.elements = spec, name, count, elements
        self.string = spec.dtype == DT_STRING
        self.wire = None if self.string else wire_type(spec, name)
        self.final = final
        self.kinds: set[np.dtype] = set()
        self.redo = False
        self.out: np.ndarray | None = None
        self.filled = 0

    def add(self, values: list) -> None:
        """The next ``len(values)`` elements, as parsed JSON values."""
        if self.string:
            part = string_array(values, self.name)
            self.elements.pay(_string_bytes(part))
        else:
            part = self._convert(natural(values, self.name))
        self._put(part)

    def _convert(self, part: np.ndarray) -> np.ndarray:
        check_kind(part, self.spec, self.wire, self.name, final=False)
        self.kinds.add(part.dtype)
        target = self.wire.numpy
        if self.final is not None:
            return part.astype(self.final, copy=False).astype(target, copy=False)
        if (part.dtype.kind in "iu" and target.kind in "fc" and part.size
                and (part.max() > _EXACT_INT or part.min() < -_EXACT_INT)):
            self.redo = True  # right unless floats come too; result() tells
        return part.astype(target, copy=False)

    def _put(self, part: np.ndarray) -> None:
        n = part.shape[0] if part.ndim else 0
        if part.ndim == 0 or self.filled + n > self.count:
            raise InvalidArgument(f"JSON Parse error: malformed array for input {clip(self.name)}")
        if self.out is None:
            n_out = self.count * int(np.prod(part.shape[1:], dtype=np.int64))
            self.elements.take(n_out, n_out * part.dtype.itemsize)
            self.out = np.empty((self.count, *part.shape[1:]), part.dtype)
        elif part.shape[1:] != self.out.shape[1:]:
            raise InvalidArgument(f"input {clip(self.name)}: the nested lists are ragged; every row "
                                  f"must have the same length")
        self.out[self.filled:self.filled + n] = part
        self.filled += n

    def result(self) -> np.ndarray:
        if self.out is None or self.filled != self.count:
            raise InvalidArgument(f"JSON Parse error: malformed array for input {clip(self.name)}")
        if not self.string and self.final is None:
            final = np.result_type(*self.kinds)
            if final.kind == "b" or (self.wire.numpy.kind in "iu" and final.kind not in "iu"):
                check_kind(np.empty(0, final), self.spec, self.wire, self.name, final=True)
        return self.out

    def final_dtype(self) -> np.dtype | None:
        """The whole list's dtype when the decoder must run again with it (see the class doc)."""
        if self.redo and self.final is None:
            final = np.result_type(*self.kinds)
            if final.kind in "fc":
                return final
        return None


class _Decoder:
    """Decodes a large request's ``instances`` / ``inputs`` span into arrays (see the module doc)."""

    def __init__(self, request: Request, signature: Signature, finals: dict[str, np.dtype],
                 charge: Callable[[int], None] | None) -> None:
        self.doc: Document = request.doc
        self.request = request
        self.signature = signature
        self.elements = _Elements(request.limits.max_elements, charge)
        self.given_finals = finals
        self.finals: dict[str, np.dtype] = {}

    def run(self) -> dict[str, np.ndarray]:
        doc, value = self.doc, self.request.value
        if self.request.fmt == ROW:
            if not doc.is_array(value):
                raise InvalidArgument("'instances' must be a list, one element per example")
            return self._rows(value)
        if doc.is_object(value):
            members = doc.members(value, 2, _MAX_MEMBERS)
            if not members:
                raise InvalidArgument("'inputs' is an empty object")
            if not (len(members) == 1 and members[0][0] == "b64"):
                named = _last_of_each(doc, members, 2)
                return {name: self._tensor(span, 3, _input(self.signature, name), name)
                        for name, span in named.items()}
        spec = _only_input(self.signature, "inputs")
        return {spec.alias: self._tensor(value, 2, spec, spec.alias)}

    def _column(self, spec: TensorSpec, name: str, count: int) -> _Column:
        return _Column(spec, name, count, self.elements, self.given_finals.get(name))

    def _done(self, column: _Column) -> np.ndarray:
        out = column.result()
        final = column.final_dtype()
        if final is not None:
            self.finals[column.name] = final
        return out

    def _tensor(self, span: Span, depth: int, spec: TensorSpec, name: str) -> np.ndarray:
        """The value at ``span`` (nesting level ``depth``) as the input's array."""
        doc = self.doc
        if span.size <= CHUNK or not doc.is_array(span):
            array = to_array(doc.load(span), spec, name)
            self.elements.take(array.size, array.nbytes)
            return array
        index = doc.scan(span, depth, every=CHUNK)
        if index.count == 0:
            return to_array([], spec, name)
        column = self._column(spec, name, index.count)
        self._fill(index, depth, column)
        return self._done(column)

    def _fill(self, index, depth: int, column: _Column) -> None:
        """Every element of the array ``index`` into ``column``."""
        doc = self.doc
        for run in doc.runs(index):
            if run.size <= _BIG_RUN:
                column.add(doc.load_run(run))
                continue
            group: list[Span] = []
            for element in doc.elements(run, depth):
                if element.size > CHUNK and doc.is_array(element):
                    self._flush(group, column)
                    group = []
                    column._put(self._big_element(element, depth + 1, column)[None])
                else:
                    group.append(element)
                    if group[-1].hi - group[0].lo > CHUNK:
                        self._flush(group, column)
                        group = []
            self._flush(group, column)

    def _flush(self, group: list[Span], column: _Column) -> None:
        if group:
            column.add(self.doc.load_run(Span(group[0].lo, group[-1].hi)))

    def _big_element(self, span: Span, depth: int, parent: _Column) -> np.ndarray:
        """One element that is itself a big array, converted for ``parent`` (sharing its kinds)."""
        index = self.doc.scan(span, depth, every=CHUNK)
        if index.count == 0:  # "[" and "]" around a lot of whitespace
            value = self.doc.load(span)
            return string_array(value, parent.name) if parent.string else parent._convert(natural(value, parent.name))
        child = _Column(parent.spec, parent.name, index.count, _Elements(self.elements.limit), parent.final)
        child.kinds = parent.kinds
        self._fill(index, depth, child)
        parent.redo |= child.redo
        if child.out is None or child.filled != child.count:
            raise InvalidArgument(f"JSON Parse error: malformed array for input {clip(parent.name)}")
        return child.out

    def _rows(self, span: Span) -> dict[str, np.ndarray]:
        doc = self.doc
        index = doc.scan(span, 2, every=CHUNK)
        if index.count == 0:
            raise InvalidArgument("'instances' is an empty list")
        rows = _Rows(self, index.count)
        for run in doc.runs(index):
            if run.size <= _BIG_RUN:
                rows.add(doc.load_run(run))
                continue
            for element in doc.elements(run, 2):
                if element.size > CHUNK and doc.is_object(element):
                    rows.add_big(element)
                else:
                    rows.add(doc.load_run(element))
        return rows.result()


class _Rows:
    """The row format's examples, a run at a time: objects naming the inputs, or plain values of
    the only input (``_decode_rows``'s rules, over all runs)."""

    def __init__(self, decoder: _Decoder, count: int) -> None:
        self.decoder = decoder
        self.count = count
        self.named: bool | None = None
        self.names: list[str] = []
        self.name_set: set[str] = set()
        self.columns: dict[str, _Column] = {}
        self.seen = 0

    def _start(self, first: Any) -> None:
        d = self.decoder
        self.named = isinstance(first, dict) and not is_b64(first)
        if self.named:
            self.names = list(first)
            self.name_set = set(self.names)
            for name in self.names:
                self.columns[name] = d._column(_input(d.signature, name), name, self.count)
        else:
            spec = _only_input(d.signature, "instances")
            self.columns[spec.alias] = d._column(spec, spec.alias, self.count)

    def add(self, rows: list) -> None:
        if self.named is None:
            self._start(rows[0])
        for i, row in enumerate(rows):
            named = isinstance(row, dict) and not is_b64(row)
            if named != self.named:
                raise InvalidArgument("'instances' mixes objects and plain values")
            if named and set(row) != self.name_set:
                raise _different_inputs(self.seen + i, row, self.names)
        if self.named:
            for name, column in self.columns.items():
                column.add([row[name] for row in rows])
        else:
            next(iter(self.columns.values())).add(rows)
        self.seen += len(rows)

    def add_big(self, span: Span) -> None:
        """One example that is a big object: each input's value decoded on its own."""
        d = self.decoder
        members = d.doc.members(span, 3, _MAX_MEMBERS)
        if len(members) == 1 and members[0][0] == "b64":
            self.add([d.doc.load(span)])
            return
        if self.named is None:
            self._start({name: None for name, _ in members})
        if not self.named:
            raise InvalidArgument("'instances' mixes objects and plain values")
        values = _last_of_each(d.doc, members, 3)
        if set(values) != self.name_set:
            raise _different_inputs(self.seen, values, self.names)
        for name, column in self.columns.items():
            value = values[name]
            if value.size > CHUNK and d.doc.is_array(value):
                column._put(d._big_element(value, 4, column)[None])
            else:
                column.add([d.doc.load(value)])
        self.seen += 1

    def result(self) -> dict[str, np.ndarray]:
        return {name: self.decoder._done(column) for name, column in self.columns.items()}


try:  # orjson: several times faster than the json module; optional
    import orjson

    _fast_loads = orjson.loads
except ImportError:  # pragma: no cover - orjson is in the server extra
    _fast_loads = json.loads
