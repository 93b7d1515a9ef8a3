"""Reading a request body from the ASGI ``receive`` channel under the size limit (413 above it)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from processor.errors import InvalidArgument, PayloadTooLarge

Receive = Callable[[], Awaitable[dict]]

# After refusing a body we keep reading (and dropping) up to this many times the limit, so a
# client that sends the whole body before reading the response still gets the 413.
_DISCARD_FACTOR = 4


async def read_body(receive: Receive, headers: Iterable[tuple[bytes, bytes]], limit: int) -> bytes:
    """The whole body; PayloadTooLarge (413) when it is over ``limit`` bytes."""
    for key, value in headers:
        if key == b"content-length":
            try:
                size = int(value)
            except ValueError:
                raise InvalidArgument(f"bad Content-Length header {value[:40]!r}") from None
            if size > limit:
                await _discard(receive, limit * _DISCARD_FACTOR)
                raise PayloadTooLarge(f"request body of {size} bytes is over the limit of {limit} "
                                      f"bytes (max_request_bytes)")
            break
    chunks: list[bytes] = []
    received = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise InvalidArgument("the client closed the connection before sending the whole body")
        chunk = message.get("body", b"")
        received += len(chunk)
        if received > limit:
            await _discard(receive, limit * _DISCARD_FACTOR)
            raise PayloadTooLarge(f"request body is over the limit of {limit} bytes (max_request_bytes)")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _discard(receive: Receive, budget: int) -> None:
    while budget > 0:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return
        budget -= len(message.get("body", b""))
