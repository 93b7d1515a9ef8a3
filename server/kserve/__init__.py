"""KServe v2, the Open Inference Protocol (what Triton and KServe's clients speak).

* The protocol itself, transport-neutral (:mod:`.open_inference`): metadata, readiness,
  datatypes, tensors in and out.
* REST: ``/v2``, ``/v2/models/{m}[/versions/{v}]``, ``.../ready``, ``.../infer`` with JSON and
  binary tensors (:mod:`.rest_routes`; large JSON a run at a time: :mod:`.rest_json`; requests
  of a form seen before: :mod:`.rest_prepared`), and the model repository extension
  (:mod:`.repository_routes`, admin). The health routes ``/v2/health/live|ready`` and
  ``/v2/models/{m}/ready`` are the server's probes (:mod:`server.http.probe_routes`).
* gRPC: ``inference.GRPCInferenceService`` (:mod:`.grpc_service`), the repository methods too.

:data:`PROTOCOL` is its registration with the server (:mod:`server.protocols`).
"""

from __future__ import annotations

from ..protocols import Protocol

SERVICE = "inference.GRPCInferenceService"


def _http(app, rt, predict) -> None:
    from .repository_routes import register as register_repository
    from .rest_routes import register

    register(app, rt, predict)
    register_repository(app, rt)  # the model repository extension (admin)


def _grpc(rt, admin) -> list:
    from .grpc_service import service

    return [service(rt, admin)]


PROTOCOL = Protocol("kserve", http=_http, grpc=_grpc, grpc_health=(SERVICE,))
