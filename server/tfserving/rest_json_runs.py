"""A large TF Serving REST JSON request decoded a run of elements at a time.

A body over ``SMALL_BODY`` is indexed (:mod:`server.http.json_stream`), not parsed; each input's
array is decoded a run of about 256 KiB of text at a time, each run straight into the input's
numpy array, so the Python objects of one run exist at a time. The arrays are those the
whole-body path (:mod:`server.tfserving.rest_json`) makes. Used by one request's thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from processor.dtypes import DT_STRING
from processor.errors import InvalidArgument
from processor.signature import Signature, TensorSpec

from ..http.json_stream import CHUNK, Document, Span, clip
from .rest_json_inputs import (MAX_MEMBERS, ROW, Elements, Request, different_inputs, input_spec, last_of_each,
                              only_input)
from .rest_json_values import check_kind, is_b64, natural, string_array, to_array, wire_type

_BIG_RUN = 4 * CHUNK  # a run this big holds a big element: split it into its elements
_EXACT_INT = 2 ** 53  # integers up to this convert to float32 the same directly or via float64


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

    def __init__(self, spec: TensorSpec, name: str, count: int, elements: Elements,
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


class RunDecoder:
    """Decodes a large request's ``instances`` / ``inputs`` span into arrays (see the module doc)."""

    def __init__(self, request: Request, signature: Signature, finals: dict[str, np.dtype],
                 charge: Callable[[int], None] | None) -> None:
        self.doc: Document = request.doc
        self.request = request
        self.signature = signature
        self.elements = Elements(request.limits.max_elements, charge)
        self.given_finals = finals
        self.finals: dict[str, np.dtype] = {}

    def run(self) -> dict[str, np.ndarray]:
        doc, value = self.doc, self.request.value
        if self.request.fmt == ROW:
            if not doc.is_array(value):
                raise InvalidArgument("'instances' must be a list, one element per example")
            return self._rows(value)
        if doc.is_object(value):
            members = doc.members(value, 2, MAX_MEMBERS)
            if not members:
                raise InvalidArgument("'inputs' is an empty object")
            if not (len(members) == 1 and members[0][0] == "b64"):
                named = last_of_each(doc, members, 2)
                return {name: self._tensor(span, 3, input_spec(self.signature, name), name)
                        for name, span in named.items()}
        spec = only_input(self.signature, "inputs")
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
        child = _Column(parent.spec, parent.name, index.count, Elements(self.elements.limit), parent.final)
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
    the only input (the whole-body path's rules, ``rest_json._decode_rows``, over all runs)."""

    def __init__(self, decoder: RunDecoder, count: int) -> None:
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
                self.columns[name] = d._column(input_spec(d.signature, name), name, self.count)
        else:
            spec = only_input(d.signature, "instances")
            self.columns[spec.alias] = d._column(spec, spec.alias, self.count)

    def add(self, rows: list) -> None:
        if self.named is None:
            self._start(rows[0])
        for i, row in enumerate(rows):
            named = isinstance(row, dict) and not is_b64(row)
            if named != self.named:
                raise InvalidArgument("'instances' mixes objects and plain values")
            if named and set(row) != self.name_set:
                raise different_inputs(self.seen + i, row, self.names)
        if self.named:
            for name, column in self.columns.items():
                column.add([row[name] for row in rows])
        else:
            next(iter(self.columns.values())).add(rows)
        self.seen += len(rows)

    def add_big(self, span: Span) -> None:
        """One example that is a big object: each input's value decoded on its own."""
        d = self.decoder
        members = d.doc.members(span, 3, MAX_MEMBERS)
        if len(members) == 1 and members[0][0] == "b64":
            self.add([d.doc.load(span)])
            return
        if self.named is None:
            self._start({name: None for name, _ in members})
        if not self.named:
            raise InvalidArgument("'instances' mixes objects and plain values")
        values = last_of_each(d.doc, members, 3)
        if set(values) != self.name_set:
            raise different_inputs(self.seen, values, self.names)
        for name, column in self.columns.items():
            value = values[name]
            if value.size > CHUNK and d.doc.is_array(value):
                column._put(d._big_element(value, 4, column)[None])
            else:
                column.add([d.doc.load(value)])
        self.seen += 1

    def result(self) -> dict[str, np.ndarray]:
        return {name: self.decoder._done(column) for name, column in self.columns.items()}
