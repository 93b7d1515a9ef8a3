"""A client's value as an error message or a log line repeats it: cut to a bounded length.

Imported by the lowest layers (``request``, ``signature``, ``config``), so it imports nothing of
the processor's own. Pure functions; thread-safe.
"""

from __future__ import annotations

from typing import Any

ECHO_LIMIT = 120  # characters of a value echoed in an error message


def shorten(value: Any, limit: int = ECHO_LIMIT) -> str:
    """``repr(value)``, cut to about ``limit`` characters (with the full length said) so that a
    huge value never comes back whole in an error message or a log line."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f"{len(value)} characters" if isinstance(value, (str, bytes)) else f"{len(text)} characters as text"
    return f"{text[:limit]}... ({size})"


def cut(text: str, limit: int = 80) -> str:
    """A client's name as it is when short (TF Serving's messages show names bare), else
    :func:`shorten`'s cut ``repr``."""
    return text if len(text) <= limit else shorten(text, limit)
