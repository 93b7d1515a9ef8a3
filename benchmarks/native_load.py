"""Native load generators for the server benchmarks: ``wrk`` (HTTP/1.1) and ``h2load`` (gRPC over
h2c), Debian packages ``wrk`` and ``nghttp2-client`` (``scripts/setup.sh`` installs them where it
can). Neither runs Python, so the client does not take the cores the server is measured on.

Each run: a warmup, then a timed run; the server's CPU time (user + system of its process and
its children, from ``/proc/<pid>/stat``) is read around the timed run, so the figure is server
CPU per request, whatever else the machine runs; so are its context switches (its live threads'
and its worker processes', from ``/proc/<pid>/task/*/status``). Returns req/s, p50/p99 latency
(ms), ``cpu_us_per_request``, ``voluntary_cs_per_request`` and ``involuntary_cs_per_request``;
``errors`` counts non-2xx answers (wrk) or failed requests (h2load). A gRPC error travels in
the trailers of an HTTP/2 200, which h2load counts as a success: given our server's ``/metrics``
URL, h2load adds the failed gRPC calls the server counted during the timed run.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import tempfile
import urllib.request
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")

WRK_SCRIPT = """
local f = io.open(os.getenv("SP_BODY"), "rb"); wrk.body = f:read("*a"); f:close()
wrk.method = "POST"
for header in string.gmatch(os.getenv("SP_HEADERS") or "", "[^\\n]+") do
  local k, v = header:match("^([^:]+):%s*(.*)$")
  wrk.headers[k] = v
