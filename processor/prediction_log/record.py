"""One logged predict call: what the request thread hands over (:class:`Pending`), and what the
writer thread makes of it (:func:`resolve` -> :class:`Resolved`).

The request thread does as little as it can: it keeps references to what the call already has
(immutable request and response bytes, the decoded input arrays, the output arrays) and copies
only what its caller may reuse after the call returns (a wire request given as a view of the
caller's buffer, as the C ABI gives it). Everything else (parsing wire requests and responses
with the reference codec, building tensors) happens in :func:`resolve`, on the writer thread.

Ownership: arrays handed to :meth:`processor.dataplane.DataPlane.predict` are referenced, not
copied: the edges build fresh arrays per request; a Python caller must not write to its input
arrays once the call has returned.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from .. import codec
from ..errors import ProcessorError, as_processor_error
from ..request import version_number
from ..signature import TensorSpec


class Pending:
    """A sampled call, filled in by the DataPlane as the call goes (request thread).

    ``wire``: the request's bytes (a copy when the caller gave a view), else None; ``feeds``:
    the decoded, checked input arrays by alias (array calls); ``group``: the session group
    that served (its version and signature); ``result``: the PredictResult, or ``error``.
    """

    __slots__ = ("model", "time_ns", "request_id", "wire", "inputs", "output_filter", "feeds",
                 "group", "result", "error", "shadow")

    def __init__(self, model: str, time_ns: int, request_id: str, inputs: Any,
                 output_filter: Any) -> None:
        self.model = model
        self.time_ns = time_ns
        self.request_id = request_id
        wire = isinstance(inputs, (bytes, bytearray, memoryview))
        self.wire = (inputs if inputs.__class__ is bytes else bytes(inputs)) if wire else None
        # an array call's raw inputs, kept only to log a call that failed before they were checked
        self.inputs = None if wire or callable(inputs) else inputs
        self.output_filter = output_filter
        self.feeds: dict[str, np.ndarray] | None = None
        self.group = None
        self.result = None
        self.error: BaseException | None = None
        self.shadow = False  # a shadow copy's call (processor/shadow.py), never answered to a client


class Resolved(NamedTuple):
    """A logged call, decoded: what a record format writes."""

    model: str
    version: int | None  # TF Serving's version number; None when no version was reached
    signature_name: str
    request_id: str  # the edge's (HTTP X-Request-ID, gRPC x-request-id), else a fresh one
    time_ns: int
    inputs: dict[str, np.ndarray]
    output_filter: tuple[str, ...]
    outputs: dict[str, np.ndarray] | None  # None for a failed call
    error: ProcessorError | None
    shadow: bool = False  # a shadow copy's call (processor/shadow.py)


def resolve(pending: Pending) -> Resolved:
    """Decode what the request thread kept (writer thread; may raise on a broken response)."""
    result, group = pending.result, pending.group
    signature = result.signature if result is not None else getattr(group, "signature", None)
    served = result.version if result is not None else getattr(group, "version", None)
    output_filter = tuple(pending.output_filter or ())
    if pending.wire is not None:
        inputs, output_filter = _wire_inputs(pending.wire, signature)
    elif pending.feeds is not None:
        inputs = pending.feeds
    else:
        inputs = _raw_inputs(pending.inputs)
    outputs = None
    if result is not None:
        outputs = codec.decode_response(result.outputs) if pending.wire is not None else dict(result.outputs)
    error = as_processor_error(pending.error) if pending.error is not None else None
    return Resolved(pending.model, version_number(served) if served is not None else None,
                    signature.name if signature is not None else "", request_id(pending.request_id),
                    pending.time_ns, inputs, output_filter, outputs, error, pending.shadow)


def _wire_inputs(data: bytes, signature) -> tuple[dict[str, np.ndarray], tuple[str, ...]]:
    """A wire request's inputs: by alias when it decodes against the signature, else as the
    request names them (a request the signature refused), else none (not a PredictRequest)."""
    try:
        request = codec.parse_request(data)
    except ProcessorError:
        return {}, ()
    output_filter = tuple(request.output_filter)
    if signature is not None:
        try:
            return codec.decode_message(request, signature).feeds, output_filter
        except ProcessorError:
            pass
    inputs = {}
    for key, proto in request.inputs.items():
        try:
            inputs[key] = codec.array_from_proto(proto, TensorSpec(key, key, proto.dtype, None))
        except ProcessorError:
            continue
    return inputs, output_filter


def _raw_inputs(inputs: Mapping[str, Any] | None) -> dict[str, np.ndarray]:
    """An array call that failed before its inputs were checked: what converts to arrays."""
    out = {}
    for key, value in (inputs or {}).items():
        try:
            out[str(key)] = np.asarray(value)
        except Exception:  # noqa: BLE001 - a value numpy cannot take is left out of the log
            continue
    return out


def request_id(given: str) -> str:
    """The record's request id: the edge's, else a fresh one."""
    return given if given and given != "-" else uuid.uuid4().hex[:16]
