"""One predict call: what an edge asks (:class:`PredictCall`), what it gets (:class:`PredictResult`),
and the checks of what the call names against what is served.

Every edge (our HTTP and gRPC protocol, TF Serving's REST and gRPC, KServe v2, the C ABI) builds
a :class:`PredictCall` and hands it to :meth:`processor.dataplane.DataPlane.predict`, which does
one acquire of the served version, checks the version and signature the call names against it,
decodes the inputs once and runs them. The result names the version and signature that served
it, so an edge never reports a version it did not run.

Versions are numbered as TF Serving numbers them (:func:`version_number`): the full checkpoint's
global step, ``0`` when parameters come from the SavedModel's own variables. A call names a
version or a label (``version_labels`` of the model's deployment entry), never both; a version
that is not the served one is NOT_FOUND ("Servable not found for request: Specific(name, N)"),
an unknown label INVALID_ARGUMENT, both as TF Serving answers them. A call names any signature
the served model has (:func:`served_signature`; none: the model's ``signature_name``), as TF
Serving serves every signature of a SavedModel.

Immutable values (named tuples: built per request, so cheap to make); pure functions; thread-safe.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from typing import Any, NamedTuple, Union

import numpy as np

from .echo import cut, shorten
from .errors import DeadlineExceeded, InvalidArgument, NotFound, SignatureNotFound
from .signature import Signature

# The id of the request being served: set by the edges that have one (HTTP X-Request-ID, gRPC
# x-request-id metadata; the server's logs carry it too), "-" elsewhere (the C ABI).
request_id_var: ContextVar[str] = ContextVar("request_id", default="-")

# Set by an edge's request bookkeeping to a fresh ``[version, arm]`` list that the DataPlane
# fills in: the ModelVersion that answered and the traffic arm that chose it (None: the call
# named its version, or the model splits no traffic). A list, not the value itself: the DataPlane
# may run in a copy of the edge's context (a pool thread), whose own sets the edge never sees.
answer_note_var: ContextVar[list | None] = ContextVar("answer_note", default=None)

# The inputs of a call: serialized eas PredictRequest bytes (the answer is PredictResponse bytes;
# empty bytes are DeepRec's introspection ping, answered with the signature JSON), numpy arrays
# by alias or tensor name, or a decoder that makes them from the served signature (formats whose
# decoding needs it: TF Serving's JSON). Arrays and decoders are answered with arrays by key.
Inputs = Union[bytes, bytearray, memoryview, Mapping[str, np.ndarray],
               Callable[[Signature], Mapping[str, np.ndarray]]]


class PredictCall(NamedTuple):
    """What an edge asks. ``deadline``: a ``time.monotonic()`` value (gRPC deadline, HTTP
    timeout header) after which the request is dropped unrun with DEADLINE_EXCEEDED.
    ``output_filter``: the outputs wanted, by alias or tensor name (arrays and decoders only:
    serialized requests carry their own). ``check_shapes``: arrays and decoders are checked
    against the signature's ranks and fixed dimensions; False is TF Serving's rule (input names,
    count and dtypes checked; the graph decides the shapes and its refusal is a 400).
    ``routing_key``: for a call naming no version, what the model's traffic split hashes (one
    key, one arm: :mod:`processor.routing`); None draws at random."""

    model: str
    inputs: Inputs
    version: int | None = None
    label: str | None = None
    signature_name: str = ""
    output_filter: Sequence[str] | None = None
    deadline: float | None = None
    check_shapes: bool = True
    routing_key: str | None = None
    prepare: bool = False  # arrays and decoders: also answer the PreparedCall of this form, if any


class Work(NamedTuple):
    """A request an edge decodes itself (JSON, protos) on whichever thread runs it:
    ``fn(*args)``, its whole work, for a request of ``size`` bytes to ``model``. Handed to
    ``DataPlane.submit`` as a wire PredictCall is: run in place or on a thread, by the plan."""

    model: str
    size: int
    fn: Callable[..., Any]
    args: tuple = ()


class PredictResult(NamedTuple):
    """What served a call and what it answered: ``outputs`` is PredictResponse bytes (or the
    signature JSON when ``introspection``) for serialized inputs, else arrays by output key.
    ``prepared``: a call asking ``prepare``'s :class:`PreparedCall`, when its form can be."""

    outputs: Any
    version: Any  # processor's ModelVersion of the version that ran the call
    signature: Signature
    introspection: bool = False
    prepared: Any = None

    @property
    def version_number(self) -> int:
        return version_number(self.version)



class PreparedCall(NamedTuple):
    """A call of numeric arrays checked once against the group that served it
    (``DataPlane.prepare``): later calls with arrays of the same dtypes and shapes run on that
    group without the checks (``DataPlane.run_prepared``) until another version is served.
    A prepared statement of sorts, for edges that see the same request form over and over."""

    model: str
    # weak references: a prepared call never keeps a version's sessions alive once it is retired
    group: Any  # to the SessionGroup acquired when it was prepared (compared by identity)
    served: Any  # to what runs it: that group, or its view of the call's signature
    inputs: tuple[tuple[str, np.dtype, tuple[int, ...]], ...]  # (alias, dtype, shape), as checked
    fetches: tuple[tuple[str, str], ...]  # (response key, output alias)
    aliases: tuple[str, ...]  # the fetched outputs' aliases
    version: int | None = None  # the version number the call named (None: the default)

