"""The Open Inference Protocol (KServe v2) over HTTP: the routes, JSON and binary tensors.

``GET /v2`` (server metadata), ``GET /v2/models/{m}[/versions/{v}]`` (model metadata),
``GET /v2/models/{m}/versions/{v}/ready``, ``POST /v2/models/{m}[/versions/{v}]/infer``; the
health routes (``/v2/health/live|ready``, ``/v2/models/{m}/ready``) are the server's probes
(:mod:`server.http.probe_routes`). Infer bodies are JSON, or JSON followed by binary tensor data with an
``Inference-Header-Content-Length`` header (the binary tensor extension: an input with
``parameters.binary_data_size`` takes its bytes from there, in input order; outputs come back
binary when asked for with ``parameters.binary_data`` per output or ``binary_data_output`` for
the request). Errors are ``{"error": message}`` with STATUS_TABLE's status. The protocol itself
is :mod:`server.kserve.open_inference`; inference runs on the model's thread pool.

Request bodies: held against the decode memory budget shared with TF Serving's JSON
(``json_decode_memory_bytes``: 503 + Retry-After while others hold it, 413 if one alone is over
it); JSON-only bodies are limited by ``json_max_request_bytes`` when set (binary ones by
``max_request_bytes``), and a tensor's JSON data by ``json_max_elements``; large JSON is parsed
whole when that budget holds orjson's peak for it, else a run at a time (:mod:`.rest_json`,
:func:`server.http.json_stream.parse_whole`). ``Content-Encoding: gzip`` or ``deflate`` (what
tritonclient's ``request_compression_algorithm`` sends) is inflated with its output counted
against the same body limit (a bomb is a 413); another encoding is a 400 naming it. Versions in
the path are 1 to 19 ASCII digits (else 400); a version that is not the served one is 404 on
every route, readiness included. JSON responses never carry NaN / Infinity (see
:func:`server.kserve.open_inference.json_data`).
"""

from __future__ import annotations

import json
import re
import sys
import zlib
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from processor.memory import trim
from processor.errors import InvalidArgument, PayloadTooLarge
from processor.request import Work

from .. import native_json
from ..http.body import read_body
from ..http.errors import PREDICT_ERRORS, STATUS_ERRORS
from ..http.json_stream import DEFAULT_MAX_ELEMENTS, SMALL_BODY, parse_whole
from ..http.memory_budget import Hold
from ..http.predict import (Later, Now, PredictRoutes, Reply, as_response, error_reply, header, routing_key, tracked,
                            version_header)
from ..runtime import ServingRuntime
from . import open_inference as oip
from . import rest_json
from .rest_prepared import PreparedInfers

HEADER_LENGTH = "inference-header-content-length"
INFER_PATH = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?/infer$")
_MAX_ECHO = 64
_ENCODINGS = {"gzip": 31, "x-gzip": 31, "deflate": 15}  # zlib wbits: gzip header, zlib header
_INFLATE_STEP = 1 << 20  # bytes inflated at a time, each counted against the limit


@dataclass(slots=True)  # not frozen: a frozen one costs 0.3 us more to make, once per request
class BodyLimits:
    """How much one infer body may take: ``limit`` bytes (``setting`` names it), inflated too;
    ``max_elements`` per tensor of JSON data; ``hold``: its share of the decode memory budget."""

    limit: int
    setting: str = "max_request_bytes"
    max_elements: int = DEFAULT_MAX_ELEMENTS
    hold: Hold | None = None


# The OpenAPI description of the routes' answers (the errors: server/http/errors.py's)
_JSON = "application/json"
_SERVER_200 = {"description": "the server's metadata: name, version, the protocol extensions it serves",
               "content": {_JSON: {"example": {"name": "serving-processor", "version": "0.1.0",
                                               "extensions": ["binary_tensor_data", "model_repository"]}}}}
