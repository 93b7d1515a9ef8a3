"""Reading a request body under the configured size limit (413 above it)."""

from __future__ import annotations

from starlette.requests import ClientDisconnect, Request

from processor.errors import InvalidArgument, PayloadTooLarge

# After refusing a body we keep reading (and dropping) up to this many times the limit, so a
# client that sends the whole body before reading the response still gets the 413.
_DISCARD_FACTOR = 4


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body; PayloadTooLarge (413) when it is over ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise InvalidArgument(f"bad Content-Length header {declared!r}") from None
        if size > limit:
            await _discard(request, limit * _DISCARD_FACTOR)
            raise PayloadTooLarge(f"request body of {size} bytes is over the limit of {limit} bytes "
                                  f"(max_request_bytes)")
    chunks: list[bytes] = []
    received = 0
    try:
        async for chunk in request.stream():
            received += len(chunk)
            if received > limit:
                await _discard(request, limit * _DISCARD_FACTOR)
                raise PayloadTooLarge(f"request body is over the limit of {limit} bytes "
                                      f"(max_request_bytes)")
            chunks.append(chunk)
    except ClientDisconnect:
        raise InvalidArgument("the client closed the connection before sending the whole body") from None
    return b"".join(chunks)


async def _discard(request: Request, budget: int) -> None:
    try:
        async for chunk in request.stream():
            budget -= len(chunk)
            if budget <= 0:
                return
    except (ClientDisconnect, RuntimeError):  # RuntimeError: stream already consumed
        return
