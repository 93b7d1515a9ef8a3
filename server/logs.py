"""Structured logs: one JSON object per line, with the request id of the request being served.

The request id comes from the caller (HTTP ``X-Request-ID`` header, gRPC ``x-request-id``
metadata) or is generated; it is echoed back and attached to every log record emitted while the
request is handled (a :mod:`contextvars` variable, so it follows asyncio tasks and is copied into
the worker thread that runs the model).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import random
import re
import sys
import time

from processor.request import request_id_var  # one variable: prediction logs record it too

_VALID_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
_PLAIN = re.compile(r"[A-Za-z0-9._:\-]*\Z")
_STD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "color_message"}  # uvicorn adds color_message for its terminal formatter


# Generated ids: a random per-process prefix and a counter, 16 hex digits (uuid4 reads the OS's
# random source on every request: ~5% of a batch-1 request's edge time). Unique within a process,
# and across processes but for a 2**-32 chance of equal prefixes.
def _seed() -> None:
    global _PREFIX, _NEXT
    _PREFIX, _NEXT = os.urandom(4).hex(), itertools.count(random.getrandbits(32))


_seed()
os.register_at_fork(after_in_child=_seed)  # a forked worker draws its own prefix


def new_request_id(given: str | None = None) -> str:
    """The caller's id if it is sane (printable, short), else a fresh one (16 hex digits)."""
    if given and _VALID_ID.match(given):
        return given
    return f"{_PREFIX}{next(_NEXT) & 0xFFFFFFFF:08x}"


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "msg", "request_id", ...extra fields}`` on one line; with
    ``worker`` set (a worker process's pid), every line ends with ``"worker"``."""

    worker: int | None = None

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": _timestamp(record.created, int(record.msecs)),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        rid = getattr(record, "request_id", None) or request_id_var.get()
        if rid != "-":
            out["request_id"] = rid
        for key, value in record.__dict__.items():
            if key not in _STD_ATTRS and key not in out and not key.startswith("_"):
                out[key] = value
        if self.worker is not None:
            out["worker"] = self.worker
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)

    def access_lines(self, created: float, lines: list[tuple]) -> str:
        """What :meth:`format` makes of the access log's records of successful requests
        (:mod:`server.access_log`: ``(protocol, api, model, version, seconds, request_id)``
        each) created at ``created``, one per line, without the records: the same keys in the
        same order. The parts a model's lines share are encoded once per call (a drain writes
        thousands of lines a second under load, on the server's CPU)."""
        ts = json.dumps(_timestamp(created, int(created * 1000) % 1000))
        end = "}\n" if self.worker is None else f', "worker": {self.worker}}}\n'
        shared: dict[tuple, tuple[str, str]] = {}
        context_id = None
        out = []
        for protocol, api, model, version, seconds, request_id in lines:
            key = (protocol, api, model, version)
            parts = shared.get(key)
            if parts is None:
                msg = json.dumps(f"{protocol} {api} {model} -> OK")
                parts = shared[key] = (
                    f'{{"ts": {ts}, "level": "INFO", "logger": "server.access", "msg": {msg}',
                    f', "model": {json.dumps(model)}, "version": {json.dumps(version)}, '
                    f'"protocol": {json.dumps(protocol)}, "api": {json.dumps(api)}, "code": "OK", "ms": ')
            head, tail = parts
            rid = request_id
            if not rid:  # as format(): the id of the context the line is written in
                rid = context_id = request_id_var.get() if context_id is None else context_id
            ms = repr(round(seconds * 1000, 3))  # json.dumps writes a float as its repr
            if rid != "-":
                out.append(f'{head}, "request_id": {_json_str(rid)}{tail}{ms}{end}')
            else:  # no id: format() adds the key last, from the record's own field
                out.append(f'{head}{tail}{ms}, "request_id": {_json_str(request_id)}{end}')
        return "".join(out)


def _json_str(text: str) -> str:
    """``json.dumps(text)``; a plain id (letters, digits, ``._:-``) without the call."""
    return f'"{text}"' if _PLAIN.match(text) else json.dumps(text)


def _timestamp(created: float, msecs: int) -> str:
    """A record's ``ts``: UTC, milliseconds, ``Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{msecs:03d}Z"


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        if not hasattr(record, "request_id"):
            record.request_id = request_id_var.get()
        return super().format(record)


def configure_logging(fmt: str = "json", level: str = "INFO") -> None:
    """Route the root logger (and uvicorn's) to stderr in the chosen format."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers = []
        lg.propagate = True
    # uvicorn's own access log is replaced by ours (it has no request id)
    logging.getLogger("uvicorn.access").disabled = True
