"""Our own protocol (DeepRec / EAS): the serialized ``tensorflow.eas.PredictRequest`` /
``PredictResponse`` wire format, over HTTP (``/api/predict/{model}``..., and the model info
routes ``/api/models``..., :mod:`.rest_routes`) and gRPC (``tensorflow.eas.ProcessorService``,
:mod:`.grpc_service`). The codec itself is the processor's (``processor/codec.py``, the native
one): the body goes to the DataPlane as it came.

:data:`PROTOCOL` is its registration with the server (:mod:`server.protocols`).
"""

from __future__ import annotations

from ..protocols import Protocol

PROCESSOR_SERVICE = "tensorflow.eas.ProcessorService"


def _http(app, rt, predict) -> None:
    from .rest_routes import register

    register(app, rt, predict)


def _grpc(rt, admin) -> list:
    from .grpc_service import ProcessorService

    return [ProcessorService(rt).service()]  # no admin method


PROTOCOL = Protocol("eas", http=_http, grpc=_grpc, grpc_health=(PROCESSOR_SERVICE,))
