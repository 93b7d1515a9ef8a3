"""TensorFlow Serving's protocol, so unchanged TF Serving clients and tooling work.

* REST: ``/v1/models/{name}[/versions/{v}|/labels/{l}]:predict|classify|regress`` and the status
  and metadata routes (:mod:`.rest_routes`, :mod:`.rest_predict`); the JSON codec
  (:mod:`.rest_json` and its parts, :mod:`.rest_json_encode`, :mod:`.rest_examples`).
* gRPC: ``tensorflow.serving.PredictionService`` and ``ModelService`` (:mod:`.grpc_service`),
  ``TensorProto`` <-> numpy (:mod:`.tensor_proto`), TensorFlow's profiler service
  (:mod:`.profiler`, forwarded outside the interceptor).
* What both share: model status and SignatureDef metadata (:mod:`.status`), Classify / Regress /
  MultiInference (:mod:`.inference`, :mod:`.features`), TF Serving's message classes without
  TensorFlow (:mod:`.messages`).
* Its command line, ``tensorflow_model_server`` (:mod:`.cli`, :mod:`.flags`), and its
  text-format files (:mod:`.model_config`, :mod:`.text_protos`; docs/tfserving-dropin.md).

:data:`PROTOCOL` is its registration with the server (:mod:`server.protocols`).
"""

from __future__ import annotations

from ..protocols import Protocol

PREDICTION_SERVICE = "tensorflow.serving.PredictionService"
MODEL_SERVICE = "tensorflow.serving.ModelService"


def _http(app, rt, predict) -> None:
    from .rest_routes import register

    register(app, rt, predict)


def _grpc(rt, admin) -> list:
    from .grpc_service import services

    return services(rt, admin)


def _grpc_raw(rt) -> list:
    from .profiler import ProfilerForward

    return [ProfilerForward(rt).generic_handler()]


PROTOCOL = Protocol("tfserving", http=_http, grpc=_grpc, grpc_raw=_grpc_raw,
                    grpc_health=(PREDICTION_SERVICE, MODEL_SERVICE), http_case_folded=("/v1/models",))
