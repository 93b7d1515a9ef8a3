"""The Open Inference Protocol (KServe v2) over gRPC: ``inference.GRPCInferenceService``.

ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata and ModelInfer, as
tritonclient and KServe's SDK call them (``protos/grpc_predict_v2.proto``). Inputs come as
``raw_input_contents`` or typed ``contents``; outputs go back as ``raw_output_contents``
(Triton's choice; FP16 and BF16 have no typed field). The protocol is
:mod:`server.open_inference`; each call runs inside the handlers' ``_call`` (request id, drain
gate, metrics, error mapping). Requests arrive as bytes and are parsed inside the handler, so
bytes that are not the method's message are INVALID_ARGUMENT, answered and counted like any bad
request (grpcio's own deserializer would answer INTERNAL and log a traceback).
"""

from __future__ import annotations

from typing import Any

import grpc
import numpy as np

from processor.errors import InvalidArgument
from processor.proto import grpc_predict_v2_pb2 as pb

from .. import open_inference as oip
from ..deadline import from_grpc
from . import parse

SERVICE = "inference.GRPCInferenceService"

# Which typed field carries each datatype's values.
_CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
             "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
             "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
             "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents"}
_FIELD_TYPES = {"bool_contents": np.bool_, "int_contents": np.int32, "int64_contents": np.int64,
                "uint_contents": np.uint32, "uint64_contents": np.uint64, "fp32_contents": np.float32,
                "fp64_contents": np.float64, "bytes_contents": object}


class V2Service:
    """The service's methods over the server's handlers (``server.grpc.server._Handlers``)."""

    def __init__(self, handlers) -> None:
        self.h = handlers
        self.rt = handlers.rt

    def server_live(self, request, context) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    def server_ready(self, request, context) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.rt.ready)

    def model_ready(self, request, context) -> pb.ModelReadyResponse:
        # a version that is not served is ready=false here (tritonclient's is_model_ready reads
        # the flag); an unknown model is NOT_FOUND
        return self.h._call("v2_model_ready", request.name, context, lambda: pb.ModelReadyResponse(
            ready=oip.model_ready(self.rt, request.name, request.version or None, unserved_version=False)))

    def server_metadata(self, request, context) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(**oip.server_metadata())

    def model_metadata(self, request, context) -> pb.ModelMetadataResponse:
        def work() -> pb.ModelMetadataResponse:
            meta = oip.model_metadata(self.rt, request.name, request.version or None)
            return pb.ModelMetadataResponse(
                name=meta["name"], versions=meta["versions"], platform=meta["platform"],
                inputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta["inputs"]],
                outputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta["outputs"]])
        return self.h._call("v2_metadata", request.name, context, work)

    def model_infer(self, request, context) -> pb.ModelInferResponse:
        def work() -> pb.ModelInferResponse:
            number, outputs = oip.infer(self.rt, request.model_name, request.model_version or None,
                                        _inputs(request), [o.name for o in request.outputs] or None,
                                        from_grpc(context))
            response = pb.ModelInferResponse(model_name=request.model_name, model_version=number, id=request.id)
            for name, array in outputs.items():
                response.outputs.add(name=name, datatype=oip.datatype_of(array), shape=array.shape)
                response.raw_output_contents.append(oip.raw_bytes(array))
            return response
        return self.h._call("v2_infer", request.model_name, context, work)


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


def generic_handler(handlers) -> grpc.GenericRpcHandler:
    service = V2Service(handlers)

    def unary(fn: Any, request_type: Any, response_type: Any, api: str) -> grpc.RpcMethodHandler:
        return parse.unary(fn, request_type, response_type, handlers._call, api)

    return grpc.method_handlers_generic_handler(SERVICE, {
        "ServerLive": unary(service.server_live, pb.ServerLiveRequest, pb.ServerLiveResponse, "v2_live"),
        "ServerReady": unary(service.server_ready, pb.ServerReadyRequest, pb.ServerReadyResponse, "v2_ready"),
        "ModelReady": unary(service.model_ready, pb.ModelReadyRequest, pb.ModelReadyResponse, "v2_model_ready"),
        "ServerMetadata": unary(service.server_metadata, pb.ServerMetadataRequest, pb.ServerMetadataResponse,
                                "v2_server_metadata"),
        "ModelMetadata": unary(service.model_metadata, pb.ModelMetadataRequest, pb.ModelMetadataResponse,
                               "v2_metadata"),
        "ModelInfer": unary(service.model_infer, pb.ModelInferRequest, pb.ModelInferResponse, "v2_infer"),
    })