# The request path's two constructors. A named tuple's generated constructor fills the defaults
# in a Python frame of its own; these build the tuple directly, their class bound once (counted
# with cachegrind: the generated constructor runs about a third more instructions, ~0.1 us a
# request). Everything else constructs ordinarily.

def wire_call(model: str, data: bytes | bytearray | memoryview, _new=tuple.__new__,
              _cls=PredictCall) -> PredictCall:
    """``PredictCall(model, data)``: serialized bytes, no options (the C ABI's ``process``).
    Equal to the ordinary construction (tests/unit/test_request.py keeps the defaults in step)."""
    return _new(_cls, (model, data, None, None, "", None, None, True, None, False))


def wire_result(outputs: Any, version: Any, signature: Signature, _new=tuple.__new__,
                _cls=PredictResult) -> PredictResult:
    """``PredictResult(outputs, version, signature)``: the hot path's answer to a wire request."""
    return _new(_cls, (outputs, version, signature, False, None))


class Served(NamedTuple):
    """What serves a model (metadata calls): its version, default signature, engine name and
    every signature it serves by name (the default one included)."""

    version: Any  # processor's ModelVersion
    signature: Signature
    engine_name: str
    signatures: Mapping[str, Signature] = {}

    @property
    def version_number(self) -> int:
        return version_number(self.version)


def version_number(version) -> int:
    """A served version's TF Serving number (see the module doc; ``ModelVersion.number``, for
    any object with a ``full_step``)."""
    return max(version.full_step, 0)


MAX_VERSION = 2**63 - 1  # versions are int64, as TF Serving's and KServe's protos carry them
_VERSION_DIGITS = 19  # len(str(MAX_VERSION))


def parse_version(text: str) -> int:
    """The version number a URL or a string field names: 1 to 19 ASCII digits, at most int64's
    maximum. Anything else (a sign, spaces, Unicode digits such as ``"²"``, 5,000 digits) is
    InvalidArgument, the text echoed at most 80 characters long. Every edge that reads a version
    from text calls this, so they all refuse the same strings the same way."""
    if (not text or len(text) > _VERSION_DIGITS or not text.isascii() or not text.isdigit()
            or int(text) > MAX_VERSION):
        raise InvalidArgument(f"Failed to convert version: {shorten(text, 80)} to numeric: a version is a "
                              f"non-negative 64-bit integer (at most {_VERSION_DIGITS} ASCII digits)")
    return int(text)


def requested_version(name: str, version: int | None, label: str | None,
                      labels: Mapping[str, int]) -> int | None:
    """The version number a call asks for (None: the served one)."""
    if version is not None and label:
        raise InvalidArgument(f"Both model version ({version}) and model version label "
                              f"({cut(label)}) cannot be supplied.")
    if label:
        if label not in labels:
            raise InvalidArgument(f"Unrecognized servable version label: {cut(label)} (model "
                                  f"{shorten(name, 80)} has labels {sorted(labels)})")
        return labels[label]
    return version


def check_served(name: str, served, wanted: int | None) -> int:
    """The served version's number; NOT_FOUND when ``wanted`` is another one."""
    number = version_number(served)
    if wanted is not None and wanted != number:
        raise not_served(name, wanted, f"version {number}")
    return number


def not_served(name: str, wanted: int, serving: str) -> NotFound:
    """TF Serving's NOT_FOUND for version ``wanted`` of model ``name``, which is not served;
    ``serving``: what is (``"versions [1, 2]"``)."""
    return NotFound(f"Servable not found for request: Specific({cut(name)}, {wanted}); serving {serving}")


def served_signature(requested: str, signatures: Mapping[str, Signature]) -> Signature:
    """The signature ``requested`` names among those served; SignatureNotFound (TF Serving's
    Predict wording, the name echoed at most 80 characters long) when there is none."""
    found = signatures.get(requested)
    if found is None:
        raise SignatureNotFound(f"Serving signature key {json.dumps(cut(requested))} not found. This model "
                                f"serves {shorten(sorted(signatures), 200)}", requested)
    return found


def check_call(group, signature_name: str):
    """The signature name a call asks for, against the group (the version) that will run it: the
    group serving that signature (:meth:`~processor.engine.session_group.SessionGroup.for_signature`)."""
    return group.for_signature(signature_name) if signature_name else group


def check_deadline(name: str, deadline: float) -> None:
    """DeadlineExceeded for model ``name``'s call whose ``deadline`` (``time.monotonic()``) passed."""
    if time.monotonic() >= deadline:
        raise DeadlineExceeded(f"model {name!r}: the request's deadline passed before it ran")
