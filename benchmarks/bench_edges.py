"""The network edges against the engine and against the bare stack they run on (issue 23).

One run, one machine, native load generators (``benchmarks.native_load``: ``wrk`` for HTTP/1.1,
``h2load`` for gRPC over h2c), the DLRM-like ``.onnx`` model (``demo.dlrm_onnx``: 26 Gather
tables of 20,000 x 16, MLP 256-128-1) with ``session_num`` 2, per-session pools, intra-op 1:

* **the limit**: ``process()`` in-process from 2 threads (req/s at batch 1 and 256), in every round;
* **the floors**: a bare uvicorn + httptools + uvloop ASGI app answering a fixed body, with the
  same thread-pool hop our edge may take and without; a bare grpcio server with a generic
  handler returning fixed bytes (sync and ``grpc.aio``) (``benchmarks.edge_floors``);
* **our server** (``python -m server``, the deployment's defaults but the model): every edge at
  batch 1 and 256: HTTP our wire format, TF Serving REST JSON, KServe v2 REST binary and JSON;
  gRPC ours, TF Serving ``Predict``, v2 ``ModelInfer``. Each edge's answer is checked against
  ``process()`` once before it is timed;
* **batching at the edge**: the demo CTR model on TensorFlow, batch-1 requests from 64 HTTP
  connections (wrk) and 64 gRPC streams (h2load), ``batching`` on vs off (``--batching-only``:
  these rows alone, with issue 44's targets).

Every server is started first; then each row is loaded in turn, for ``--rounds`` rounds, odd
rounds in the reverse order: the machine's speed drifts by up to a third within minutes, so a
figure is the median of its rounds and a ratio the median of ratios between rows of the same
round (the reversal puts each row of a pair first as often as second). Figures: req/s,
p50/p99 (ms), server CPU per request (us, the server process's user + system time over the
timed run / requests, its worker processes' included). Writes ``benchmarks/results/edges.json``
and ``.md`` (``--tag NAME``: ``edges-NAME``).

On a machine of more cores, ``--server-cpus`` and ``--load-cpus`` (``taskset -c`` lists) keep
the servers (and ``process()``'s threads) and the load generators on cores of their own, with
``--load-threads`` threads each; ``--workers N`` runs our server with N worker processes.

``--grpc-server native`` (issue 50) adds the native gRPC server (``grpc_server: "native"``): two
more servers of the same model with batching on (:data:`NATIVE_BATCHING`, so our Predict takes
the native direct path), one on the Python gRPC server and one on the native one, loaded at
batch 1 and 256 (gRPC ours; on the native one TF Serving gRPC and v2 gRPC too, on its direct
path), the native one again with ``cpu_scheduling: "other"`` (Linux's normal policy for gRPC's
threads too, against the default ``"io_batch"``) and ``"batch"`` (SCHED_BATCH for every thread),
gRPC ours; the default and ``"other"`` also paced (:data:`PACED_SHARE` of ``process()``'s req/s),
for latency below saturation; and issue 50's targets in the report. ``--grpc-server native-only`` leaves every other
server and row out (the limit and the gRPC floors stay).

    .venv/bin/python -m benchmarks.bench_edges [--seconds 5] [--rounds 3] [--skip-batching] [--out-dir DIR]
        [--server-cpus 0-1 --load-cpus 4-11 --load-threads 4] [--workers 2] [--tag NAME]
        [--grpc-server python|native|native-only] [--batching-only]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

from benchmarks import native_load
from benchmarks.common import run_threads, write_results
from benchmarks.edges_report import (BATCHES, DEMO, NATIVE, NATIVE_OTHER, NATIVE_PYTHON, NATIVE_SCHED_BATCH, PACED,
                                     PACED_SHARE, report)
from benchmarks.peers import MODEL, free_port, tfs_grpc_request, wait_http
from benchmarks.v2_wire import HEADER_LENGTH, MODEL_INFER, v2_binary_request, v2_grpc, v2_grpc_request, v2_http, v2_json_request

ROOT = Path(__file__).resolve().parent.parent
HTTP_EDGES = ("HTTP ours", "TF Serving REST JSON", "v2 REST binary", "v2 REST JSON")
GRPC_EDGES = ("gRPC ours", "TF Serving gRPC", "v2 gRPC")
# the batching of the native gRPC server's rows (--grpc-server native): no wait for company (a
# batch runs what is queued as soon as a batch thread is free), room for batch-256 requests
NATIVE_BATCHING = {"max_batch_size": 1024, "batch_timeout_micros": 0, "num_batch_threads": 2,
                   "max_enqueued_batches": 1000}
PROTOBUF = "application/x-protobuf"
GRPC_PREDICT = "/tensorflow.eas.ProcessorService/Predict"


def model_config(model_dir: Path) -> dict:
    return {"savedmodel_dir": str(model_dir), "backend": "onnxruntime", "session_num": 2,
            "use_per_session_threads": True, "intra_op_parallelism_threads": 1, "inter_op_parallelism_threads": 1}


# --- requests of every edge -----------------------------------------------------------------------

def bodies(feeds: dict[str, np.ndarray]) -> dict[str, tuple[str, bytes, dict[str, str]]]:
    """Per edge: (path, body, headers) of one request for ``feeds``; without TF Serving's protos
    (``tensorflow-serving-api``, not on a machine without TensorFlow) its gRPC edge is left out."""
    from processor.codec import encode_request

    rows = [{k: v[i].tolist() for k, v in feeds.items()} for i in range(len(next(iter(feeds.values()))))]
    binary, header_length = v2_binary_request(feeds)
    try:
        tfs = {"TF Serving gRPC": ("/tensorflow.serving.PredictionService/Predict", tfs_grpc_request(feeds), {})}
    except ModuleNotFoundError as exc:
        print(f"TF Serving gRPC left out: {exc}", flush=True)
        tfs = {}
    return {
        "HTTP ours": (f"/api/predict/{MODEL}", encode_request(feeds), {"Content-Type": PROTOBUF}),
        "TF Serving REST JSON": (f"/v1/models/{MODEL}:predict", json.dumps({"instances": rows}).encode(),
                                 {"Content-Type": "application/json"}),
        "v2 REST binary": (f"/v2/models/{MODEL}/infer", binary,
                           {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(header_length)}),
        "v2 REST JSON": (f"/v2/models/{MODEL}/infer", v2_json_request(feeds), {"Content-Type": "application/json"}),
        "gRPC ours": ("/tensorflow.eas.ProcessorService/Predict", encode_request(feeds), {"model-name": MODEL}),
        **tfs,
        "v2 gRPC": (MODEL_INFER, v2_grpc_request(feeds), {}),
    }


def answer(edge: str, http: str, grpc_target: str, path: str, body: bytes, headers: dict, whole: bool = False):
    """The ``prob`` output one edge answers for ``body`` (``whole``, HTTP and gRPC ours: every
    output, decoded)."""
    import grpc

    from processor.codec import decode_response

    if edge in ("v2 REST binary", "v2 REST JSON"):
        n = headers.get(HEADER_LENGTH)
        return v2_http(http + path, body, int(n) if n else None)["prob"]
    if edge == "v2 gRPC":
        return v2_grpc(grpc_target, body)["prob"]
    if edge in GRPC_EDGES:
        with grpc.insecure_channel(grpc_target) as channel:
            raw = channel.unary_unary(path)(body, metadata=tuple(headers.items()), timeout=60)
        if edge == "gRPC ours":
            out = decode_response(raw)
            return out if whole else out["prob"]
        from server.tfserving.tensor_proto import to_numpy
        from server.tfserving.messages import messages

        return to_numpy("prob", messages().PredictResponse.FromString(raw).outputs["prob"])
    request = urllib.request.Request(http + path, data=body, headers=headers)
    with urllib.request.urlopen(request, timeout=60) as resp:
        raw = resp.read()
    if edge == "HTTP ours":
        out = decode_response(raw)
        return out if whole else out["prob"]
    return np.asarray(json.loads(raw)["predictions"], np.float32)


# --- servers ----------------------------------------------------------------------------------

class Server:
    """A server process (ours or a floor), stopped on exit."""

    def __init__(self, cmd: list[str], env: dict | None = None, cwd: Path = ROOT) -> None:
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        self.proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_line(self, text: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in Path(self.log.name).read_text():
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(f"server did not print {text!r}:\n{Path(self.log.name).read_text()[-3000:]}")

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        os.unlink(self.log.name)


def our_server(work: Path, models: list[dict], http_port: int, grpc_port: int, cpus: str | None = None,
               **keys) -> Server:
    """``python -m server`` with the deployment's defaults but ``models``, the ports and ``keys``,
    on the CPUs ``cpus`` when given."""
    deployment = work / f"deployment-{http_port}.json"
    deployment.write_text(json.dumps({"models": models, "http_port": http_port, "grpc_port": grpc_port, **keys}))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    server = Server(native_load.pinned([sys.executable, "-m", "server", "--config", str(deployment)], cpus), env=env)
    wait_http(f"http://127.0.0.1:{http_port}/readyz", server.proc)
    return server


def load(edge: str, port: int, pid: int, path: str, body: bytes, headers: dict, seconds: float,
         connections: int = 32, cpus: str | None = None, threads: int = 2, rate: float | None = None,
         metrics_url: str | None = None) -> dict:
    """One row's load: h2load for the gRPC edges (``rate``: paced at about that many calls a
    second; ``metrics_url``: our server's /metrics, for the gRPC errors h2load cannot see), wrk
    for the HTTP ones."""
    if edge in GRPC_EDGES or edge == PACED or edge.startswith("gRPC floor"):
        return native_load.h2load(f"http://127.0.0.1:{port}{path}", body, headers, pid, clients=8, streams=4,
                                  seconds=seconds, cpus=cpus, threads=threads, rate=rate, metrics_url=metrics_url)
    return native_load.wrk(f"http://127.0.0.1:{port}{path}", body, headers, pid, connections=connections,
                           seconds=seconds, cpus=cpus, threads=threads)


# --- the run ----------------------------------------------------------------------------------

def bench(args) -> dict:
    from demo import dlrm_onnx
    from processor.codec import decode_response, encode_request
    from processor.processor import Processor

    tools = native_load.available()
    if not all(tools.values()):
        raise SystemExit(f"needs wrk and h2load (apt-get install wrk nghttp2-client): {tools}")
    host = machine()  # its load average before the run's own load
    work = Path(tempfile.mkdtemp(prefix="bench_edges_"))
    if args.batching_only:
        return {"machine": host, "seconds": args.seconds, "rounds": args.rounds,
                "rows": edge_batching(work, args.seconds, args.rounds), "placement": placement(args)}
    model_dir = work / "dlrm"
    dlrm_onnx.build(model_dir / "model.onnx", rows=20_000, dim=16)
    config = model_config(model_dir)
    feeds = {b: dlrm_onnx.inputs(b, seed=b) for b in BATCHES}
    requests = {b: bodies(feeds[b]) for b in BATCHES}
    rows: list[dict] = []

    native_only = args.grpc_server == "native-only"
    # the limit: process() in-process, 2 threads, once before the servers start (for the paced
    # rows' rates) and again in every round (so a ratio to it is one of the same round)
    processor = Processor.create(MODEL, json.dumps(config))
    expected, limit_data = {}, {}

    def limit(round_: int | None) -> None:
        for b in BATCHES:
            data = limit_data[b]
            r = on_cpus(args.server_cpus, lambda d=data: run_threads(lambda _i: processor.process(d), 2, args.seconds))
            rows.append({"server": "process() in-process" if round_ is not None else "process(), before the servers",
                         "edge": "process()", "batch": b, "threads": 2, **({} if round_ is None else {"round": round_}),
                         "req_per_s": r["calls_per_s"], "p50_ms": r["p50_us"] / 1000, "p99_ms": r["p99_us"] / 1000})
            print(f"round {round_} process() batch {b}: {r['calls_per_s']:.0f}/s", flush=True)

    for b in BATCHES:
        limit_data[b] = encode_request(feeds[b])
        status, out = processor.process(limit_data[b])
        assert status == 200, out
        expected[b] = decode_response(out)["prob"]
    limit(None)

    # every server up at once (idle, they take no CPU), then every row in turn, round after
    # round: the machine's speed drifts by a third within minutes, and a ratio is taken between
    # rows of the same round
    answer_bytes = len(encode_request({"prob": expected[1]}))
    plan: list[tuple] = []  # (server, edge, batch, process, port, path, body, headers, rate | None, metrics | None)
    with contextlib.ExitStack() as stack:
        stack.callback(processor.close)
        for kind, name, extra, path, edge in (
                ("http", "HTTP floor (thread hop)", ["--hop"], "/api/predict/x", "HTTP ours"),
                ("http", "HTTP floor (no hop)", [], "/api/predict/x", "HTTP ours"),
                ("grpc", "gRPC floor (sync)", [], "/x.Y/Z", "gRPC ours"),
                ("grpc", "gRPC floor (aio)", ["--aio"], "/x.Y/Z", "gRPC ours")):
            if native_only and kind == "http":
                continue
            port = free_port()
            floor = stack.enter_context(Server(native_load.pinned(
                [sys.executable, "-m", "benchmarks.edge_floors", kind, "--port", str(port), "--body-bytes",
                 str(answer_bytes), *extra], args.server_cpus)))
            floor.wait_line("READY")
            plan.append(("floor", name, 1, floor.proc, port, path, requests[1][edge][1],
                         {"Content-Type": PROTOBUF} if kind == "http" else {}, None, None))
        servers = [] if native_only else [
            ("ours", config, {}, HTTP_EDGES + GRPC_EDGES, BATCHES),
            # without its access log's successful lines (written off the request's thread, but on
            # 2 cores the writer's CPU is the requests' CPU too)
            ("ours, access_log false", config, {"access_log": False}, ("HTTP ours", "gRPC ours"), (1,))]
        if args.grpc_server != "python":  # issue 50: our Predict on the native direct path
            batching = {**config, "batching": NATIVE_BATCHING}
            servers += [(NATIVE_PYTHON, batching, {"grpc_server": "python"}, ("gRPC ours",), BATCHES),
                        (NATIVE, batching, {"grpc_server": "native"}, GRPC_EDGES, BATCHES),
                        # server/cpu_policy.py: under SCHED_OTHER a network read preempts a batch
                        (NATIVE_OTHER, batching, {"grpc_server": "native", "cpu_scheduling": "other"},
                         ("gRPC ours",), BATCHES),
                        (NATIVE_SCHED_BATCH, batching, {"grpc_server": "native", "cpu_scheduling": "batch"},
                         ("gRPC ours",), BATCHES)]
        for label, model_config_, keys, edges, batches in servers:
            http_port, grpc_port = free_port(), free_port()
            if args.workers > 1:
                keys = {**keys, "workers": args.workers}
            server = stack.enter_context(our_server(work, [{"name": MODEL, "model_config": model_config_}],
                                                    http_port, grpc_port, args.server_cpus, **keys))
            http, target = f"http://127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}"
            for b in batches:
                for edge in edges:
                    if edge not in requests[b]:  # left out (see bodies)
                        continue
                    path, body, headers = requests[b][edge]
                    got = answer(edge, http, target, path, body, headers)
                    diff = float(np.max(np.abs(np.asarray(got, np.float32).reshape(expected[b].shape) - expected[b])))
                    if diff > 1e-5:
                        raise AssertionError(f"{label} {edge} batch {b}: answers differ from process() by {diff}")
                    port = grpc_port if edge in GRPC_EDGES else http_port
                    plan.append((label, edge, b, server.proc, port, path, body, headers, None, f"{http}/metrics"))
                    if edge == "gRPC ours" and label in (NATIVE, NATIVE_OTHER):
                        rate = PACED_SHARE[b] * statistics.median(
                            r["req_per_s"] for r in rows if r["edge"] == "process()" and r["batch"] == b)  # before
                        plan.append((label, PACED, b, server.proc, port, path, body, headers, rate, f"{http}/metrics"))
        for round_ in range(args.rounds):
            limit(round_)
            for label, edge, b, proc, port, path, body, headers, rate, metrics in (
                    plan if round_ % 2 == 0 else plan[::-1]):
                r = load(edge, port, proc.pid, path, body, headers, args.seconds, cpus=args.load_cpus, rate=rate,
                         threads=args.load_threads, metrics_url=metrics)
                rows.append({"server": label, "edge": edge, "batch": b, "round": round_, **r})
                print(f"round {round_} {label} {edge} batch {b}: {r['req_per_s']:.0f}/s p99 {r['p99_ms']:.1f} ms, "
                      f"{r['cpu_us_per_request']:.0f} us/req, errors {r['errors']}", flush=True)

    if not args.skip_batching and not native_only:
        rows.extend(edge_batching(work, args.seconds, args.rounds))
    return {"machine": host, "seconds": args.seconds, "rounds": args.rounds, "order": "alternating", "rows": rows,
            "placement": placement(args)}


def on_cpus(cpus: str | None, work):
    """``work()`` with this thread (and the threads it starts) on the CPUs ``cpus`` when given."""
    if not cpus:
        return work()
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, _cpu_list(cpus))
    try:
        return work()
    finally:
        os.sched_setaffinity(0, before)


def _cpu_list(cpus: str) -> set[int]:
    out: set[int] = set()
    for part in cpus.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def placement(args) -> str:
    """Where the servers and the load generators ran, for the report."""
    workers = f"; our server with {args.workers} worker processes" if args.workers > 1 else ""
    if not args.server_cpus and not args.load_cpus:
        return f"servers and load generators share the machine's cores{workers}"
    return (f"servers and process() on CPUs {args.server_cpus or 'any'}, load generators on CPUs "
            f"{args.load_cpus or 'any'} ({args.load_threads} threads each){workers}")


def edge_batching(work: Path, seconds: float, rounds: int) -> list[dict]:
    """The demo CTR model on TensorFlow, batch-1 requests from 64 HTTP connections (wrk) and from
    64 gRPC streams (h2load, 8 connections x 8), batching off and on (issue 44): both servers up
    side by side, loaded in alternating rounds (the machine's speed drifts; each round's pair is
    compared)."""
    from benchmarks.common import demo_paths, processor_config
    from demo.synthetic_data import synthetic_batch
    from processor.codec import encode_request

    paths = demo_paths("small")
    body = encode_request(synthetic_batch(1, 5))
    out = []
    with contextlib.ExitStack() as stack:
        servers = {}
        for batching in (False, True):
            config = processor_config(paths, 2)
            if batching:
                # a 2 ms window: with 64 batch-1 clients, 0 runs batches of ~4 rows as soon as a
                # batch thread is free; 2 ms lets them fill (~20-35 rows measured) at no cost to p99
                config["batching"] = {"max_batch_size": 64, "batch_timeout_micros": 2000, "num_batch_threads": 2,
                                      "max_enqueued_batches": 100}
            http_port, grpc_port = free_port(), free_port()
            servers[batching] = (stack.enter_context(
                our_server(work, [{"name": MODEL, "model_config": config}], http_port, grpc_port)), http_port, grpc_port)
        # each edge's answer, batching on and off, equal before any is timed (h2load counts a
        # call answered with a gRPC error as done)
        answers = [answer(edge, f"http://127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}", path, body, headers,
                          whole=True)
                   for _server, http_port, grpc_port in servers.values()
                   for edge, path, headers in (("HTTP ours", f"/api/predict/{MODEL}", {"Content-Type": PROTOBUF}),
                                               ("gRPC ours", GRPC_PREDICT, {"model-name": MODEL}))]
        for got in answers[1:]:
            assert got.keys() == answers[0].keys(), (got.keys(), answers[0].keys())
            for name, value in got.items():
                np.testing.assert_allclose(value, answers[0][name], rtol=1e-5, atol=1e-6)
        for round_ in range(rounds):
            for batching, (server, http_port, grpc_port) in servers.items():
                on = "on" if batching else "off"
                r = native_load.wrk(f"http://127.0.0.1:{http_port}/api/predict/{MODEL}", body,
                                    {"Content-Type": PROTOBUF}, server.proc.pid, connections=64, seconds=seconds)
                out.append({"server": DEMO, "round": round_, "edge": f"HTTP ours, batching {on}", "batch": 1, **r})
                g = native_load.h2load(f"http://127.0.0.1:{grpc_port}{GRPC_PREDICT}", body,
                                       {"model-name": MODEL}, server.proc.pid, clients=8, streams=8, seconds=seconds,
                                       metrics_url=f"http://127.0.0.1:{http_port}/metrics")
                out.append({"server": DEMO, "round": round_, "edge": f"gRPC ours, batching {on}", "batch": 1, **g})
                print(f"demo TF batching {on}, round {round_}: HTTP {r['req_per_s']:.0f}/s p99 {r['p99_ms']:.1f} ms, "
                      f"gRPC {g['req_per_s']:.0f}/s p99 {g['p99_ms']:.1f} ms", flush=True)
    return out


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return f"{os.cpu_count()} cores, {cpu}, load average {os.getloadavg()[0]:.1f} at the start"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3, help="every row in turn, this many times")
    parser.add_argument("--skip-batching", action="store_true", help="skip the demo model's batching rows")
    parser.add_argument("--batching-only", action="store_true", help="only the demo model's batching rows (issue 44)")
    parser.add_argument("--out-dir", type=Path)
    parser.add_argument("--server-cpus", help="taskset -c list for the servers and process()'s threads")
    parser.add_argument("--load-cpus", help="taskset -c list for wrk and h2load")
    parser.add_argument("--load-threads", type=int, default=2, help="threads of each load generator")
    parser.add_argument("--workers", type=int, default=1, help="worker processes of our server")
    parser.add_argument("--tag", help="write edges-TAG.json/.md")
    parser.add_argument("--grpc-server", choices=("python", "native", "native-only"), default="python",
                        help="native: add the native gRPC server's rows (issue 50); native-only: only those, "
                             "the limit and the gRPC floors")
    args = parser.parse_args(argv)
    result = bench(args)
    write_results(f"edges-{args.tag}" if args.tag else "edges", result, report(result), args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
