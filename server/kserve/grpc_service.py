"""The Open Inference Protocol (KServe v2) over gRPC: ``inference.GRPCInferenceService``.

ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata and ModelInfer, as
tritonclient and KServe's SDK call them (``protos/grpc_predict_v2.proto``). Inputs come as
``raw_input_contents`` or typed ``contents``; outputs go back as ``raw_output_contents``
(Triton's choice; FP16 and BF16 have no typed field). A request of raw contents in a form seen
before runs from that form (:mod:`server.infer_forms`). The protocol is
:mod:`server.kserve.open_inference`; each call goes through the server's interceptor
(:mod:`server.grpc.interceptor`: parsing, request id, drain gate, metrics, error mapping; ServerLive,
ServerReady and ServerMetadata, about the server itself, are not counted); ModelInfer's work
runs where ``ServingRuntime.dispatch`` puts it.

Versions: a model may serve several (``model_version_policy``); ModelMetadata lists them all,
ModelInfer's ``model_version`` runs on that one (NOT_FOUND when it is not served) and the
response's ``model_version`` names the version that answered; a request naming none runs on the
default, or on the arm of the model's traffic split that its ``x-routing-key`` metadata picks.
ModelReady is ready for a served version, ``ready: false`` for another.

The model repository extension, as Triton serves it (tritonclient's ``get_model_repository_index``,
``load_model(name, config=...)``, ``unload_model``): RepositoryIndex, RepositoryModelLoad (its
``config`` parameter: the model's ``model_config`` as a JSON string), RepositoryModelUnload;
:mod:`server.repository`'s logic, admin actions behind the server's admin gate (the
``admin`` :class:`~server.grpc.server.GrpcAdminGate`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from processor.errors import InvalidArgument
from processor.proto import grpc_predict_v2_pb2 as pb
from processor.request import Work

from .. import repository
from ..deadline import from_grpc
from ..grpc.interceptor import ROUTING_KEY, Method, Service, metadata, request_bytes
from ..infer_forms import InferForms
from ..runtime import ServingRuntime
from . import SERVICE
from . import open_inference as oip

# Which typed field carries each datatype's values.
_CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
             "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
             "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
             "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents"}
_FIELD_TYPES = {"bool_contents": np.bool_, "int_contents": np.int32, "int64_contents": np.int64,
                "uint_contents": np.uint32, "uint64_contents": np.uint64, "fp32_contents": np.float32,
                "fp64_contents": np.float64, "bytes_contents": object}


class V2Service:
    """The service's methods (async handlers under the server's interceptor); ``admin``: the
    gate of the repository methods (a :class:`~server.grpc.server.GrpcAdminGate`)."""

    def __init__(self, rt: ServingRuntime, admin: Any) -> None:
        self.rt = rt
        self.admin = admin
        self._forms = InferForms()  # raw requests of a form seen before (server/infer_forms.py)

    async def server_live(self, request, context) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def server_ready(self, request, context) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.rt.ready)

    async def model_ready(self, request, context) -> pb.ModelReadyResponse:
        # a version that is not served is ready=false here (tritonclient's is_model_ready reads
        # the flag); an unknown model is NOT_FOUND
        return pb.ModelReadyResponse(
            ready=oip.model_ready(self.rt, request.name, request.version or None, unserved_version=False))

    async def server_metadata(self, request, context) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(**oip.server_metadata())

    async def model_metadata(self, request, context) -> pb.ModelMetadataResponse:
        meta = oip.model_metadata(self.rt, request.name, request.version or None)
        return pb.ModelMetadataResponse(
            name=meta["name"], versions=meta["versions"], platform=meta["platform"],
            inputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta["inputs"]],
            outputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta["outputs"]])

    async def model_infer(self, request, context) -> pb.ModelInferResponse:
        key = None if request.model_version else metadata(context, ROUTING_KEY)  # one naming a version never reads it
        return await self.rt.dispatch(Work(request.model_name, request_bytes.get(), self._infer,
                                           (request, from_grpc(context), key)))

    def _infer(self, request, deadline: float | None, routing_key: str | None = None) -> pb.ModelInferResponse:
        rt, forms = self.rt, self._forms
        key = _form_key(request)
        form = forms.get(key) if key is not None else None
        if form is not None:
            result = forms.run(rt, key, form, request.raw_input_contents, deadline)
            if result is not None:
                return _response(request, str(result.version_number), result.outputs)
        model, version = request.model_name, request.model_version or None
        inputs, wanted = _inputs(request), [o.name for o in request.outputs] or None
        learn = key is not None and forms.prepares(rt, model)
        number, outputs, prepared = oip.infer(rt, model, version, inputs, wanted, deadline, routing_key=routing_key,
                                              prepare=learn)
        if learn:
            forms.learn(key, prepared, [len(t.raw) for t in inputs], outputs)
        return _response(request, number, outputs)


    async def repository_index(self, request, context) -> pb.RepositoryIndexResponse:
        def index(caller: str) -> pb.RepositoryIndexResponse:
            Row = pb.RepositoryIndexResponse.ModelIndex
            return pb.RepositoryIndexResponse(models=[Row(**row) for row in repository.index(self.rt, request.ready)])
        return await self.admin.call(context, "repository index", "*", index, pb.RepositoryIndexResponse)

    async def repository_load(self, request, context) -> pb.RepositoryModelLoadResponse:
        def load(caller: str) -> pb.RepositoryModelLoadResponse:
            config = oip.load_config(_parameters(request.parameters))
            repository.load(self.rt, request.model_name, config, caller)
            return pb.RepositoryModelLoadResponse()
        return await self.admin.call(context, "repository load", request.model_name, load,
                                     pb.RepositoryModelLoadResponse)

    async def repository_unload(self, request, context) -> pb.RepositoryModelUnloadResponse:
        def unload(caller: str) -> pb.RepositoryModelUnloadResponse:
            repository.unload(self.rt, request.model_name, caller)
            return pb.RepositoryModelUnloadResponse()
        return await self.admin.call(context, "repository unload", request.model_name, unload,
                                     pb.RepositoryModelUnloadResponse)


def _parameters(parameters) -> dict[str, Any]:
    """A repository request's parameters as plain values (each its oneof's field; unset: None)."""
    out = {}
    for key, value in parameters.items():
        field = value.WhichOneof("parameter_choice")
        out[key] = getattr(value, field) if field is not None else None
    return out


def _response(request, number: str, outputs: dict[str, np.ndarray]) -> pb.ModelInferResponse:
    response = pb.ModelInferResponse(model_name=request.model_name, model_version=number, id=request.id)
    for name, array in outputs.items():
        response.outputs.add(name=name, datatype=oip.datatype_of(array), shape=array.shape)
        response.raw_output_contents.append(oip.raw_bytes(array))
    return response


def _form_key(request) -> tuple | None:
    """A ModelInfer request's form (:mod:`server.infer_forms`): its model, version, inputs'
    names, datatypes and shapes, and the outputs it names; None for a request that is not
    plain (typed contents, parameters: the ordinary path reads them)."""
    if not request.raw_input_contents or request.parameters:
        return None
    inputs = []
    for tensor in request.inputs:
        if tensor.parameters or tensor.HasField("contents"):
            return None
        inputs.append((tensor.name, tensor.datatype, tuple(tensor.shape)))
    wanted = []
    for output in request.outputs:
        if output.parameters:
            return None
        wanted.append(output.name)
    return request.model_name, request.model_version, tuple(inputs), tuple(wanted)


def _inputs(request) -> list[oip.InferInput]:
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidArgument(f"raw_input_contents holds {len(raw)} entries for {len(request.inputs)} inputs")
    out = []
    for i, tensor in enumerate(request.inputs):
        shape = tuple(tensor.shape)
        if raw:
            if tensor.HasField("contents"):
                raise InvalidArgument(f"input {oip.echo(tensor.name)}: contents and raw_input_contents both given")
            out.append(oip.InferInput(tensor.name, tensor.datatype, shape, raw=raw[i]))
            continue
        field = _CONTENTS.get(tensor.datatype)
        if field is None:
            hint = " (FP16 and BF16 travel in raw_input_contents only)" if tensor.datatype in ("FP16", "BF16") else ""
            raise InvalidArgument(f"input {oip.echo(tensor.name)}: datatype {oip.echo(tensor.datatype)} has "
                                  f"no typed contents{hint}")
        values = getattr(tensor.contents, field)
        count = oip.element_count(tensor.name, shape)
        if len(values) != count:  # before converting anything
            raise InvalidArgument(f"input {oip.echo(tensor.name)}: {len(values)} elements in "
                                  f"contents.{field} for a shape of {count}")
        out.append(oip.InferInput(tensor.name, tensor.datatype, shape, data=_typed(values, field)))
    return out


def _typed(values, field: str) -> np.ndarray:
    """A repeated field as a numpy array of its own type (one pass, no Python list)."""
    kind = _FIELD_TYPES[field]
    if kind is object:
        out = np.empty(len(values), object)
        out[:] = values
        return out
    return np.fromiter(values, kind, count=len(values))


def _name(request, context) -> str:
    return request.name


def _model_name(request, context) -> str:
    return request.model_name


def service(rt: ServingRuntime, admin: Any) -> Service:
    """The service; ``admin``: the gate of its repository methods (admin actions, not counted
    in the request metrics, as the HTTP admin routes)."""
    v2 = V2Service(rt, admin)
    return Service(SERVICE, {
        "ServerLive": (v2.server_live, Method("v2_live", pb.ServerLiveRequest, pb.ServerLiveResponse,
                                              tracked=False)),
        "ServerReady": (v2.server_ready, Method("v2_ready", pb.ServerReadyRequest, pb.ServerReadyResponse,
                                                tracked=False)),
        "ModelReady": (v2.model_ready, Method("v2_model_ready", pb.ModelReadyRequest, pb.ModelReadyResponse,
                                              _name)),
        "ServerMetadata": (v2.server_metadata, Method("v2_server_metadata", pb.ServerMetadataRequest,
                                                      pb.ServerMetadataResponse, tracked=False)),
        "ModelMetadata": (v2.model_metadata, Method("v2_metadata", pb.ModelMetadataRequest,
                                                    pb.ModelMetadataResponse, _name)),
        "ModelInfer": (v2.model_infer, Method("v2_infer", pb.ModelInferRequest, pb.ModelInferResponse,
                                              _model_name)),
        "RepositoryIndex": (v2.repository_index, Method("v2_repository_index", pb.RepositoryIndexRequest,
                                                        pb.RepositoryIndexResponse, tracked=False)),
        "RepositoryModelLoad": (v2.repository_load, Method("v2_repository_load", pb.RepositoryModelLoadRequest,
                                                           pb.RepositoryModelLoadResponse, tracked=False)),
        "RepositoryModelUnload": (v2.repository_unload, Method(
            "v2_repository_unload", pb.RepositoryModelUnloadRequest, pb.RepositoryModelUnloadResponse,
            tracked=False)),
    })