_MODEL_200 = {"description": "the model's metadata: name, the versions served, platform, and the inputs and "
                             "outputs (name, datatype, shape) of the signature of the version named (none: "
                             "the default version)",
              "content": {_JSON: {"example": {
                  "name": "m", "versions": ["1"], "platform": "tensorflow_savedmodel",
                  "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 1]}],
                  "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 1]}]}}}}
_READY = {200: {"description": "the version serves: {\"name\", \"ready\": true}",
                "content": {_JSON: {"example": {"name": "m", "ready": True}}}},
          503: {"description": "the version is not ready (the model loading, failed, or the server "
                               "draining): {\"name\", \"ready\": false}",
                "content": {_JSON: {"example": {"name": "m", "ready": False}}}}}
_INFER_200 = {"description": "the outputs: JSON {\"model_name\", \"model_version\", \"outputs\", \"id\"}, or "
                             "with binary outputs (application/octet-stream) that JSON followed by the "
                             "tensors' bytes, its length in Inference-Header-Content-Length",
              "content": {_JSON: {}, "application/octet-stream": {}},
              "headers": {"X-Model-Version": {"description": "the version that answered",
                                              "schema": {"type": "integer"}},
                          "Inference-Header-Content-Length": {
                              "description": "with binary outputs: the length of the JSON before them",
                              "schema": {"type": "integer"}}}}
_INFER_BODY = {"requestBody": {"description": "JSON {\"inputs\": [{\"name\", \"datatype\", \"shape\", \"data\"}], "
                                              "\"outputs\"?, \"parameters\"?}, or that JSON followed by binary "
                                              "tensor data (its length in Inference-Header-Content-Length)",
                               "content": {_JSON: {"schema": {"type": "object"}},
                                           "application/octet-stream": {"schema": {"type": "string",
                                                                                   "format": "binary"}}}}}


def register(app, rt: ServingRuntime, routes: PredictRoutes) -> None:
    """Add the v2 routes to ``app`` and ``infer`` to ``routes`` (the HTTP fast path, whose body
    limits and decode memory budget v2 shares with TF Serving's JSON)."""

    @app.get("/v2", tags=["kserve-v2"], summary="Server metadata (Open Inference Protocol)",
             responses={200: _SERVER_200})
    async def v2_server() -> dict:
        return oip.server_metadata()

    def metadata(model: str, version: str | None) -> Response:
        try:
            return JSONResponse(oip.model_metadata(rt, model, version))
        except Exception as exc:
            return _error(exc)

    @app.get("/v2/models/{model}", tags=["kserve-v2"], summary="Model metadata",
             responses={200: _MODEL_200, **STATUS_ERRORS})
    async def v2_model(model: str, request: Request) -> Response:
        # a ?version= query names the version too (as it always did; not part of the protocol)
        return metadata(model, request.query_params.get("version"))

    @app.get("/v2/models/{model}/versions/{version}", tags=["kserve-v2"], summary="Model metadata of a version",
             responses={200: _MODEL_200, **STATUS_ERRORS})
    async def v2_model_version(model: str, version: str) -> Response:
        return metadata(model, version)

    @app.get("/v2/models/{model}/versions/{version}/ready", tags=["kserve-v2"],
             summary="One model version's readiness", responses={**STATUS_ERRORS, **_READY})
    async def v2_version_ready(model: str, version: str) -> Response:
        try:  # a version that is not served: 404, as metadata and infer answer
            ok = oip.model_ready(rt, model, version)
        except Exception as exc:
            return _error(exc)
        return JSONResponse({"name": model, "ready": ok}, status_code=200 if ok else 503)

    prepared = PreparedInfers()  # the binary request forms seen before (:mod:`.rest_prepared`)

    def body_limit(header_length: str | None) -> tuple[int, str]:
        """A body's size limit and the setting that names it: a JSON body (no binary header)
        has the JSON limit, a binary one ``max_request_bytes``."""
        return ((routes.json_limit, routes.json_setting) if header_length is None
                else (routes.limit, "max_request_bytes"))

    async def infer(match: re.Match, receive, headers: list) -> Reply:
        """POST .../infer, answered before routing (PredictRoutes' fast path; the FastAPI routes
        below document it)."""
        model, version = match.group(1), match.group(2)  # an ASGI path is percent-decoded already

        async def work() -> Reply:
            deadline = routes.deadline(headers)
            header_length = header(headers, b"inference-header-content-length")
            encoding = _encoding(header(headers, b"content-encoding"))
            limit, setting = body_limit(header_length)
            with routes.json_budget.hold() as hold:
                body = await read_body(receive, headers, limit, hold, setting)
                limits = BodyLimits(limit, setting, routes.json_max_elements, hold)
                args = (rt, model, version, body, header_length, deadline, limits, encoding, prepared,
                        routing_key(headers))
                size = len(body) if encoding is None else sys.maxsize  # inflated, it may be any size: never in place
                return await rt.dispatch(Work(model, size, infer_http, args))
        return await tracked(rt, model, "v2_infer", work, error_reply)

    def lean_infer(match: re.Match, headers: list, length: int) -> Now | Later | None:
        """:func:`infer` on the HTTP connection's lean path (``PredictRoutes.lean_admit``): a body
        sent as it is, within its limit."""
        model, version = match.group(1), match.group(2)
        header_length = header(headers, b"inference-header-content-length")
        limit, setting = body_limit(header_length)
        if header(headers, b"content-encoding") is not None or length > limit:
            return None

        return routes.budgeted(model, "v2_infer", length, lambda body, deadline, hold, key: infer_http(
            rt, model, version, body, header_length, deadline,
            BodyLimits(limit, setting, routes.json_max_elements, hold), None, prepared, key))

    routes.add(INFER_PATH.match, infer, lean_infer, "/v2/models/")

    # RequestContext answers these requests itself (PredictRoutes); these routes document them
    @app.post("/v2/models/{model}/infer", tags=["kserve-v2"], summary="Inference",
              openapi_extra=_INFER_BODY, responses={200: _INFER_200, **PREDICT_ERRORS})
    async def v2_infer(model: str, request: Request) -> Response:
        m = INFER_PATH.match(request.scope["path"])
        return as_response(await infer(m, request.receive, request.scope["headers"]))

    @app.post("/v2/models/{model}/versions/{version}/infer", tags=["kserve-v2"], summary="Inference on a version",
              openapi_extra=_INFER_BODY, responses={200: _INFER_200, **PREDICT_ERRORS})
    async def v2_infer_version(model: str, version: str, request: Request) -> Response:
        m = INFER_PATH.match(request.scope["path"])
        return as_response(await infer(m, request.receive, request.scope["headers"]))


def _error(exc: BaseException) -> Response:
    return as_response(error_reply(exc))


def _encoding(value: str | None) -> int | None:
    """The zlib ``wbits`` of a Content-Encoding (None: identity); InvalidArgument naming another."""
    name = (value or "identity").strip().lower()
    if name == "identity":
        return None
    if name not in _ENCODINGS:
        raise InvalidArgument(f"Content-Encoding {oip.echo(value)} is not supported; send the body "
                              f"as it is, or gzip or deflate")
    return _ENCODINGS[name]


def inflate(body: bytes | bytearray, wbits: int, limits: BodyLimits) -> bytearray:
    """A gzip / deflate body, inflated a step at a time: PayloadTooLarge as soon as it grows over
    ``limits.limit`` (the memory budget held for its size as it grows); InvalidArgument when it
    is not such data."""
    kind = "gzip" if wbits > 15 else "deflate"
    inflater = zlib.decompressobj(wbits)
    out = bytearray()
    data: bytes | bytearray | memoryview = body
    try:
        while data:
            out += inflater.decompress(data, _INFLATE_STEP)
            if len(out) > limits.limit:
                raise PayloadTooLarge(f"the request body inflates to more than {limits.limit} bytes "
                                      f"({limits.setting})")
            if limits.hold is not None:
                limits.hold.need(len(out))
            data = inflater.unconsumed_tail
        out += inflater.flush()
    except zlib.error as exc:
        raise InvalidArgument(f"the request body is not valid {kind} data: "
                              f"{oip.echo(str(exc))}") from None
    if not inflater.eof or inflater.unused_data:
        raise InvalidArgument(f"the {kind} request body is truncated or has bytes after its end")
    if len(out) > limits.limit:
        raise PayloadTooLarge(f"the request body inflates to more than {limits.limit} bytes ({limits.setting})")
    return out


def infer_http(rt: ServingRuntime, model: str, version: str | None, body: bytes | bytearray,
               header_length: str | None, deadline: float | None, limits: BodyLimits | None = None,
               encoding: int | None = None, prepared: PreparedInfers | None = None,
               key: str | None = None) -> Reply:
    """One v2 infer request (on the model's thread pool): body in, reply out, with
    ``X-Model-Version``. ``encoding``: the zlib ``wbits`` of a compressed body
    (:func:`_encoding`); ``prepared``: the binary request forms seen before
    (:mod:`.rest_prepared`), None to answer every request the ordinary way; ``key``: the call's
    routing key (a prepared form never meets a traffic split: ``DataPlane.prepares``)."""
    limits = limits or BodyLimits(rt.deployment.max_request_bytes)
    size = len(body)
    try:
        if encoding is not None:
            body = inflate(body, encoding, limits)
        if prepared is not None and header_length is not None:
            reply = prepared.answer(rt, model, version, body, header_length, deadline)
            if reply is not None:
                return reply
        return _infer(rt, model, version, body, header_length, deadline, limits, prepared, key)
    finally:
        if max(size, len(body)) > SMALL_BODY:
            trim()  # hand the freed decode memory back to the OS


def _infer(rt: ServingRuntime, model: str, version: str | None, body: bytes | bytearray,
           header_length: str | None, deadline: float | None, limits: BodyLimits,
           prepared: PreparedInfers | None = None, key: str | None = None) -> Reply:
    doc, binary = _split_body(body, header_length, limits.hold)
    if doc is None:  # the raw form: the body is the model's only input, every output binary
        inputs, wanted, binary_out = [oip.raw_input(rt, model, version, binary)], [], {"*": True}
        doc, prepared = {}, None
    else:
        inputs = _inputs(doc, binary)
        wanted, binary_out = _outputs(doc)
    charge = limits.hold.charge if limits.hold is not None else None
    learn = prepared is not None and header_length is not None and prepared.may_learn(rt, model, doc, inputs)
    number, outputs, form = oip.infer(rt, model, version, inputs, [name for name, _ in wanted] if wanted else None,
                                      deadline, limits.max_elements, charge, key, prepare=learn)
    if learn:
        prepared.learn(model, version, bytes(body[:len(body) - len(binary)]), form, inputs, binary_out, number,
                       outputs)
    out_json, blobs = [], []
    for name, array in outputs.items():
        tensor = {"name": name, "datatype": oip.datatype_of(array), "shape": list(array.shape)}
        if binary_out.get(name, binary_out.get("*", False)):
            raw = oip.raw_bytes(array)
            tensor["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
            out_json.append(_dumps(tensor))
        else:
            data = native_json.numbers(array.reshape(-1))  # json_data's list, written natively
            if data is None:
                tensor["data"] = oip.json_data(name, array)
                out_json.append(json.dumps(tensor, allow_nan=False).encode())
            else:  # json.dumps(tensor) with its last member written already
                out_json.append(_dumps(tensor)[:-1] + b', "data": ' + data + b"}")
    request_id = doc.get("id")
    header = b'{"model_name": %s, "model_version": %s, "outputs": [%s]%s}' % (
        _dumps(model), _dumps(number), b", ".join(out_json),
        b', "id": ' + _dumps(request_id) if isinstance(request_id, str) else b"")
    if not blobs:
        return Reply(200, header, headers=(version_header(number),))
    return Reply(200, header + b"".join(blobs), "application/octet-stream",
                 ((HEADER_LENGTH.encode(), str(len(header)).encode()), version_header(number)))


def _dumps(value: Any) -> bytes:
    """``json.dumps(value)`` (no float in it): a piece of an infer response, which is the json
    module's text of ``{"model_name", "model_version", "outputs": [tensors], "id"?}``."""
    return json.dumps(value).encode()


def _split_body(body: bytes | bytearray, header_length: str | None,
                hold: Hold | None = None) -> tuple[dict | None, memoryview]:
    """(the JSON header, the binary part after it); (None, the body) for the raw form
    (``Inference-Header-Content-Length: 0``: no JSON header, :data:`~server.kserve.open_inference.RAW_FORM`).
    The JSON is parsed whole or a run at a time as :func:`server.http.json_stream.parse_whole`
    says (``hold``: the request's share of the decode memory budget)."""
    view = memoryview(body)
    if header_length is None:
        json_part, binary = view, view[len(view):]
    else:
        try:
            n = int(header_length)
        except ValueError:
            n = -1
        if not 0 <= n <= len(body):
            raise InvalidArgument(f"Inference-Header-Content-Length: expected a length within the body "
                                  f"({len(body)} bytes), got {header_length[:_MAX_ECHO]!r}")
        if n == 0:
            return None, view
        json_part, binary = view[:n], view[n:]
    return rest_json.parse(json_part, whole=parse_whole(len(json_part), hold)), binary


def _inputs(doc: dict, binary: memoryview) -> list[oip.InferInput]:
    items = doc.get("inputs")
    if not isinstance(items, list) or not items:
        raise InvalidArgument("'inputs' must be a non-empty array of tensors")
    out, at = [], 0
    for item in items:
        if not isinstance(item, dict):
            raise InvalidArgument("each input must be an object with name, shape, datatype and data")
        name, datatype, shape = item.get("name"), item.get("datatype"), item.get("shape")
        if not isinstance(name, str) or not isinstance(datatype, str) or not isinstance(shape, list):
            raise InvalidArgument("each input needs 'name' (string), 'datatype' (string) and 'shape' (array)")
        params = item.get("parameters") or {}
        size = params.get("binary_data_size") if isinstance(params, dict) else None
        if size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0 or at + size > len(binary):
                raise InvalidArgument(f"input {oip.echo(name)}: binary_data_size {oip.echo(size)} does not "
                                      f"fit the {len(binary) - at} binary bytes left")
            out.append(oip.InferInput(name, datatype, tuple(shape), raw=binary[at:at + size]))
            at += size
        else:
            out.append(oip.InferInput(name, datatype, tuple(shape), data=item.get("data")))
    if at != len(binary):
        raise InvalidArgument(f"{len(binary) - at} binary bytes after the last input's binary data")
    return out


def _outputs(doc: dict) -> tuple[list[tuple[str, bool]], dict[str, bool]]:
    """The requested outputs (name, binary) and which come back binary (``"*"``: every one)."""
    params = doc.get("parameters") or {}
    binary = {"*": bool(params.get("binary_data_output", False))} if isinstance(params, dict) else {}
    items = doc.get("outputs")
    if items is None:
        return [], binary
    if not isinstance(items, list):
        raise InvalidArgument("'outputs' must be an array of {\"name\": ...}")
    wanted = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise InvalidArgument("each requested output needs a 'name' (string)")
        p = item.get("parameters") or {}
        flag = bool(p.get("binary_data", binary.get("*", False))) if isinstance(p, dict) else binary.get("*", False)
        binary[item["name"]] = flag
        wanted.append((item["name"], flag))
    return wanted, binary
