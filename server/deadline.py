"""Request deadlines from the transports, as ``time.monotonic()`` values for the DataPlane.

* gRPC: the call's own deadline (``context.time_remaining()``).
* HTTP: the ``X-Request-Timeout-Ms`` header, milliseconds from the request's arrival (a number
  > 0; anything else is a 400 naming the header); without it, the deployment's
  ``http_request_timeout_ms`` (TF Serving's ``--rest_api_timeout_in_ms``) when set.

A request whose deadline passes while it waits for a batch is answered DEADLINE_EXCEEDED / 504
without running. None: no deadline.
"""

from __future__ import annotations

import math
import time

from processor.errors import InvalidArgument

TIMEOUT_HEADER = b"x-request-timeout-ms"
_NO_DEADLINE = 1e8  # seconds; more than three years


def from_http_headers(headers: list[tuple[bytes, bytes]], default_ms: int | None = None) -> float | None:
    """The deadline an HTTP request asks for (ASGI headers: lower-case names), else
    ``default_ms`` from now, else None."""
    for name, value in headers:
        if name == TIMEOUT_HEADER:
            try:
                ms = float(value)
            except ValueError:
                ms = math.nan
            if not (ms > 0 and math.isfinite(ms)):
                raise InvalidArgument(f"X-Request-Timeout-Ms: expected a number of milliseconds > 0, "
                                      f"got {value[:64].decode('latin-1')!r}")
            return time.monotonic() + ms / 1000.0
    return None if default_ms is None else time.monotonic() + default_ms / 1000.0


def from_grpc(context) -> float | None:
    """The deadline of a gRPC call, or None when the client set none."""
    remaining = context.time_remaining()
    if remaining is None or remaining > _NO_DEADLINE:  # grpcio reports "none" as a huge value
        return None
    return time.monotonic() + remaining
