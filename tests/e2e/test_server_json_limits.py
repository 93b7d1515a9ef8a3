"""TF Serving REST JSON against a real server (``python -m server`` on a 127.0.0.1 port; the toy
model y = 0.5x + 2 and the demo CTR model, which has string inputs).

* A corpus of bad bodies: each a bounded 4xx ``{"error"}``, nothing logged as an internal error,
  and the server answers correctly after each.
* Memory (``slow``): the peak RSS growth of the server process for a 60 MB request (``VmHWM``
  after resetting it through ``/proc/<pid>/clear_refs``) is within 5 x the body; four at once
  stay under ``json_decode_memory_bytes`` (the excess gets 503).
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from pathlib import Path

import pytest

from conftest import model_config

MB = 1 << 20
BODY_BYTES = 60 * MB
BUDGET = 300 * MB  # json_decode_memory_bytes: two 60 MB requests at a time (2 x body + arrays each)
MAX_MESSAGE = 1024


@pytest.fixture(scope="module")
def server(toy_model, ctr_model_small, tmp_path_factory):
    from tools.server_process import ServerProcess

    work = tmp_path_factory.mktemp("json_limits")
    deployment = {
        "models": [{"name": "toy", "model_config": model_config(toy_model)},
                   {"name": "demo", "model_config": model_config(ctr_model_small)}],
        "json_decode_memory_bytes": BUDGET, "access_log": False,
        "body_read_timeout_seconds": 120,
    }
    proc = ServerProcess(deployment, work).start(timeout=180)
    assert proc.wait_models(60) == {"toy": "ready", "demo": "ready"}, proc.log()
    yield proc
    assert proc.stop(timeout=30) == 0, proc.log()


def post(server, body: bytes, path: str = "/v1/models/toy:predict", timeout: float = 120):
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=timeout)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def assert_still_serving(server) -> None:
    status, _, data = post(server, b'{"instances": [[1.0], [-2.0]], "signature_name": "serving_default"}')
    assert (status, json.loads(data)) == (200, {"predictions": [[2.5], [1.0]]})
    status, _, data = post(server, b'{"inputs": {"x": [[4.0]]}}')
    assert (status, json.loads(data)) == (200, {"outputs": [[4.0]]})


# --- the bad-input corpus -------------------------------------------------------------------------

HUGE = "s" * 1_000_000
TOY, DEMO = "/v1/models/toy:predict", "/v1/models/demo:predict"


def demo_row(tokens: str | bytes = '"a", "b", "c", "d", "e", "f"', ids: str = ", ".join(["7"] * 20)) -> bytes:
    """One example for the demo model as JSON text (``tokens`` as bytes: sent as they are)."""
    tokens = tokens if isinstance(tokens, bytes) else tokens.encode()
    return (('{"dense": [' + ", ".join(["1.5"] * 13) + '], "sparse_ids": [' + ids + '], '
             '"sparse_tokens": [').encode() + tokens + b"]}")


# name: (path, body, status)
CORPUS = {
    "lone surrogate, row": (DEMO, b'{"instances": [' + demo_row('"\\udfff", "a", "b", "c", "d", "e"') + b"]}", 400),
    "lone surrogate, columnar": (DEMO, b'{"inputs": {"sparse_tokens": [["a", "\\udc00", "b", "c", "d", "e"]]}}', 400),
    "lone surrogate, high": (DEMO, b'{"instances": [' + demo_row('"\\ud800x", "a", "b", "c", "d", "e"') + b"]}", 400),
    "lone surrogate, input name": (TOY, b'{"inputs": {"\\udfff": [[1.0]]}}', 400),
    # a signature the model does not have: TF Serving's 400 (issue 30)
    "lone surrogate, signature_name": (TOY, b'{"signature_name": "\\ud800", "inputs": [[1.0]]}', 400),
    "[ x 100000": (TOY, b"[" * 100_000, 400),
    '{"a": x 3000': (TOY, b'{"a":' * 3000, 400),
    "deep inside inputs": (TOY, b'{"inputs": ' + b"[" * 100 + b"1" + b"]" * 100 + b"}", 400),
    "invalid UTF-8 in a string": (DEMO, b'{"instances": [' + demo_row(b'"\xff\xfe", "a", "b", "c", "d", "e"') + b"]}", 400),
    "invalid UTF-8 in a key": (TOY, b'{"inst\xc3ances": [[1.0]]}', 400),
    "NaN for an integer input": (DEMO, b'{"instances": [' + demo_row(ids=", ".join(["NaN"] * 20)) + b"]}", 400),
    "Infinity for a string input": (DEMO, b'{"instances": [' + demo_row('Infinity, "a", "b", "c", "d", "e"') + b"]}", 400),
    "bare NaN body": (TOY, b"NaN", 400),
    "broken JSON after NaN": (TOY, b'{"instances": [[NaN]],}', 400),
    "string for a number": (TOY, b'{"instances": [["1.0"]]}', 400),
    "object for a number": (TOY, b'{"instances": [[{"a": 1}]]}', 400),
    "boolean for a number": (TOY, b'{"inputs": [[true]]}', 400),
    "number for a string": (DEMO, b'{"instances": [' + demo_row("1, 2, 3, 4, 5, 6") + b"]}", 400),
    "float for an integer": (DEMO, b'{"instances": [' + demo_row(ids=", ".join(["1.5"] * 20)) + b"]}", 400),
    "integer out of int64 range": (DEMO, b'{"instances": [' + demo_row(ids=", ".join(["18446744073709551615"] * 20)) + b"]}", 400),
    "null": (TOY, b'{"inputs": [[null]]}', 400),
    "ragged": (TOY, b'{"instances": [[1.0], [1.0, 2.0]]}', 400),
    "wrong top level": (TOY, b"[[1.0]]", 400),
    "truncated": (TOY, b'{"instances": [[1.0]', 400),
    "trailing garbage": (TOY, b'{"instances": [[1.0]]} extra', 400),
    "instances not a list": (TOY, b'{"instances": 5}', 400),
    "signature_name a number": (TOY, b'{"signature_name": 5, "instances": [[1.0]]}', 400),
    "huge signature_name": (TOY, json.dumps({"signature_name": HUGE, "instances": [[1.0]]}).encode(), 400),
    "huge input name": (TOY, json.dumps({"inputs": {HUGE: [[1.0]]}}).encode(), 400),
    "huge key in a row": (TOY, json.dumps({"instances": [{"x": [1.0]}, {HUGE: [1.0]}]}).encode(), 400),
    "huge string for a number": (TOY, json.dumps({"inputs": {"x": [[HUGE]]}}).encode(), 400),
    "huge bad base64": (DEMO, b'{"instances": [' + demo_row('{"b64": "' + HUGE + '!"}, "a", "b", "c", "d", "e"') + b"]}", 400),
    "many top-level keys": (TOY, json.dumps({f"k{i}": 0 for i in range(10_000)}).encode(), 400),
    "large body, broken at the end": (TOY, b'{"instances": [' + b"[1.0]," * 100_000 + b"[1.0]]]}", 400),
    "large body, surrogate key at the end": (TOY, b'{"instances": [' + b'{"x": [1.0]},' * 60_000 + b'{"\\udfff": [1.0]}]}', 400),
    "large body, surrogate string at the end": (
        DEMO, b'{"instances": [' + (demo_row() + b",") * 3000 + demo_row('"a", "\\udfff", "b", "c", "d", "e"') + b"]}", 400),
}


@pytest.mark.parametrize("name", list(CORPUS))
def test_bad_json_is_a_bounded_client_error(server, name):
    path, body, expected = CORPUS[name]
    status, _, data = post(server, body, path)
    doc = json.loads(data)
    assert (status, set(doc)) == (expected, {"error"}), (name, status, data[:2000])
    assert len(data) <= MAX_MESSAGE and doc["error"].isprintable(), (name, data[:2000])
    assert_still_serving(server)


def test_nothing_logged_as_an_internal_error(server):
    for path, body, _ in CORPUS.values():
        post(server, body, path)
    log = server.log()
    for marker in ("internal error", "Traceback", "--- Logging error ---", "UnicodeEncodeError",
                   "RecursionError"):
        assert marker not in log, log[-5000:]
    assert max((len(line) for line in log.splitlines()), default=0) <= 4096


# --- memory -------------------------------------------------------------------------------------

def toy_body(size: int) -> tuple[bytes, int]:
    """A TF Serving row-format body of about ``size`` bytes: ``{"instances": [{"x": [v]}, ...]}``,
    every value a float32 printed in full; and how many instances it holds."""
    values = [f'{{"x": [{(i % 1000) * 0.0137 - 6.5!r}]}}'.encode() for i in range(1000)]
    block = b",".join(values)
    reps = max(1, size // (len(block) + 1))
    body = b'{"instances": [' + b",".join([block] * reps) + b"]}"
    return body, reps * 1000


def status_kb(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024
    return fields


def reset_peak(pid: int) -> int:
    """Reset the process's peak RSS (VmHWM) to its current RSS; returns that RSS."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return status_kb(pid)["VmRSS"]