end
"""


def available() -> dict[str, bool]:
    return {"wrk": shutil.which("wrk") is not None, "h2load": shutil.which("h2load") is not None}


def _tree(pid: int) -> dict[int, list[str]]:
    """The ``/proc/<p>/stat`` fields (after the name) of ``pid`` and its live descendants (a
    server's worker processes), by pid."""
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stats[int(entry.name)] = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # gone meanwhile
                continue
    tree, found = [pid], {}
    while tree:
        at = tree.pop()
        if at in stats:
            found[at] = stats[at]
            tree += [child for child, f in stats.items() if int(f[1]) == at]  # f[1]: the parent's pid
    return found


def _usage(pid: int) -> tuple[float, int, int]:
    """User + system CPU seconds of ``pid`` and its waited-for children, and of its live
    descendants; and the voluntary and involuntary context switches of their live threads
    (threads that ended are not counted)."""
    cpu, voluntary, involuntary = 0.0, 0, 0
    for at, fields in _tree(pid).items():
        cpu += sum(int(fields[i]) for i in (11, 12, 13, 14)) / _TICK
        for task in Path(f"/proc/{at}/task").glob("*"):
            try:
                status = (task / "status").read_text()
            except OSError:  # ended meanwhile
                continue
            voluntary += int(status.split("\nvoluntary_ctxt_switches:")[1].split()[0])
            involuntary += int(status.split("nonvoluntary_ctxt_switches:")[1].split()[0])
    return cpu, voluntary, involuntary


def _measured(pid: int, run):
    """``run()``'s output, and the CPU time and context switches ``pid`` spent meanwhile, as
    ``requests -> {cpu_us_per_request, voluntary_cs_per_request, involuntary_cs_per_request}``."""
    before = _usage(pid)
    out = run()
    cpu, voluntary, involuntary = (a - b for a, b in zip(_usage(pid), before))

    def costs(requests: int) -> dict:
        n = max(1, requests)
        return {"cpu_us_per_request": cpu / n * 1e6, "voluntary_cs_per_request": voluntary / n,
                "involuntary_cs_per_request": involuntary / n}
    return out, costs


def pinned(cmd: list[str], cpus: str | None) -> list[str]:
    """``cmd`` run on the CPUs ``cpus`` (``taskset -c`` list, e.g. ``"4-11"``) when given."""
    return ["taskset", "-c", cpus, *cmd] if cpus else cmd


def grpc_frame(message: bytes) -> bytes:
    """One gRPC length-prefixed message (not compressed), as h2load sends it as the body."""
    return b"\x00" + struct.pack(">I", len(message)) + message


def wrk(url: str, body: bytes, headers: dict[str, str], pid: int, *, connections: int = 32, threads: int = 2,
        seconds: float = 5.0, warmup: float = 1.0, cpus: str | None = None, delay_ms: int = 0) -> dict:
    """POST ``body`` to ``url`` from ``connections`` keep-alive connections; ``delay_ms``: each
    connection waits that long after each answer before its next request (a paced load: about
    ``connections / (delay + latency)`` requests a second), else it sends at once (closed loop)."""
    with tempfile.TemporaryDirectory() as tmp:
        body_file, script = Path(tmp) / "body", Path(tmp) / "post.lua"
        body_file.write_bytes(body)
        script.write_text(WRK_SCRIPT + (f"function delay() return {int(delay_ms)} end\n" if delay_ms > 0 else ""))
        env = {**os.environ, "SP_BODY": str(body_file),
               "SP_HEADERS": "\n".join(f"{k}: {v}" for k, v in headers.items())}

        def run(duration: float) -> str:
            cmd = pinned(["wrk", f"-t{threads}", f"-c{connections}", f"-d{max(1, round(duration))}s", "--latency",
                          "-s", str(script), url], cpus)
            return subprocess.run(cmd, env=env, capture_output=True, text=True, check=True,
                                  timeout=duration + 60).stdout

        if warmup > 0:
            run(warmup)
        out, costs = _measured(pid, lambda: run(seconds))
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return {"tool": "wrk", "connections": connections, "requests": requests,
            "req_per_s": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
            "p50_ms": _wrk_ms(out, "50%"), "p99_ms": _wrk_ms(out, "99%"), **costs(requests),
            "errors": (int(errors.group(1)) if errors else 0)
            + (sum(int(g) for g in socket_errors.groups()) if socket_errors else 0)}


def _wrk_ms(out: str, percentile: str) -> float:
    m = re.search(rf"^\s+{re.escape(percentile)}\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
    value, unit = float(m.group(1)), m.group(2)
    return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value


def grpc_errors(metrics_url: str) -> float:
    """The failed gRPC calls our server has counted (``sp_request_errors_total`` of protocol
    ``grpc``, every model and code), from its Prometheus text at ``metrics_url``."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(metrics_url, timeout=30).read().decode()
    return sum(sample.value for family in text_string_to_metric_families(text) if family.name == "sp_request_errors"
               for sample in family.samples
               if sample.name == "sp_request_errors_total" and sample.labels.get("protocol") == "grpc")


def h2load(url: str, message: bytes, headers: dict[str, str], pid: int, *, clients: int = 8, streams: int = 4,
           seconds: float = 5.0, warmup: float = 1.0, threads: int = 2, cpus: str | None = None,
           rate: float | None = None, metrics_url: str | None = None) -> dict:
    """Unary gRPC calls of ``message`` to ``url`` (``http://host:port/package.Service/Method``) from
    ``clients`` h2c connections with ``streams`` concurrent streams each; ``rate``: paced at about
    that many calls a second in all (h2load's ``--rps`` per client), else as fast as answered.
    ``metrics_url``: our server's ``/metrics``, whose failed gRPC calls of the timed run count as
    errors too (h2load sees HTTP/2 statuses only)."""
    with tempfile.TemporaryDirectory() as tmp:
        body_file, log_file = Path(tmp) / "body", Path(tmp) / "log"
        body_file.write_bytes(grpc_frame(message))
        head = ["-H", "content-type: application/grpc", "-H", "te: trailers"]
        for key, value in headers.items():
            head += ["-H", f"{key}: {value}"]

        def run(duration: float, log: bool) -> str:
            cmd = ["h2load", "-c", str(clients), "-m", str(streams), "-t", str(threads), "-D", str(max(1, round(duration))),
                   "-d", str(body_file), *head, url]
            if rate is not None:
                cmd[1:1] = [f"--rps={max(1, round(rate / clients))}"]
            if log:
                cmd[1:1] = ["--log-file", str(log_file)]
            cmd = pinned(cmd, cpus)
            return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=duration + 60).stdout

        if warmup > 0:
            run(warmup, False)
        failed_before = grpc_errors(metrics_url) if metrics_url else 0.0
        out, costs = _measured(pid, lambda: run(seconds, True))
        failed = int(grpc_errors(metrics_url) - failed_before) if metrics_url else 0
        durations = sorted(int(line.split("\t")[2]) for line in log_file.read_text().splitlines()
                           if line.count("\t") >= 2)
    done = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored",
                      out)
    finished = re.search(r"finished in ([\d.]+)(m?s), ([\d.]+) req/s", out)
    requests = int(done.group(1))
    return {"tool": "h2load", "connections": clients, "streams": streams, "requests": requests,
            "req_per_s": float(finished.group(3)),
            "p50_ms": durations[len(durations) // 2] / 1000 if durations else None,
            "p99_ms": durations[min(len(durations) - 1, int(len(durations) * 0.99))] / 1000 if durations else None,
            **costs(requests),
            # the server also answers the calls in flight when h2load stops, which h2load leaves out
            "errors": min(requests, int(done.group(3)) + int(done.group(4)) + failed)}
