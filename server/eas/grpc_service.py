"""Our own gRPC protocol: ``tensorflow.eas.ProcessorService/Predict`` (``protos/processor_service.proto``).

Our ``PredictRequest`` / ``PredictResponse``; the model is named by the ``model-name`` request
metadata (optional when one model is served; ``x-model-name`` is read when ``model-name`` is not
sent: ``model-name`` wins whatever the order, as on the native server, whose metadata map keeps no
order between keys). Bytes go straight to ``DataPlane.predict``. An
empty request message is DeepRec's introspection ping, as an empty HTTP body and the C ABI's
empty ``process()`` are: the answer is the signature as JSON bytes (not a ``PredictResponse``;
read it with a raw-bytes call, e.g. ``channel.unary_unary(path)``), with the trailing metadata
``x-response-format: signature-json``. The request metadata ``x-model-version`` (digits) or
``x-model-label`` names the version to run on (a model may serve several; a version not served
is NOT_FOUND, malformed digits INVALID_ARGUMENT); with neither, ``x-routing-key`` picks the arm
of the model's traffic split. The answer names the version that ran in its initial metadata
``x-model-version``.

The call goes through the server's interceptor (:mod:`server.grpc.interceptor`: request id,
drain gate, metrics, access log, the one error mapping); its work runs where
``ServingRuntime.dispatch`` puts it.
"""

from __future__ import annotations

import grpc

from processor.errors import InvalidArgument
from processor.request import PredictCall, parse_version

from ..deadline import from_grpc
from ..grpc.interceptor import Method, Service, metadata_values
from ..logs import request_id_var
from ..runtime import ServingRuntime
from . import PROCESSOR_SERVICE

# ProcessorService/Predict's request metadata, read in one scan: the model (model-name, else
# x-model-name), the version (digits) or label to run on, the routing key (see the module doc)
_PREDICT_METADATA = {"model-name": 0, "x-model-name": 4, "x-model-version": 1, "x-model-label": 2,
                     "x-routing-key": 3}
_MODEL_METADATA = {"model-name": 0, "x-model-name": 1}


class ProcessorService:
    """``tensorflow.eas.ProcessorService``: our wire format's bytes straight to the DataPlane."""

    def __init__(self, rt: ServingRuntime) -> None:
        self.rt = rt

    def model_of(self, data: bytes, context: grpc.aio.ServicerContext) -> str:
        """The model the ``model-name`` metadata names; with one model served, that one; else ""."""
        named, alias = metadata_values(context, _MODEL_METADATA, 2)
        return self._model(alias if named is None else named)

    def _model(self, named: str | None) -> str:
        """The model ``named`` (the metadata's value), else the one model served, else ""."""
        if named:
            return named
        names = self.rt.dataplane.model_names
        return names[0] if len(names) == 1 else ""

    async def predict(self, data: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """One Predict (see the module doc): the version it names, or its routing key's arm."""
        rt = self.rt
        named, version, label, key, alias = metadata_values(context, _PREDICT_METADATA, 5)
        model = self._model(alias if named is None else named)
        if not model:
            raise InvalidArgument(f"name the model in the 'model-name' request metadata; "
                                  f"serving {sorted(rt.dataplane.model_names)}")
        call = PredictCall(model, data, None if version is None else parse_version(version), label or None,
                           deadline=from_grpc(context), routing_key=key)
        result = await rt.dispatch(call)
        await context.send_initial_metadata((("x-model-version", str(result.version_number)),))
        if result.introspection:  # the signature JSON, as HTTP and the C ABI answer
            context.set_trailing_metadata((("x-request-id", request_id_var.get()),
                                           ("x-response-format", "signature-json")))
        return result.outputs

    def service(self) -> Service:
        return Service(PROCESSOR_SERVICE, {"Predict": (self.predict, Method("predict", model=self.model_of))})

