"""KServe v2 binary infer requests over HTTP answered from a form seen before
(:mod:`server.infer_forms`): the form is the request's JSON header, byte for byte.

A request whose header was seen before is not parsed: its inputs are cut from the binary part
at the form's places, and its answer is written into the first request's response header, kept
as a template with holes for each output's shape and binary size (the same bytes the ordinary
path writes). Only plain headers are kept: every input binary (``binary_data_size`` its only
parameter), no ``id``, no parameter but ``binary_data_output``, every output answered binary.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from ..http.predict import Reply, version_header
from ..infer_forms import InferForms
from ..runtime import ServingRuntime
from . import open_inference as oip

HEADER_LENGTH = b"inference-header-content-length"
_SHAPE, _SIZE = -7340033001, -7340033002  # template holes: no shape or size holds these
_HOLES = re.compile(rb"\[%d\]|%d" % (_SHAPE, _SIZE))
_MAX_SHAPES = 64  # output shapes kept written out, per form


class _Template:
    """A form's response header cut at each output's shape and binary size (2n + 1 pieces),
    and the output shapes met so far, as the header writes them."""

    __slots__ = ("pieces", "shapes")

    def __init__(self, model: str, number: str, outputs: dict[str, np.ndarray]) -> None:
        tensors = [{"name": name, "datatype": oip.datatype_of(array), "shape": [_SHAPE],
                    "parameters": {"binary_data_size": _SIZE}} for name, array in outputs.items()]
        text = json.dumps({"model_name": model, "model_version": number, "outputs": tensors}, allow_nan=False)
        self.pieces = _HOLES.split(text.encode())
        self.shapes: dict[tuple[int, ...], bytes] = {}

    def shape(self, shape: tuple[int, ...]) -> bytes:
        out = self.shapes.get(shape)
        if out is None:
            out = b"[%s]" % b", ".join(b"%d" % d for d in shape)
            if len(self.shapes) < _MAX_SHAPES:
                self.shapes[shape] = out
        return out


class PreparedInfers:
    """See the module doc."""

    def __init__(self) -> None:
        self._forms = InferForms()

    def answer(self, rt: ServingRuntime, model: str, version: str | None, body: bytes | bytearray,
               header_length: str, deadline: float | None) -> Reply | None:
        """The reply to a binary infer request whose form is kept; None: answer it the ordinary
        way. Raises ProcessorError (the engine's errors, a passed deadline)."""
        if not (header_length.isascii() and header_length.isdigit()):
            return None
        n = int(header_length)
        key = (model, version, bytes(body[:n]))
        form = self._forms.get(key)
        if form is None or len(body) - n != form.size:
            return None
        view, raws, at = memoryview(body), [], n
        for place in form.inputs:
            raws.append(view[at:at + place[4]])
            at += place[4]
        result = self._forms.run(rt, key, form, raws, deadline)
        if result is None:
            return None
        template: _Template = form.extra
        pieces, blobs = [template.pieces[0]], []
        for i, (array, (_, little)) in enumerate(zip(result.outputs.values(), form.outputs)):
            raw = np.ascontiguousarray(array, little).tobytes()
            blobs.append(raw)
            pieces += [template.shape(array.shape), template.pieces[2 * i + 1], b"%d" % len(raw),
                       template.pieces[2 * i + 2]]
        header = b"".join(pieces)
        return Reply(200, header + b"".join(blobs), "application/octet-stream",
                     ((HEADER_LENGTH, b"%d" % len(header)), version_header(result.version_number)))

    def may_learn(self, rt: ServingRuntime, model: str, doc: dict, inputs: list[oip.InferInput]) -> bool:
        """Whether a request of header ``doc`` with ``inputs`` is a plain one whose form may be
        kept (see the module doc): ask its call to ``prepare`` only then."""
        return _plain(doc) and all(t.raw is not None for t in inputs) and self._forms.prepares(rt, model)

    def learn(self, model: str, version: str | None, header: bytes, prepared, inputs: list[oip.InferInput],
              binary_out: dict[str, bool], number: str, outputs: dict[str, np.ndarray]) -> None:
        """Keep the form of a plain request (:meth:`may_learn`) the ordinary path just answered
        with ``outputs`` and ``prepared`` (its PreparedCall, or None), when every output is
        answered binary (see the module doc). Never raises for the request's sake."""
        if all(binary_out.get(name, binary_out.get("*", False)) for name in outputs):
            self._forms.learn((model, version, header), prepared, [len(t.raw) for t in inputs], outputs,
                              _Template(model, number, outputs))


def _plain(doc: dict[str, Any]) -> bool:
    """Whether an answered request's header is a plain one (see the module doc)."""
    def keys(value: Any) -> set:
        return set(value) if isinstance(value, dict) else {None}

    if keys(doc) - {"inputs", "outputs", "parameters"} or keys(doc.get("parameters") or {}) - {"binary_data_output"}:
        return False
    if any(keys(item) - {"name", "datatype", "shape", "parameters"} or keys(item.get("parameters")) != {
            "binary_data_size"} for item in doc["inputs"]):
        return False
    return all(not keys(item) - {"name", "parameters"} and not keys(item.get("parameters") or {}) - {"binary_data"}
               for item in doc.get("outputs") or ())
