"""KServe v2's model repository extension over HTTP, as Triton serves it (tritonclient's
``get_model_repository_index``, ``load_model``, ``unload_model``):

* ``POST /v2/repository/index``, body optional ``{"ready": true}`` (only the ready ones): a JSON
  list of ``{"name", "version", "state", "reason"}``;
* ``POST /v2/repository/models/{m}/load``, body optional
  ``{"parameters": {"config": "<the model_config as a JSON string>"}}`` (Triton's override
  form): with it, that model served under that name; without, the known entry of that name
  loaded again;
* ``POST /v2/repository/models/{m}/unload``: the model no longer served.

The logic is :mod:`server.repository`'s. Admin actions: behind the admin gate
(:func:`server.http.admin.guarded`: 401 / 403, each call logged with the caller), run on the
default executor. Errors are ``{"error": message}`` with STATUS_TABLE's status (a bad body or
config 400 naming the key, an unknown model 404, a load that failed its error's status).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from processor.config_text import parse_json
from processor.errors import InvalidArgument

from .. import repository
from ..http.admin import AdminGate, guarded
from ..http.errors import ADMIN_ERRORS
from ..http.json_stream import check_depth
from ..runtime import ServingRuntime
from . import open_inference as oip


def register(app: FastAPI, rt: ServingRuntime) -> None:
    """Add the repository routes to ``app``, behind the deployment's admin gate."""
    gate = AdminGate.of(rt)

    @app.post("/v2/repository/index", tags=["kserve-v2"], responses=ADMIN_ERRORS,
              summary="Every model the server knows, and its state (admin)")
    async def repository_index(request: Request) -> Response:
        data = await request.body()

        def index(caller: str) -> list[dict[str, str]]:
            ready = _body(data).get("ready", False)
            if not isinstance(ready, bool):
                raise InvalidArgument(f"ready: expected true or false, got {oip.echo(ready)}")
            return repository.index(rt, ready)
        return await guarded(gate, request, "repository index", "*", index)

    @app.post("/v2/repository/models/{model}/load", tags=["kserve-v2"], responses=ADMIN_ERRORS,
              summary="Load a model: the one known by that name, or the model_config given (admin)")
    async def repository_load(model: str, request: Request) -> Response:
        data = await request.body()

        def load(caller: str) -> dict[str, Any]:
            config = oip.load_config(_parameters(_body(data)))
            return repository.load(rt, model, config, caller)
        return await guarded(gate, request, "repository load", model, load)

    @app.post("/v2/repository/models/{model}/unload", tags=["kserve-v2"], responses=ADMIN_ERRORS,
              summary="Unload a model (admin)")
    async def repository_unload(model: str, request: Request) -> Response:
        data = await request.body()

        def unload(caller: str) -> dict[str, Any]:
            _parameters(_body(data))  # checked; unload_dependents has nothing to do here
            return repository.unload(rt, model, caller)
        return await guarded(gate, request, "repository unload", model, unload)


def _body(data: bytes) -> dict[str, Any]:
    """A request's JSON object; an empty body is ``{}``."""
    if not data.strip():
        return {}
    check_depth(data)
    doc = parse_json(data, "request body")  # ConfigError (400) saying what is wrong
    if not isinstance(doc, dict):
        raise InvalidArgument(f"request body: expected a JSON object, got {type(doc).__name__}")
    return doc


def _parameters(doc: dict[str, Any]) -> dict[str, Any]:
    parameters = doc.get("parameters", {})
    if not isinstance(parameters, dict):
        raise InvalidArgument(f"parameters: expected a JSON object, got {type(parameters).__name__}")
    return parameters
