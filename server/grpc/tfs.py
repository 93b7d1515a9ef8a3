"""TF Serving's gRPC API: ``tensorflow.serving.PredictionService`` (Predict, Classify, Regress,
MultiInference, GetModelMetadata) and ``tensorflow.serving.ModelService/GetModelStatus``, with
the messages of the ``tensorflow-serving-api`` package (built without importing TensorFlow:
:mod:`server.tfs_messages`), so unchanged TF Serving clients work.

As TF Serving answers them:

* Predict: any signature of the model (``model_spec.signature_name``; none: the model's
  default), input names and count checked, shapes left to the graph; outputs in the typed fields
  (``float_val``, ``int64_val``, ``string_val``, ...) unless the model sets
  ``enable_serialization_as_tensor_content`` (then numbers go in ``tensor_content``); the
  response's ``model_spec`` names the signature and version that ran. A missing signature is
  FAILED_PRECONDITION "Serving signature key "x" not found.".
* Classify / Regress / MultiInference: :mod:`server.tfs_inference`.
* GetModelMetadata: every signature served, in one ``SignatureDefMap``.

HandleReloadConfigRequest is not served (UNIMPLEMENTED: models come from the deployment file).
Each call runs inside the handlers' ``_call`` (request id, drain gate, metrics, access log, the
one error mapping); requests are parsed in the handler (:mod:`server.grpc.parse`).
"""

from __future__ import annotations

import logging
from typing import Any

import grpc

from processor.errors import InvalidArgument
from processor.request import PredictCall

from .. import tfs_inference, tfserving
from ..deadline import from_grpc
from ..tfs_messages import Messages, messages
from . import parse, tensor_proto

log = logging.getLogger("server.grpc")

PREDICTION_SERVICE = "tensorflow.serving.PredictionService"
MODEL_SERVICE = "tensorflow.serving.ModelService"


def _spec(spec) -> tuple[str, int | None, str | None]:
    return (spec.name, *tfs_inference.wanted_of(spec))


class TfsService:
    """The two services' methods over the server's handlers (``server.grpc.server._Handlers``)."""

    def __init__(self, handlers, types: Messages) -> None:
        self.h = handlers
        self.rt = handlers.rt
        self.m = types

    def predict(self, request, context: grpc.ServicerContext):
        name, version, label = _spec(request.model_spec)

        def work():
            limit = self.rt.deployment.max_request_bytes
            arrays = {key: tensor_proto.to_numpy(key, proto, limit) for key, proto in request.inputs.items()}
            result = self.rt.dataplane.predict(PredictCall(
                name, arrays, version=version, label=label, signature_name=request.model_spec.signature_name,
                output_filter=list(request.output_filter), deadline=from_grpc(context), check_shapes=False))
            content = self.rt.model(name).config.enable_serialization_as_tensor_content
            response = self.m.PredictResponse()
            response.model_spec.name = name
            response.model_spec.version.value = result.version_number
            response.model_spec.signature_name = result.signature.name
            for key, array in result.outputs.items():
                tensor_proto.from_numpy(array, response.outputs[key], content)
            return response
        return self.h._call("tfs_predict", name, context, work)

    def classify(self, request, context: grpc.ServicerContext):
        return self.h._call("tfs_classify", request.model_spec.name, context, lambda: tfs_inference.classify(
            self.rt.dataplane, request, from_grpc(context)))

    def regress(self, request, context: grpc.ServicerContext):
        return self.h._call("tfs_regress", request.model_spec.name, context, lambda: tfs_inference.regress(
            self.rt.dataplane, request, from_grpc(context)))

    def multi_inference(self, request, context: grpc.ServicerContext):
        model = request.tasks[0].model_spec.name if request.tasks else ""
        return self.h._call("tfs_multi_inference", model, context, lambda: tfs_inference.multi_inference(
            self.rt.dataplane, request, from_grpc(context)))

    def metadata(self, request, context: grpc.ServicerContext):
        name, version, label = _spec(request.model_spec)

        def work():
            fields = list(request.metadata_field)
            unsupported = [f for f in fields if f != "signature_def"]
            if unsupported or not fields:
                raise InvalidArgument(f"Metadata field {unsupported[0] if unsupported else '(none)'} "
                                      f"is not supported; ask for 'signature_def'")
            served = self.rt.dataplane.served(name, version, label)
            sig_map = self.m.SignatureDefMap()
            for signature in served.signatures.values():
                sig_map.signature_def[signature.name].CopyFrom(tfserving.signature_def(signature))
            response = self.m.GetModelMetadataResponse()
            response.model_spec.name = name
            response.model_spec.version.value = served.version_number
            response.metadata["signature_def"].Pack(sig_map)
            return response
        return self.h._call("tfs_metadata", name, context, work)

    def status(self, request, context: grpc.ServicerContext):
        name, version, label = _spec(request.model_spec)

        def work():
            statuses = tfserving.served_model_status(self.rt.model(name), version, label)
            response = self.m.GetModelStatusResponse()
            State = self.m.ModelVersionStatus.State
            for s in statuses:
                item = response.model_version_status.add(version=s.version, state=State.Value(s.state))
                item.status.error_code = self.m.ErrorCode.Value(s.error_code)
                item.status.error_message = s.error_message
            return response
        return self.h._call("tfs_status", name, context, work)


def generic_handlers(handlers) -> list[grpc.GenericRpcHandler]:
    """The two services' handlers; none (a warning logged) without ``tensorflow-serving-api``."""
    try:
        m = messages()
    except ImportError as exc:
        log.warning("TF Serving gRPC API disabled: %s (install tensorflow-serving-api with "
                    "--no-deps, as scripts/setup.sh does)", exc)
        return []
    service = TfsService(handlers, m)

    def unary(fn: Any, request_type: Any, response_type: Any, api: str) -> grpc.RpcMethodHandler:
        return parse.unary(fn, request_type, response_type, handlers._call, api)

    return [grpc.method_handlers_generic_handler(PREDICTION_SERVICE, {
        "Predict": unary(service.predict, m.PredictRequest, m.PredictResponse, "tfs_predict"),
        "Classify": unary(service.classify, m.ClassificationRequest, m.ClassificationResponse, "tfs_classify"),
        "Regress": unary(service.regress, m.RegressionRequest, m.RegressionResponse, "tfs_regress"),
        "MultiInference": unary(service.multi_inference, m.MultiInferenceRequest, m.MultiInferenceResponse,
                                "tfs_multi_inference"),
        "GetModelMetadata": unary(service.metadata, m.GetModelMetadataRequest, m.GetModelMetadataResponse,
                                  "tfs_metadata"),
    }), grpc.method_handlers_generic_handler(MODEL_SERVICE, {
        "GetModelStatus": unary(service.status, m.GetModelStatusRequest, m.GetModelStatusResponse, "tfs_status"),
    })]
