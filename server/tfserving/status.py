"""TensorFlow Serving semantics shared by the REST and gRPC front-ends (transport-neutral):
model status (TF Serving's ``ModelVersionStatus`` states) and the SignatureDef metadata.

Version numbers, version labels and the version and signature checks of a predict call are the
processor's (:mod:`processor.request`): the DataPlane checks them in the acquire that runs the call.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from processor.errors import NotFound
from processor.manager.model_state import ModelState
from processor.request import requested_version, version_number
from processor.signature import Signature

from .messages import messages

PREDICT_METHOD = "tensorflow/serving/predict"

# ModelState -> TF Serving's ModelVersionStatus.State name (a plain state string looks up the same).
_STATES = {ModelState.NEW: "START", ModelState.LOADING: "LOADING", ModelState.WARMING: "LOADING",
           ModelState.READY: "AVAILABLE", ModelState.FAILED: "END", ModelState.CLOSED: "END"}


@dataclass(frozen=True)
class VersionStatus:
    version: int
    state: str  # UNKNOWN START LOADING AVAILABLE UNLOADING END
    error_code: str  # tensorflow.error.Code name
    error_message: str

    def as_json(self) -> dict[str, Any]:
        return {"version": str(self.version), "state": self.state,
                "status": {"error_code": self.error_code, "error_message": self.error_message}}


def served_model_status(model, version: int | None, label: str | None) -> list[VersionStatus]:
    """GetModelStatus of a :class:`~processor.served_model.ServedModel` for a request naming a
    version or a label (or neither)."""
    return model_status(model, requested_version(model.name, version, label, model.version_labels))


def model_status(model, wanted: int | None) -> list[VersionStatus]:
    """GetModelStatus as TF Serving answers it: every served version, newest first (TF Serving's
    ``ServableStateMonitor`` keeps a model's versions in descending order), each AVAILABLE; with
    ``wanted``, that version alone, NOT_FOUND when it is not served. While no version is served,
    the model's loading or failed state as version 0. ``model``: a
    :class:`~processor.served_model.ServedModel` (its ``name``, ``served_version()``,
    ``served_versions()``, ``state``, ``last_error``)."""
    default = model.served_version()
    if default is not None:
        # several versions under a model_version_policy naming more than one; the default alone
        # should a retirement empty the list between the two reads
        numbers = sorted({version_number(v) for v in model.served_versions() or (default,)}, reverse=True)
        if wanted is not None:
            if wanted not in numbers:
                raise NotFound(f"Could not find version {wanted} of model {model.name}")
            numbers = [wanted]
        return [VersionStatus(number, "AVAILABLE", "OK", "") for number in numbers]
    if wanted is not None:
        raise NotFound(f"Could not find version {wanted} of model {model.name}")
    state = _STATES.get(model.state, "UNKNOWN")
    error = model.last_error or ""
    return [VersionStatus(0, state, "UNKNOWN" if error else "OK", error)]


def signature_def(signature: Signature):
    """The served signature as a ``tensorflow.SignatureDef`` proto."""
    types = messages()

    def info(spec):
        shape = types.TensorShapeProto(unknown_rank=spec.shape is None)
        for d in spec.shape or ():
            shape.dim.add(size=d)
        return types.TensorInfo(name=spec.name, dtype=spec.dtype, tensor_shape=shape)

    sig = types.SignatureDef(method_name=signature.method or PREDICT_METHOD)
    for alias, spec in signature.inputs.items():
        sig.inputs[alias].CopyFrom(info(spec))
    for alias, spec in signature.outputs.items():
        sig.outputs[alias].CopyFrom(info(spec))
    return sig


def signature_def_json(signatures: Iterable[Signature]) -> dict[str, Any]:
    """TF Serving's REST metadata ``{"signature_def": {"signature_def": {name: ...}}}`` of every
    signature served."""
    from google.protobuf import json_format

    return {"signature_def": {"signature_def": {
        s.name: json_format.MessageToDict(signature_def(s), preserving_proto_field_name=True,
                                          always_print_fields_with_no_presence=True)
        for s in signatures}}}
