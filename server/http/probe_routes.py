"""Probes and metrics: ``/healthz`` and ``/v2/health/live`` (liveness), ``/readyz`` and
``/v2/health/ready`` (every model loaded and warm, not draining; the versions each serves),
``/v2/models/{name}/ready``;
Prometheus at ``/metrics`` and TF Serving's ``/monitoring/prometheus/metrics`` (and at the
deployment's ``prometheus_path``, a TF Serving MonitoringConfig's path, when set); ``/`` names
the service and its models."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from processor.errors import ProcessorError

from ..metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE
from ..runtime import ServingRuntime
from .errors import INFO_ERRORS, error_response


_JSON = "application/json"
# The OpenAPI description of the probes' answers (each path its own: KServe v2's paths too)
_LIVE = {200: {"description": "the server is up: {\"live\": true}",
               "content": {_JSON: {"example": {"live": True}}}}}
_READY = {200: {"description": "every model loaded and warm, the server not draining: {\"ready\": true, "
                               "\"draining\", \"models\": state per model, \"versions\": served versions per model}",
                "content": {_JSON: {"example": {"ready": True, "draining": False, "models": {"m": "ready"},
                                                "versions": {"m": [1]}}}}},
          503: {"description": "a model not ready, or the server draining: the same body with "
                               "\"ready\": false and \"error\" saying which",
                "content": {_JSON: {"example": {"ready": False, "draining": False, "models": {"m": "loading"},
                                                "versions": {"m": []}, "error": "models not ready: m: loading"}}}}}
_MODEL_READY = {**INFO_ERRORS,
                200: {"description": "the model serves: {\"name\", \"ready\": true, \"state\"}",
                      "content": {_JSON: {"example": {"name": "m", "ready": True, "state": "ready"}}}},
                503: {"description": "the model is not ready (loading, failed, or the server draining): "
                                     "{\"name\", \"ready\": false, \"state\", \"error\"}",
                      "content": {_JSON: {"example": {"name": "m", "ready": False, "state": "loading",
                                                      "error": "model 'm' is loading"}}}}}


def register(app: FastAPI, rt: ServingRuntime) -> None:
    """Add the probe routes to ``app`` (KServe v2's health paths among them: every protocol's
    clients probe the same readiness)."""

    @app.get("/healthz", tags=["health"], summary="Liveness", responses=_LIVE)
    @app.get("/v2/health/live", tags=["health", "kserve-v2"], summary="Liveness (KServe v2 path)", responses=_LIVE)
    async def live() -> dict:
        return {"live": True}

    @app.get("/readyz", tags=["health"], summary="Readiness: every model loaded and warm", responses=_READY)
    @app.get("/v2/health/ready", tags=["health", "kserve-v2"], summary="Readiness (KServe v2 path)",
             responses=_READY)
    async def ready() -> JSONResponse:
        states, readiness = rt.states(), rt.readiness()
        body: dict[str, Any] = {"ready": rt.ready, "draining": rt.gate.draining, "models": states,
                                "versions": {m.name: [v.number for v in m.served_versions()] for m in rt.models}}
        if not body["ready"]:
            waiting = [f"{n}: {s}" for n, s in states.items() if not readiness[n]]
            body["error"] = ("server is shutting down" if rt.gate.draining
                             else f"models not ready: {', '.join(waiting)}")
            return JSONResponse(body, status_code=503)
        return JSONResponse(body)

    @app.get("/v2/models/{model}/ready", tags=["health", "kserve-v2"], summary="One model's readiness",
             responses=_MODEL_READY)
    async def model_ready(model: str) -> JSONResponse:
        try:
            served, ok = rt.model(model), rt.model_ready(model)
        except ProcessorError as exc:
            return error_response(exc)
        body = {"name": model, "ready": ok, "state": served.state}
        if not ok:
            body["error"] = served.last_error or f"model {model!r} is {served.state}"
        return JSONResponse(body, status_code=200 if ok else 503)


def register_metrics(app: FastAPI, rt: ServingRuntime) -> None:
    """Add Prometheus' routes and the index to ``app``."""

    @app.get("/metrics", tags=["metrics"], summary="Prometheus metrics")
    @app.get("/monitoring/prometheus/metrics", tags=["metrics"], summary="Prometheus metrics (TF Serving path)")
    async def metrics(request: Request) -> Response:
        # a scraper that takes OpenMetrics gets it: the latency exemplars (traced requests' ids)
        if "application/openmetrics-text" in request.headers.get("accept", ""):
            return Response(rt.metrics.render(openmetrics=True), media_type=OPENMETRICS_CONTENT_TYPE)
        return Response(rt.metrics.render(), media_type=METRICS_CONTENT_TYPE)

    extra = getattr(rt.deployment, "prometheus_path", None)
    if extra is not None and extra not in ("/metrics", "/monitoring/prometheus/metrics"):
        app.add_api_route(extra, metrics, methods=["GET"], include_in_schema=False)

    @app.get("/", include_in_schema=False)
    async def index() -> dict:
        return {"service": "serving-processor", "models": rt.models.names,
                "docs": "/docs" if rt.deployment.enable_docs else None}
