"""Paths and URLs made safe to show: in model info, logs and error messages.

Its own module (imports nothing of the processor) so that any layer can use it.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def redact_url(path: str) -> str:
    """Drop credentials (``user:secret@``) and query strings from a URL; plain paths unchanged."""
    if "://" not in path:
        return path
    parts = urlsplit(path)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))