def probe_latency(server, stop: threading.Event, out: list[float]) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
        conn.request("GET", "/healthz")
        conn.getresponse().read()
        conn.close()
        out.append(time.perf_counter() - started)
        time.sleep(0.05)


@pytest.mark.slow
def test_60mb_request_peak_memory_within_5x_body(server):
    body, n = toy_body(BODY_BYTES)
    pid = server.proc.pid
    post(server, toy_body(4 * MB)[0])  # first large request: thread pools, caches warm
    before = reset_peak(pid)
    stop, latencies = threading.Event(), []
    prober = threading.Thread(target=probe_latency, args=(server, stop, latencies))
    prober.start()
    started = time.perf_counter()
    try:
        status, _, data = post(server, body)
    finally:
        stop.set()
        prober.join()
    seconds = time.perf_counter() - started
    growth = status_kb(pid)["VmHWM"] - before
    after = status_kb(pid)["VmRSS"] - before
    print(f"\n{len(body) / MB:.1f} MB body, {n} instances: {seconds:.1f} s, peak RSS growth "
          f"{growth / MB:.0f} MB = {growth / len(body):.2f} x body, left after {after / MB:.0f} MB, "
          f"/healthz worst {max(latencies, default=0) * 1000:.0f} ms over {len(latencies)} probes")
    assert status == 200, data[:1000]
    assert data.startswith(b'{"predictions":[[') and data.count(b"],[") == n - 1
    first = float(data[len(b'{"predictions":[['):data.index(b"]")])
    assert first == pytest.approx(0.5 * -6.5 + 2, rel=1e-6)
    assert growth <= 5 * len(body), f"peak RSS growth {growth / len(body):.2f} x the body"
    assert_still_serving(server)


