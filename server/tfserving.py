"""TensorFlow Serving semantics shared by the REST and gRPC front-ends (transport-neutral).

* Version numbers: a served :class:`~processor.store.model_version.ModelVersion` is TF
  Serving version ``full_step`` (the full checkpoint's global step), ``0`` when parameters come
  from the SavedModel's own variables. One version per model is served at a time.
* A request may name a version or a label (``version_labels`` of the deployment), never both;
  naming a version that is not served is NOT_FOUND ("Servable not found for request:
  Specific(name, N)"), an unknown label INVALID_ARGUMENT, both as TF Serving does.
* Model states map to TF Serving's ``ModelVersionStatus.State`` names.
"""

from __future__ import annotations

import json

from dataclasses import dataclass
from typing import Any

from processor.errors import InvalidArgument, NotFound
from processor.manager.version_state import VersionState
from processor.signature import Signature
from processor.store.model_version import ModelVersion

PREDICT_METHOD = "tensorflow/serving/predict"

# VersionState -> TF Serving's ModelVersionStatus.State name (a plain state string looks up the same).
_STATES = {VersionState.NEW: "START", VersionState.LOADING: "LOADING", VersionState.WARMING: "LOADING",
           VersionState.READY: "AVAILABLE", VersionState.FAILED: "END", VersionState.CLOSED: "END"}


def version_number(version: ModelVersion) -> int:
    return max(version.full_step, 0)


@dataclass(frozen=True)
class VersionStatus:
    version: int
    state: str  # UNKNOWN START LOADING AVAILABLE UNLOADING END
    error_code: str  # tensorflow.error.Code name
    error_message: str

    def as_json(self) -> dict[str, Any]:
        return {"version": str(self.version), "state": self.state,
                "status": {"error_code": self.error_code, "error_message": self.error_message}}


def requested_version(name: str, version: int | None, label: str | None,
                      labels: dict[str, int]) -> int | None:
    """The version number a request asks for (None: the served one)."""
    if version is not None and label:
        raise InvalidArgument(f"Both model version ({version}) and model version label ({label}) "
                              f"cannot be supplied.")
    if label:
        if label not in labels:
            raise InvalidArgument(f"Unrecognized servable version label: {label} (model {name!r} "
                                  f"has labels {sorted(labels)})")
        return labels[label]
    return version


def check_served(name: str, served: ModelVersion, wanted: int | None) -> int:
    """The served version number; NOT_FOUND when ``wanted`` is another one."""
    number = version_number(served)
    if wanted is not None and wanted != number:
        raise NotFound(f"Servable not found for request: Specific({name}, {wanted}); "
                       f"serving version {number}")
    return number


def check_signature_name(requested: str, signature: Signature) -> None:
    """NOT_FOUND unless ``requested`` is empty or the served signature's name (the request's
    value echoed at most 80 characters long)."""
    if requested and requested != signature.name:
        shown = json.dumps(requested[:80]) + (f" ({len(requested)} characters)" if len(requested) > 80 else "")
        raise NotFound(f"Serving signature name: {shown} not found in signature def; "
                       f"this model serves \"{signature.name}\"")


def model_status(manager, wanted: int | None) -> list[VersionStatus]:
    """GetModelStatus: the served version (or the failed/loading state when none is served)."""
    served = manager.served_version()
    if served is not None:
        number = version_number(served)
        if wanted is not None and wanted != number:
            raise NotFound(f"Could not find version {wanted} of model {manager.name}")
        return [VersionStatus(number, "AVAILABLE", "OK", "")]
    if wanted is not None:
        raise NotFound(f"Could not find version {wanted} of model {manager.name}")
    state = _STATES.get(manager.state, "UNKNOWN")
    error = manager.last_error or ""
    return [VersionStatus(0, state, "UNKNOWN" if error else "OK", error)]


def signature_def(signature: Signature):
    """The served signature as a ``tensorflow.SignatureDef`` proto."""
    from tensorflow.core.framework import tensor_shape_pb2
    from tensorflow.core.protobuf import meta_graph_pb2

    def info(spec):
        shape = tensor_shape_pb2.TensorShapeProto(unknown_rank=spec.shape is None)
        for d in spec.shape or ():
            shape.dim.add(size=d)
        return meta_graph_pb2.TensorInfo(name=spec.name, dtype=spec.dtype, tensor_shape=shape)

    sig = meta_graph_pb2.SignatureDef(method_name=signature.method or PREDICT_METHOD)
    for alias, spec in signature.inputs.items():
        sig.inputs[alias].CopyFrom(info(spec))
    for alias, spec in signature.outputs.items():
        sig.outputs[alias].CopyFrom(info(spec))
    return sig


def signature_def_json(signature: Signature) -> dict[str, Any]:
    """TF Serving's REST metadata ``{"signature_def": {"signature_def": {name: ...}}}``."""
    from google.protobuf import json_format

    body = json_format.MessageToDict(signature_def(signature), preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)
    return {"signature_def": {"signature_def": {signature.name: body}}}
