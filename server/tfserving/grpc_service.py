"""TF Serving's gRPC API: ``tensorflow.serving.PredictionService`` (Predict, Classify, Regress,
MultiInference, GetModelMetadata) and ``tensorflow.serving.ModelService/GetModelStatus``, with
the messages of the ``tensorflow-serving-api`` package (built without importing TensorFlow:
:mod:`server.tfserving.messages`), so unchanged TF Serving clients work.

As TF Serving answers them:

* Predict: any signature of the model (``model_spec.signature_name``; none: the model's
  default), input names and count checked, shapes left to the graph; outputs in the typed fields
  (``float_val``, ``int64_val``, ``string_val``, ...) unless the model sets
  ``enable_serialization_as_tensor_content`` (then numbers go in ``tensor_content``); the
  response's ``model_spec`` names the signature and version that ran. A missing signature is
  FAILED_PRECONDITION "Serving signature key "x" not found.".
* Versions (every method): ``model_spec.version`` or ``version_label`` names the version to run
  on (a model may serve several, ``model_version_policy``; one not served is NOT_FOUND); with
  neither, the request metadata ``x-routing-key`` picks the arm of the model's traffic split.
* GetModelStatus: every served version, newest first, AVAILABLE; a version named: that one
  (:func:`server.tfserving.status.model_status`).
* Classify / Regress / MultiInference: :mod:`server.tfserving.inference`.
* GetModelMetadata: every signature served, in one ``SignatureDefMap``.

* HandleReloadConfigRequest (an admin action, behind the server's admin gate: the ``admin``
  :class:`~server.grpc.server.GrpcAdminGate`): its ``ModelServerConfig``'s
  ``model_config_list`` becomes the whole served model list (:func:`server.repository.reload_config`);
  each ``ModelConfig``: ``name``, ``base_path`` -> ``savedmodel_dir``, ``model_version_policy``
  (latest / all / specific; none: latest 1, TF Serving's default) and ``version_labels``; a model
  already known under that name keeps its other ``model_config`` keys (``session_num``...); the
  mapping is :mod:`server.tfserving.model_config`'s (the text-format model config file's too).
  ``model_platform`` other than ``tensorflow`` (or empty), or a ``custom_model_config``, is
  INVALID_ARGUMENT; ``logging_config`` becomes the model's. As TF Serving answers: OK with
  ``status.error_code`` 0, else the error as the call's status (a bad config INVALID_ARGUMENT
  naming the key, nothing changed; a model that failed to load: its error, the others applied).

Each call goes through the server's interceptor (:mod:`server.grpc.interceptor`: parsing, request id, drain
gate, metrics, access log, the one error mapping); the model's work runs where
``ServingRuntime.dispatch`` puts it (in place for a small request to a model that runs in place, else
on the model's pool).
"""

from __future__ import annotations

import logging
from typing import Any

import grpc

from processor.dtypes import DT_STRING
from processor.errors import InvalidArgument
from processor.request import PredictCall, Work

from .. import repository
from ..deadline import from_grpc
from ..grpc.interceptor import ROUTING_KEY, Method, Service, metadata, request_bytes
from ..infer_forms import InferForms
from ..runtime import ServingRuntime
from . import MODEL_SERVICE, PREDICTION_SERVICE, inference, status, tensor_proto
from .messages import Messages, messages
from .model_config import model_entries

log = logging.getLogger("server.grpc")


def _spec(spec) -> tuple[str, int | None, str | None]:
    return (spec.name, *inference.wanted_of(spec))


def _model(request, context) -> str:
    return request.model_spec.name


def _routing_key(request, context) -> str | None:
    """The call's routing key (``x-routing-key`` metadata) when its ``model_spec`` names no
    version or label (one that does never reads it)."""
    spec = request.model_spec
    if spec.HasField("version") or spec.HasField("version_label"):
        return None
    return metadata(context, ROUTING_KEY)


def _form_key(request, name: str, version: int | None) -> tuple | None:
    """A Predict request's form (:mod:`server.infer_forms`): the model, the version number it
    names (a label resolved: a label may be moved to another version at run time, and a form
    runs on the version it was prepared for; None: the default), the signature it names, its
    inputs' names, dtypes and shapes, the outputs it asks for; None unless every input's values
    are raw (``tensor_content``, as ``tf.make_tensor_proto`` writes numbers)."""
    inputs = []
    for key, proto in request.inputs.items():
        if not proto.tensor_content or proto.dtype == DT_STRING or proto.tensor_shape.unknown_rank:
            return None
        inputs.append((key, proto.dtype, tuple([d.size for d in proto.tensor_shape.dim])))
    if not inputs:
        return None
    return name, version, request.model_spec.signature_name, tuple(inputs), tuple(request.output_filter)


def _first_task_model(request, context) -> str:
    return request.tasks[0].model_spec.name if request.tasks else ""


