"""Our own HTTP protocol: ``POST /api/predict/{model}`` (a serialized ``tensorflow.eas.PredictRequest``
in, ``PredictResponse`` bytes out; an empty body returns the signature JSON, as ``process()``
does), ``GET /api/models`` and ``GET /api/models/{model}`` (model info)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from ..runtime import ServingRuntime
from .errors import INFO_ERRORS, PREDICT_ERRORS, tracked_response
from .predict import PROTOBUF, PredictRoutes, as_response


def register(app: FastAPI, rt: ServingRuntime, predict: PredictRoutes) -> None:
    """Add the routes to ``app``; ``predict``: the hot path's handlers (which answer predict
    requests before routing: the route is there for OpenAPI and calls the same handler)."""

    @app.post("/api/predict/{model}", tags=["processor"], summary="Predict (tensorflow.eas wire format)",
              openapi_extra={"requestBody": {"content": {PROTOBUF: {"schema": {
                  "type": "string", "format": "binary"}}}, "description":
                  "serialized tensorflow.eas.PredictRequest; empty: returns the signature as JSON"}},
              responses={200: {"content": {PROTOBUF: {}}, "description": "serialized PredictResponse"},
                         **PREDICT_ERRORS})
    async def eas_predict(model: str, request: Request) -> Response:
        # RequestContext answers these requests itself (PredictRoutes); this route documents them
        return as_response(await predict.eas(model, request.receive, request.scope["headers"]))

    @app.get("/api/models", tags=["processor"], summary="Served models and their states")
    async def list_models() -> dict:
        return {"models": [{"name": m.name, "state": m.state, "ready": m.ready,
                            "version": rt.version_label(m.name)} for m in rt.models]}

    @app.get("/api/models/{model}", tags=["processor"], summary="Model info", responses=INFO_ERRORS)
    async def model_info(model: str) -> Response:
        async def work() -> Response:
            return JSONResponse(model_details(rt, model))
        return await tracked_response(rt, model, "model_info", work)


def model_details(rt: ServingRuntime, name: str) -> dict:
    """Model info: state, served version, signature, session group, validated config."""
    return rt.model(name).info()
