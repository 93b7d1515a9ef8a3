"""What every TF Serving REST JSON decoder shares: the request's top level (:class:`Request`,
its :class:`Limits`, the ROW / COLUMNAR formats), which input a name is (:func:`input_spec`,
:func:`only_input`), the examples' inputs that differ (:func:`different_inputs`), a JSON
object's members (:func:`last_of_each`) and the request's tensor elements against their limit
(:class:`Elements`). :mod:`server.tfserving.rest_json` decodes whole bodies and
:mod:`server.tfserving.rest_json_runs` large ones a run at a time with these. Errors are
:class:`~processor.errors.InvalidArgument` (413 ``PayloadTooLarge`` over ``max_elements``);
values from the request are echoed at most about 80 characters long. Pure functions (an
:class:`Elements` belongs to one request); thread-safe.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from processor.errors import InvalidArgument, PayloadTooLarge
from processor.signature import Signature, TensorSpec

from ..http.json_stream import CHUNK, DEFAULT_MAX_ELEMENTS, MAX_DEPTH, Document, Span, clip

ROW, COLUMNAR = "row", "columnar"

MAX_MEMBERS = 4096  # members of the top-level object and of "inputs"


@dataclass(frozen=True)
class Limits:
    """What one request may hold (``DeploymentConfig.json_*`` keys)."""

    max_elements: int = DEFAULT_MAX_ELEMENTS
    max_depth: int = MAX_DEPTH


@dataclass
class Request:
    """A request's top level: ``signature_name`` and the value of ``instances`` (ROW) or
    ``inputs`` (COLUMNAR): a Python value for small bodies, a :class:`Span` of ``doc`` for large
    ones (decoded by :func:`server.tfserving.rest_json.decode_request` a run at a time)."""

    signature_name: str
    fmt: str
    value: Any
    doc: Document | None = None
    limits: Limits = field(default_factory=Limits)


class Elements:
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


def count_elements(arrays: list[np.ndarray], limits: Limits, charge: Callable[[int], None] | None) -> None:
    """A decoded request's arrays against ``limits.max_elements``, their bytes to ``charge``."""
    Elements(limits.max_elements, charge).take(sum(a.size for a in arrays), sum(a.nbytes for a in arrays))


def input_spec(signature: Signature, name: str) -> TensorSpec:
    """``signature.input(name)``, the name echoed at most 80 characters long."""
    if len(name) > 200 or not name.isprintable():
        raise InvalidArgument(f"unknown input {clip(name)}; signature {signature.name!r} takes "
                              f"{sorted(signature.inputs)}")
    return signature.input(name)


def only_input(signature: Signature, key: str) -> TensorSpec:
    """The signature's one input, for plain values under ``key``; InvalidArgument for several."""
    if len(signature.inputs) != 1:
        raise InvalidArgument(f"'{key}' holds plain values but signature {signature.name!r} takes "
                              f"{len(signature.inputs)} inputs {sorted(signature.inputs)}; name them "
                              f"with objects")
    return next(iter(signature.inputs.values()))


def different_inputs(i: int, row: dict, names: list[str]) -> InvalidArgument:
    return InvalidArgument(f"instances[{i}] has inputs {clip(sorted(row), 200)}, instances[0] has "
                           f"{clip(sorted(names), 200)}; every example must name the same inputs")


def last_of_each(document: Document, members: list[tuple[str, Span]], depth: int,
                 used: set[str] | None = None) -> dict[str, Span]:
    """Members by key, the last of duplicates (as orjson); values nobody reads (other keys, and
    earlier duplicates) are parsed here, so that a document with invalid JSON in them fails."""
    out = dict(members)
    for key, span in members:
        if out[key] is not span or (used is not None and key not in used and key != "signature_name"):
            document.validate(span, depth + 1, CHUNK)
    return out
