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
    """``{"ts", "level", "logger", "msg", "request_id", ...extra fields}`` on one line."""

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
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)

    def access_line(self, created: float, model: str, version: str, protocol: str, api: str,
                    seconds: float, request_id: str) -> str:
        """What :meth:`format` makes of the access log's record of a successful request
        (:mod:`server.access_log`) created at ``created``, without the record: the same keys in
        the same order."""
        out = {"ts": _timestamp(created, int(created * 1000) % 1000),
               "level": "INFO", "logger": "server.access", "msg": f"{protocol} {api} {model} -> OK"}
        rid = request_id or request_id_var.get()
        if rid != "-":
            out["request_id"] = rid
        out.update(model=model, version=version, protocol=protocol, api=api, code="OK",
                   ms=round(seconds * 1000, 3))
        out.setdefault("request_id", request_id)
        return json.dumps(out, default=str)


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
