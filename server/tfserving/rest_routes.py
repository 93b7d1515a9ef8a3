"""TensorFlow Serving's REST API: ``POST /v1/models/{name}[/versions/{v}|/labels/{l}]:predict``
(row and columnar JSON, b64), ``:classify`` and ``:regress`` (``examples``, ``context``),
``GET /v1/models/{name}[/versions/{v}|/labels/{l}][/metadata]`` (status, metadata: every
signature); any other ``/v1`` path is TF Serving's "Malformed request". Paths are
case-insensitive, as TF Serving's regexes (the HTTP app folds ``/v1/models``: the protocol's
``http_case_folded``). The inference URLs are answered on the HTTP fast path
(:class:`~server.tfserving.rest_predict.TfsPredict`); their FastAPI route documents them."""

from __future__ import annotations

import re

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from processor.errors import InvalidArgument
from processor.request import parse_version

from ..http.errors import PREDICT_ERRORS, STATUS_ERRORS, error_response, tracked_response
from ..http.predict import PredictRoutes, as_response
from ..runtime import ServingRuntime
from . import status
from .rest_predict import PREDICT_PATH, TfsPredict

STATUS_PATH = re.compile(  # ASCII digits (\d takes "²"); parse_version refuses over int64
    r"^/v1/models(?:/([^/:]+))?(?:/versions/([0-9]+)|/labels/([^/:]+))?(?:/(metadata))?$", re.I)


def register(app: FastAPI, rt: ServingRuntime, predict: PredictRoutes) -> None:
    """Add the routes to ``app`` and the inference URLs to ``predict``, the fast path
    (RequestContext sends them there before routing; other POSTs end in :func:`tfs_post`)."""
    tfs = TfsPredict(predict)
    predict.add(PREDICT_PATH.match, tfs.asgi, tfs.lean)  # no prefix: TF Serving matches paths in any case

    @app.get("/v1/models", tags=["tensorflow-serving"], include_in_schema=False)
    async def tfs_no_model() -> Response:
        return error_response(InvalidArgument("Missing model name in request."))

    @app.post("/v1/models/{path:path}", tags=["tensorflow-serving"],
              summary="TF Serving predict: /v1/models/{name}[/versions/{v}|/labels/{l}]:predict",
              openapi_extra={"requestBody": {"content": {"application/json": {
                  "schema": {"type": "object", "properties": {
                      "signature_name": {"type": "string"},
                      "instances": {"description": "row format: a list, one element per example"},
                      "inputs": {"description": "columnar format: a tensor or {input: tensor}"}}},
                  "example": {"instances": [{"x": [1.0]}]}}}}},
              responses=PREDICT_ERRORS)
    async def tfs_post(path: str, request: Request) -> Response:
        # RequestContext answers predict URLs itself (PredictRoutes); others end here
        return as_response(await tfs.post(request.url.path, request.receive, request.scope["headers"]))

    @app.get("/v1/models/{path:path}", tags=["tensorflow-serving"],
             summary="TF Serving status / metadata: /v1/models/{name}[/versions/{v}|/labels/{l}][/metadata]",
             responses=STATUS_ERRORS)
    async def tfs_get(path: str, request: Request) -> Response:
        m = STATUS_PATH.match(request.url.path)
        if m is None or not m.group(1):
            if m is not None:
                return error_response(InvalidArgument("Missing model name in request."))
            return error_response(InvalidArgument(f"Malformed request: GET {request.url.path}"))
        name, version, label, metadata = m.group(1), m.group(2), m.group(3), m.group(4)

        async def work() -> Response:
            wanted = None if version is None else parse_version(version)
            if metadata:
                return JSONResponse(tfs_metadata(rt, name, wanted, label))
            return JSONResponse(tfs_status(rt, name, wanted, label))
        return await tracked_response(rt, name, "tfs_metadata" if metadata else "tfs_status", work)

    @app.api_route("/v1/{path:path}", methods=["GET", "POST"], include_in_schema=False)
    async def tfs_malformed(path: str, request: Request) -> Response:
        # any other /v1 path: TF Serving's handler owns /v1/.* and answers it so
        return error_response(InvalidArgument(f"Malformed request: {request.method} {request.url.path}"))


# --- handlers (run on the model's thread pool) --------------------------------------------------

def tfs_status(rt: ServingRuntime, name: str, version: int | None, label: str | None) -> dict:
    statuses = status.served_model_status(rt.model(name), version, label)
    return {"model_version_status": [s.as_json() for s in statuses]}


def tfs_metadata(rt: ServingRuntime, name: str, version: int | None, label: str | None) -> dict:
    served = rt.dataplane.served(name, version, label)
    return {"model_spec": {"name": name, "signature_name": "", "version": str(served.version_number)},
            "metadata": status.signature_def_json(served.signatures.values())}
