"""server/http/protocol.py reaches into uvicorn's internals: it runs only on the uvicorn minor
releases it was tested with (``UVICORN_TESTED``), and pyproject.toml pins exactly those."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import uvicorn

from server.http.protocol import UVICORN_TESTED

ROOT = Path(__file__).resolve().parents[3]


def test_the_installed_uvicorn_is_a_tested_release():
    installed = tuple(int(part) for part in uvicorn.__version__.split(".")[:2])
    assert installed in UVICORN_TESTED, (
        f"uvicorn {uvicorn.__version__} is not a release server/http/protocol.py was tested with "
        f"({UVICORN_TESTED}): run the HTTP edge's tests on it, then add it to UVICORN_TESTED and the pin")


def test_pyproject_pins_the_tested_releases():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pins = [d for group in deps.values() for d in group if re.match(r"uvicorn\b", d)]
    assert pins, "uvicorn is not pinned in pyproject.toml"
    for pin in pins:
        low = re.search(r">=\s*(\d+)\.(\d+)", pin)
        high = re.search(r"<\s*(\d+)\.(\d+)", pin)
        assert low and high, pin
        low_t, high_t = (int(low[1]), int(low[2])), (int(high[1]), int(high[2]))
        allowed = {(low_t[0], minor) for minor in range(low_t[1], high_t[1])} if low_t[0] == high_t[0] else None
        assert allowed == set(UVICORN_TESTED), f"{pin} allows other releases than {UVICORN_TESTED}"
