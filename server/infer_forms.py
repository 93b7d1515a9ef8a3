"""Inference requests of raw tensors run from a form seen before: KServe v2's binary tensors
over HTTP and ``raw_input_contents`` over gRPC, TF Serving gRPC's ``tensor_content``.

A client sends the same request form again and again: the same inputs (names, datatypes,
shapes, raw sizes) and outputs, only the tensors' bytes change. The first request of a form is
answered the ordinary way; if its tensors are all raw and numeric (not booleans, whose bytes
the ordinary path checks per request, nor strings) its form is kept: each input's alias, dtype,
shape and size, checked once against the served signature: the first request asks the
DataPlane for the PreparedCall of its form (``PredictCall.prepare``), made from that request's
own acquire and decode. A later
request of that form cuts its inputs from its raw bytes and runs them on the version they were
checked on (``DataPlane.run_prepared``), skipping the parse of the form and the checks; the
transport writes the answer as it writes the ordinary one (tests compare the bytes).

A form is found by a key the transport makes (the HTTP JSON header's bytes; the gRPC request's
input and output descriptions), with the model and version it names in it. Anything a form
does not cover takes the ordinary path, which gives the errors: raw bytes of another size, a
version swap (the form is dropped), a model that batches, traces or logs (never prepared). At
most ``MAX_FORMS`` forms are kept (then all are forgotten at once), each holding weak
references to the version it was checked on. Thread-safe (dict operations under the GIL; two
threads may prepare the same form, one wins).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

MAX_FORMS = 256


class InferForm:
    """One kept form: its PreparedCall, its inputs and outputs, and what its transport keeps
    with it (``extra``: HTTP's response header template)."""

    __slots__ = ("call", "inputs", "size", "outputs", "extra")

    def __init__(self, call, inputs: tuple, outputs: tuple, extra: Any) -> None:
        self.call = call
        self.inputs = inputs  # (alias, little-endian dtype, native dtype, shape, raw bytes) each
        self.size = sum(place[4] for place in inputs)  # raw bytes of all inputs
        self.outputs = outputs  # (native dtype, little-endian dtype) of each output, in answer order
        self.extra = extra


class InferForms:
    """See the module doc."""

    def __init__(self) -> None:
        self._forms: dict[Hashable, InferForm] = {}

    def get(self, key: Hashable) -> InferForm | None:
        return self._forms.get(key)

    def run(self, rt, key: Hashable, form: InferForm, raws: Sequence, deadline: float | None):
        """The PredictResult of a request of ``form`` whose inputs' raw bytes are ``raws`` (in
        input order); None: answer it the ordinary way. Raises ProcessorError (the engine's
        errors, a passed deadline)."""
        if len(raws) != len(form.inputs):
            return None
        feeds = {}
        for raw, (alias, little, native, shape, size) in zip(raws, form.inputs):
            if len(raw) != size:
                return None
            feeds[alias] = np.frombuffer(raw, little).astype(native).reshape(shape)
        result = rt.dataplane.run_prepared(form.call, feeds, deadline)
        if result is None:  # another version serves the model: prepare the form afresh
            self._forms.pop(key, None)
            return None
        if any(array.dtype != dtype for array, (dtype, _) in zip(result.outputs.values(), form.outputs)):
            return None
        return result

    @staticmethod
    def prepares(rt, model: str) -> bool:
        """Whether ``model``'s requests may be prepared now (``DataPlane.prepares``): ask its
        call to ``prepare`` only then, so a model never prepared costs its requests nothing."""
        return rt.dataplane.prepares(model)

    def learn(self, key: Hashable, prepared: Any, raw_sizes: Sequence[int], outputs: dict[str, np.ndarray],
              extra: Any = None) -> InferForm | None:
        """Keep the form of a request the ordinary path just answered with ``outputs`` and
        ``prepared`` (its result's PreparedCall, None when it has none), when its tensors allow
        it (see the module doc): its inputs are the arrays read from its raw tensors (in their
        order, ``raw_sizes`` bytes each). The form kept, or None. Never raises."""
        if prepared is None or not all(a.dtype.kind in "iufc" for a in outputs.values()):
            return None
        if len(prepared.inputs) != len(raw_sizes):
            return None
        places = []
        for size, (alias, dtype, shape) in zip(raw_sizes, prepared.inputs):
            if dtype.kind not in "iufc" or size != dtype.itemsize * math.prod(shape):
                return None  # booleans: their bytes are checked per request
            places.append((alias, dtype.newbyteorder("<"), dtype, shape, size))
        form = InferForm(prepared, tuple(places),
                         tuple((a.dtype, a.dtype.newbyteorder("<")) for a in outputs.values()), extra)
        if len(self._forms) >= MAX_FORMS:
            self._forms.clear()
        self._forms[key] = form
        return form