@pytest.mark.slow
def test_four_60mb_requests_at_once_stay_under_the_budget(server):
    body, _ = toy_body(BODY_BYTES)
    pid = server.proc.pid
    before = reset_peak(pid)
    results: list[tuple[int, dict, bytes]] = []
    lock = threading.Lock()

    def one() -> None:
        got = post(server, body)
        with lock:
            results.append((got[0], got[1], got[2][:300]))

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    growth = status_kb(pid)["VmHWM"] - before
    statuses = sorted(s for s, _, _ in results)
    print(f"\n4 x {len(body) / MB:.0f} MB at once: statuses {statuses}, peak RSS growth "
          f"{growth / MB:.0f} MB (json_decode_memory_bytes {BUDGET / MB:.0f} MB)")
    assert len(results) == 4 and 200 in statuses and set(statuses) <= {200, 503}, results
    assert statuses.count(503) >= 1  # four would need 4 x (2 x 60 MB + 11 MB of arrays)
    for status, headers, data in results:
        if status == 503:
            assert "json_decode_memory_bytes" in json.loads(data)["error"]
            assert headers.get("retry-after", headers.get("Retry-After", "1")) == "1"
    assert growth <= BUDGET, f"peak RSS growth {growth / MB:.0f} MB over the {BUDGET / MB:.0f} MB budget"
    assert_still_serving(server)