class TfsService:
    """The two services' methods (async handlers under the server's interceptor); ``admin``: the
    gate of the admin method (a :class:`~server.grpc.server.GrpcAdminGate`)."""

    def __init__(self, rt: ServingRuntime, types: Messages, admin: Any) -> None:
        self.rt = rt
        self.m = types
        self.admin = admin
        self._forms = InferForms()  # Predict requests of raw tensors in a form seen before

    async def predict(self, request, context: grpc.aio.ServicerContext):
        return await self.rt.dispatch(Work(request.model_spec.name, request_bytes.get(), self._predict, (
            request, from_grpc(context), _routing_key(request, context))))

    def _predict(self, request, deadline: float | None, routing_key: str | None = None):
        rt, forms = self.rt, self._forms
        name, version, label = _spec(request.model_spec)
        number = version
        if label is not None:  # the form's version: the label's now (None: the ordinary path answers)
            number = None if version is not None else rt.model(name).version_labels.get(label)
        key = _form_key(request, name, number) if label is None or number is not None else None
        if key is not None:
            form = forms.get(key)
            if form is not None:
                result = forms.run(rt, key, form, [proto.tensor_content for proto in request.inputs.values()],
                                   deadline)
                if result is not None:
                    return self._response(name, result)
        limit = rt.deployment.max_request_bytes
        arrays = {key_: tensor_proto.to_numpy(key_, proto, limit) for key_, proto in request.inputs.items()}
        learn = key is not None and forms.prepares(rt, name)
        call = PredictCall(name, arrays, version=version, label=label, signature_name=request.model_spec.signature_name,
                           output_filter=list(request.output_filter), deadline=deadline, check_shapes=False,
                           routing_key=routing_key, prepare=learn)
        result = rt.dataplane.predict(call)
        if learn:  # prepared for the version that answered (the label's then)
            forms.learn(key, result.prepared, [len(proto.tensor_content) for proto in request.inputs.values()],
                        result.outputs)
        return self._response(name, result)

    def _response(self, name: str, result):
        content = self.rt.model(name).config.enable_serialization_as_tensor_content
        response = self.m.PredictResponse()
        response.model_spec.name = name
        response.model_spec.version.value = result.version_number
        response.model_spec.signature_name = result.signature.name
        for key, array in result.outputs.items():
            tensor_proto.from_numpy(array, response.outputs[key], content)
        return response

    async def classify(self, request, context: grpc.aio.ServicerContext):
        return await self.rt.dispatch(Work(request.model_spec.name, request_bytes.get(), inference.classify, (
            self.rt.dataplane, request, from_grpc(context), None, _routing_key(request, context))))

    async def regress(self, request, context: grpc.aio.ServicerContext):
        return await self.rt.dispatch(Work(request.model_spec.name, request_bytes.get(), inference.regress, (
            self.rt.dataplane, request, from_grpc(context), None, _routing_key(request, context))))

    async def multi_inference(self, request, context: grpc.aio.ServicerContext):
        key = _routing_key(request.tasks[0], context) if request.tasks else None
        return await self.rt.dispatch(Work(_first_task_model(request, context), request_bytes.get(),
                                           inference.multi_inference, (self.rt.dataplane, request, from_grpc(context),
                                                                       key)))

    async def metadata(self, request, context: grpc.aio.ServicerContext):
        name, version, label = _spec(request.model_spec)
        fields = list(request.metadata_field)
        unsupported = [f for f in fields if f != "signature_def"]
        if unsupported or not fields:
            raise InvalidArgument(f"Metadata field {unsupported[0] if unsupported else '(none)'} "
                                  f"is not supported; ask for 'signature_def'")
        served = self.rt.dataplane.served(name, version, label)
        sig_map = self.m.SignatureDefMap()
        for signature in served.signatures.values():
            sig_map.signature_def[signature.name].CopyFrom(status.signature_def(signature))
        response = self.m.GetModelMetadataResponse()
        response.model_spec.name = name
        response.model_spec.version.value = served.version_number
        response.metadata["signature_def"].Pack(sig_map)
        return response

    async def reload_config(self, request, context: grpc.aio.ServicerContext):
        def reload(caller: str):
            repository.reload_config(self.rt, model_entries(request.config), caller)
            response = self.m.ReloadConfigResponse()
            response.status.error_code = 0  # OK
            return response
        return await self.admin.call(context, "model config reload", "*", reload, self.m.ReloadConfigResponse)

    async def status(self, request, context: grpc.aio.ServicerContext):
        name, version, label = _spec(request.model_spec)
        statuses = status.served_model_status(self.rt.model(name), version, label)
        response = self.m.GetModelStatusResponse()
        State = self.m.ModelVersionStatus.State
        for s in statuses:
            item = response.model_version_status.add(version=s.version, state=State.Value(s.state))
            item.status.error_code = self.m.ErrorCode.Value(s.error_code)
            item.status.error_message = s.error_message
        return response


def services(rt: ServingRuntime, admin: Any) -> list[Service]:
    """The two services; none (a warning logged) without ``tensorflow-serving-api``. ``admin``:
    the gate of HandleReloadConfigRequest (not counted in the request metrics, as the HTTP admin
    routes)."""
    try:
        m = messages()
    except ImportError as exc:
        log.warning("TF Serving gRPC API disabled: %s (install tensorflow-serving-api with "
                    "--no-deps, as scripts/setup.sh does)", exc)
        return []
    service = TfsService(rt, m, admin)

    def method(api: str, request_type: Any, response_type: Any, model=_model) -> Method:
        return Method(api, request_type, response_type, model)

    return [Service(PREDICTION_SERVICE, {
        "Predict": (service.predict, method("tfs_predict", m.PredictRequest, m.PredictResponse)),
        "Classify": (service.classify, method("tfs_classify", m.ClassificationRequest, m.ClassificationResponse)),
        "Regress": (service.regress, method("tfs_regress", m.RegressionRequest, m.RegressionResponse)),
        "MultiInference": (service.multi_inference, method("tfs_multi_inference", m.MultiInferenceRequest,
                                                           m.MultiInferenceResponse, _first_task_model)),
        "GetModelMetadata": (service.metadata, method("tfs_metadata", m.GetModelMetadataRequest,
                                                      m.GetModelMetadataResponse)),
    }), Service(MODEL_SERVICE, {
        "GetModelStatus": (service.status, method("tfs_status", m.GetModelStatusRequest, m.GetModelStatusResponse)),
        "HandleReloadConfigRequest": (service.reload_config, Method(
            "tfs_reload_config", m.ReloadConfigRequest, m.ReloadConfigResponse, tracked=False)),
    })]
