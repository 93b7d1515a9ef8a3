"""Config text: JSON read strictly, and the messages a bad config gets.

``parse_json`` / ``read_json_file`` turn text or a file into JSON values with a
:class:`~processor.errors.ConfigError` for what is not UTF-8, not JSON, empty or uses
``NaN``/``Infinity``; ``expect_object``, ``unknown_key_message`` and
``describe_validation_error`` word the errors of a config's keys the one way every config
(the model config, the deployment, the TF Serving files) reports them. Functions only;
thread-safe.
"""

from __future__ import annotations

import difflib
import json
import os
from typing import Any

from pydantic import ValidationError

from .echo import shorten
from .errors import ConfigError


def decode_utf8(data: str | bytes | bytearray | memoryview, what: str) -> str:
    """``data`` as text; ConfigError ``"<what>: not UTF-8 (...)"`` when it is not UTF-8.

    A ``str`` may carry undecodable bytes as lone surrogates (``surrogateescape``, as the C ABI
    passes them): those are refused the same way. A leading byte order mark is dropped.
    """
    if data is None:
        return ""
    if isinstance(data, str):
        try:
            data.encode("utf-8")
            return data.removeprefix("\ufeff")
        except UnicodeEncodeError as exc:
            char = ord(data[exc.start])
            byte = f"byte 0x{char - 0xDC00:02x}" if 0xDC80 <= char <= 0xDCFF else f"U+{char:04X}"
            raise ConfigError(f"{what}: not UTF-8 ({byte} at character {exc.start}); "
                              f"save it as UTF-8") from None
    try:
        return bytes(data).decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what}: not UTF-8 (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); "
                          f"save it as UTF-8") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(text: str | bytes, what: str) -> Any:
    """``json.loads(text)`` of UTF-8 text; ConfigError ``"<what>: empty"``, ``"<what>: not UTF-8
    (...)"`` or ``"<what>: not valid JSON (...)"`` when it is not (``NaN`` and ``Infinity``
    are not JSON and refused)."""
    text = decode_utf8(text, what)
    if not text.strip():
        raise ConfigError(f"{what}: empty; expected a JSON object")
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{what}: not valid JSON ({exc})") from None
    except ValueError as exc:
        raise ConfigError(f"{what}: not valid JSON ({exc})") from None
    except RecursionError:
        raise ConfigError(f"{what}: not valid JSON (nested too deeply)") from None


def read_json_file(path: str | os.PathLike, what: str) -> Any:
    """Read and parse a JSON file: ConfigError (not OSError or UnicodeDecodeError) when it
    cannot be read, is not UTF-8 or is not JSON."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ConfigError(f"{what} {shorten(str(path))}: cannot read ({exc.strerror})") from None
    return parse_json(data, f"{what} {shorten(str(path))}")


def unknown_key_message(key: Any, known: set[str], what: str) -> str:
    """``"<key>: unknown <what> key; did you mean '<close one>'?"`` with the key shortened."""
    hint = difflib.get_close_matches(key, sorted(known), n=1) if isinstance(key, str) and len(key) < 200 else []
    suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
    if not isinstance(key, str):
        shown = shorten(key, 80)
    else:
        shown = key if len(key) <= 80 else f"{key[:80]}... ({len(key)} characters)"
    return f"{shown}: unknown {what} key{suggestion}"


def expect_object(data: Any, what: str) -> None:
    """ConfigError naming ``what`` unless ``data`` is a JSON object (a dict)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{what}: expected a JSON object, got {type(data).__name__}")


def describe_validation_error(exc: ValidationError, prefix: str = "") -> str:
    """One line per problem, each starting with ``prefix`` and the key it concerns.

    Shared with the server's deployment settings (``prefix`` there names the models[] entry).
    """
    lines = []
    errors = exc.errors()
    for err in errors[:_MAX_PROBLEMS]:
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        if not loc:  # model-level validators put the key first in their message
            lines.append(f"{prefix}{shorten_message(msg)}")
        else:
            lines.append(f"{prefix}{shorten_message(loc, 200)}: {shorten_message(msg)} (got {shorten(err.get('input'))})")
    if len(errors) > _MAX_PROBLEMS:
        lines.append(f"{prefix}and {len(errors) - _MAX_PROBLEMS} more problem(s)")
    return "; ".join(lines)


_MAX_PROBLEMS = 5


def shorten_message(msg: str, limit: int = 600) -> str:
    """A validator's message, cut to ``limit`` characters (it may quote the value)."""
    return msg if len(msg) <= limit else f"{msg[:limit]}... ({len(msg)} characters)"
