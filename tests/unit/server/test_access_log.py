"""server.access_log: lines written off the request thread, batched to the server's JSON handler.

The batched lines equal what ``logging`` and the JsonFormatter make of the same requests (the
reference path, taken under any other logging configuration), key for key and in order."""

from __future__ import annotations

import io
import json
import logging

import pytest

from server import access_log
from server.access_log import AccessLog
from server.logs import JsonFormatter, TextFormatter

REQUESTS = [("http", "predict", "demo", "3", 0.0012345, "abc-1"),
            ("grpc", "tfs.Predict", "m \"quoted\"", "7", 0.5, "-"),
            ("http", "v2.infer", "ünï", "1", 0.0, "")]


@pytest.fixture
def root_handler():
    """The root logger writing to a StringIO through ``formatter`` (restored afterwards)."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level

    def install(formatter):
        stream = io.StringIO()
        handler = logging.StreamHandler(stream)
        handler.setFormatter(formatter)
        root.handlers[:] = [handler]
        root.setLevel(logging.INFO)
        return stream

    yield install
    root.handlers[:], level = saved
    root.setLevel(level)


def written(requests) -> None:
    log = AccessLog(True, 1.0)
    for r in requests:
        log.ok(*r)
    log.close()


def json_formatter(worker: int | None) -> JsonFormatter:
    formatter = JsonFormatter()
    formatter.worker = worker
    return formatter


@pytest.mark.parametrize("worker", [None, 4242])  # a worker process's lines carry its pid
def test_batched_lines_equal_the_logging_path(root_handler, worker):
    stream = root_handler(json_formatter(worker))
    assert access_log._json_stream_sink() is not None
    written(REQUESTS)
    fast = [json.loads(line) for line in stream.getvalue().splitlines()]

    stream = root_handler(json_formatter(worker))
    let_through = logging.Filter()  # a filter on the way: lines go through logging one by one
    access_log.log.addFilter(let_through)
    try:
        assert access_log._json_stream_sink() is None
        written(REQUESTS)
    finally:
        access_log.log.removeFilter(let_through)
    slow = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert len(fast) == len(slow) == len(REQUESTS)
    for a, b in zip(fast, slow):
        assert a.pop("ts")[-1] == "Z" and b.pop("ts")[-1] == "Z"
        assert list(a.items()) == list(b.items())
        assert a.get("worker") == worker and (worker is None or list(a)[-1] == "worker")


def test_other_configurations_go_through_logging(root_handler):
    stream = root_handler(TextFormatter())
    assert access_log._json_stream_sink() is None
    written(REQUESTS[:1])
    assert "http predict demo -> OK" in stream.getvalue()
