"""KServe v2 binary infer requests answered from a prepared form: a JSON header seen before.

A client of the binary tensor extension sends the same JSON header with every request of a
kind (the same inputs, datatypes, shapes and sizes, the same outputs asked for, binary), only
the bytes after it change. The first such request is answered the ordinary way; if it was a
plain one (below), its form is kept: where each input's bytes lie and what it is, checked once
against the served signature (``DataPlane.prepare``), and the response header as a template
with holes for the output shapes and sizes. A later request whose header is byte for byte the
same skips the header's parse and the per-input checks: its inputs are cut from the binary part
and run on the version they were checked on (``DataPlane.run_prepared``), its answer written
into the template. The answer is the ordinary path's, byte for byte (tests compare).

Plain: every input binary (``binary_data_size`` its only parameter) of a numeric datatype
other than BOOL and BF16 (their contents need a check per request), no ``id``, no parameter
but ``binary_data_output``, every output answered binary and numeric. Anything else (and a
request whose binary part has another length, a version swap, a model that batches, traces or
logs) takes the ordinary path, which gives the errors. Forms are kept per model and version
path, at most ``MAX_FORMS`` (then forgotten all at once), each holding weak references to the
version it was checked on. Thread-safe (dict operations under the GIL; two threads may prepare
the same form, one wins).
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from .. import open_inference as oip
from ..runtime import ServingRuntime
from .predict import Reply

MAX_FORMS = 256
HEADER_LENGTH = b"inference-header-content-length"
_SHAPE, _SIZE = -7340033001, -7340033002  # template holes: no shape or size holds these
_HOLES = re.compile(rb"\[%d\]|%d" % (_SHAPE, _SIZE))
_UNCHECKED = {"BOOL", "BF16", "BYTES"}  # contents checked per request by the ordinary path


class _Form:
    """One prepared request form: its PreparedCall, its inputs' places, the response template."""

    __slots__ = ("call", "inputs", "size", "dtypes", "template")

    def __init__(self, call, inputs: tuple, size: int, dtypes: tuple, template: list[bytes]) -> None:
        self.call = call
        self.inputs = inputs  # (alias, little-endian dtype, native dtype, shape, count, offset) each
        self.size = size  # bytes of the binary part
        self.dtypes = dtypes  # the outputs' dtypes, in answer order
        self.template = template  # header pieces around each output's shape and size


class PreparedInfers:
    """See the module doc."""

    def __init__(self) -> None:
        self._forms: dict[tuple[str, str | None, bytes], _Form] = {}

    def answer(self, rt: ServingRuntime, model: str, version: str | None, body: bytes | bytearray,
               header_length: str, deadline: float | None) -> Reply | None:
        """The reply to a binary infer request whose form is prepared; None: answer it the
        ordinary way. Raises ProcessorError (the engine's errors, a passed deadline)."""
        if not (header_length.isascii() and header_length.isdigit()):
            return None
        n = int(header_length)
        key = (model, version, bytes(body[:n]))
        form = self._forms.get(key)
        if form is None or len(body) - n != form.size:
            return None
        view = memoryview(body)
        feeds = {alias: np.frombuffer(view, little, count, n + offset).astype(native).reshape(shape)
                 for alias, little, native, shape, count, offset in form.inputs}
        result = rt.dataplane.run_prepared(form.call, feeds, deadline)
        if result is None:  # another version serves the model: prepare the form afresh
            self._forms.pop(key, None)
            return None
        template, pieces, blobs = form.template, [form.template[0]], []
        for i, (array, dtype) in enumerate(zip(result.outputs.values(), form.dtypes)):
            if array.dtype != dtype:
                return None
            raw = np.ascontiguousarray(array, dtype.newbyteorder("<")).tobytes()
            blobs.append(raw)
            pieces += [b"[%s]" % b", ".join(b"%d" % d for d in array.shape), template[2 * i + 1],
                       b"%d" % len(raw), template[2 * i + 2]]
        header = b"".join(pieces)
        return Reply(200, header + b"".join(blobs), "application/octet-stream",
                     ((HEADER_LENGTH, b"%d" % len(header)),))

    def learn(self, rt: ServingRuntime, model: str, version: str | None, header: bytes, doc: dict,
              inputs: list[oip.InferInput], wanted: list[tuple[str, bool]], binary_out: dict[str, bool],
              number: str, outputs: dict[str, np.ndarray]) -> None:
        """Keep the form of a request the ordinary path just answered with ``outputs``, if it is
        a plain one (see the module doc). Never raises for the request's sake: a form that cannot
        be prepared is not kept."""
        if not _plain(doc, inputs) or not all(
                binary_out.get(name, binary_out.get("*", False)) and a.dtype.kind in "biufc"
                and oip.datatype_of(a) not in _UNCHECKED for name, a in outputs.items()):
            return
        try:
            call = oip.prepare(rt, model, version, inputs, [name for name, _ in wanted] if wanted else None)
        except Exception:  # noqa: BLE001 - it was just answered; a form is an optimization
            return
        if call is None or len(call.inputs) != len(inputs):
            return
        places, offset = [], 0
        for tensor, (alias, dtype, shape) in zip(inputs, call.inputs):
            little = oip.DATATYPES[tensor.datatype].newbyteorder("<")
            if little.newbyteorder("=") != dtype or tuple(tensor.shape) != shape:
                return
            places.append((alias, little, dtype, shape, int(np.prod(shape)), offset))
            offset += len(tensor.raw)
        if len(self._forms) >= MAX_FORMS:
            self._forms.clear()
        self._forms[(model, version, header)] = _Form(call, tuple(places), offset,
                                                     tuple(a.dtype for a in outputs.values()),
                                                     _template(model, number, outputs))


def _plain(doc: dict[str, Any], inputs: list[oip.InferInput]) -> bool:
    if doc.keys() - {"inputs", "outputs", "parameters"}:
        return False
    params = doc.get("parameters")
    if params is not None and (not isinstance(params, dict) or params.keys() - {"binary_data_output"}):
        return False
    for item in doc["inputs"]:
        if item.keys() - {"name", "datatype", "shape", "parameters"} or item.get("parameters", {}).keys() != {
                "binary_data_size"}:
            return False
    for item in doc.get("outputs") or ():
        if item.keys() - {"name", "parameters"} or (item.get("parameters") or {}).keys() - {"binary_data"}:
            return False
    return all(t.raw is not None and t.datatype not in _UNCHECKED for t in inputs)


def _template(model: str, number: str, outputs: dict[str, np.ndarray]) -> list[bytes]:
    """The response header of ``outputs`` (as the ordinary path writes it) cut at each output's
    shape and binary size: 2 * len(outputs) + 1 pieces."""
    tensors = [{"name": name, "datatype": oip.datatype_of(array), "shape": [_SHAPE],
                "parameters": {"binary_data_size": _SIZE}} for name, array in outputs.items()]
    text = json.dumps({"model_name": model, "model_version": number, "outputs": tensors}, allow_nan=False)
    return _HOLES.split(text.encode())
