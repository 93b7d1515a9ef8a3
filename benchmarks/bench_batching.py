"""Server-side batching on vs off: many small concurrent requests, in process and over HTTP / gRPC.

For every backend (``onnxruntime``, ``tensorflow``) the demo CTR model (the SavedModel's own
variables, ``session_num`` 2, one intra-op and one inter-op thread per session: the
``benchmarks.common.processor_config`` model_config) is served twice, batching off (no
``batching`` key) and on (the same config plus ``"batching": {...}`` from the flags, TF Serving's
names), and loaded by 8, 32 and 128 closed-loop clients sending batch-1 and batch-8 requests:

* ``process``: ``Processor.process(request bytes)`` from that many Python threads in this process;
* ``http``: ``python -m server``, our wire format (protobuf) on ``POST /api/predict/{model}``;
* ``grpc``: the same server, our wire format on ``ProcessorService.Predict``.

Off and on are measured back to back for every cell (both processors, or both servers, are up
together), so a slow drift in the machine's load hits both alike.

HTTP and gRPC load comes from ``benchmarks.common.loadgen`` processes (one keep-alive connection
or channel per client, pre-built request bytes, every latency recorded after a warmup), the
clients split over several processes (``--clients-per-loadgen``, at most ``--max-loadgen-procs``)
because one Python generator is GIL-bound; they start together at an agreed time and their
latencies are merged for the percentiles. The client's CPU use (cores) is recorded per row: on
this 2-core machine the client and the server share the cores.

Limits, in the same run: the backend's bare engine call (``benchmarks.bare_engine.bare_call``: the engine's own
call on a lane's session, what bench_request_path calls raw) at the request batch and at
``max_batch_size``, from ``session_num`` threads.

Peer, in the same run: Triton Inference Server with its dynamic batcher as ``nvidia-pytriton``
ships it (``benchmarks/triton_peer.py``, in its own venv), serving the same ONNX model on ONNX
Runtime in a Python inference callable, ``max_batch_size`` / queue delay / preferred sizes = ours,
one model instance per our session, over its HTTP (KServe v2, binary tensors) and gRPC
(``ModelInfer``) endpoints, batching on and off; its answers are checked against our process()
outputs first.

Prints and writes ``benchmarks/results/batching.json`` and ``.md``.

    .venv/bin/python -m benchmarks.bench_batching [--quick] [--backends onnxruntime,tensorflow]
        [--paths process,http,grpc] [--clients 8,32,128] [--batches 1,8] [--seconds 3]
        [--max-batch-size 64] [--batch-timeout-micros 0] [--allowed-batch-sizes 8,32,64]
    .venv/bin/python -m benchmarks.bench_batching --make-triton-venv
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.bare_engine import bare_call
from benchmarks.batching_report import TARGET_CLIENTS, report
from benchmarks.common import loadgen_command
from benchmarks.peers import (MODEL, OUTPUTS, TRITON_PEER, check_same, peer_tool, peer_versions, triton_python,
                              triton_server)
from benchmarks.v2_wire import HEADER_LENGTH, MODEL_INFER

ROOT = Path(__file__).resolve().parent.parent


# --- configuration ------------------------------------------------------------------------------

def batching_settings(args) -> dict:
    """The ``batching`` block of the model_config for "on" (TF Serving's names)."""
    out = {"max_batch_size": args.max_batch_size, "batch_timeout_micros": args.batch_timeout_micros,
           "max_enqueued_batches": args.max_enqueued_batches, "num_batch_threads": args.num_batch_threads,
           "pad_variable_length_inputs": False}
    if args.allowed_batch_sizes:
        out["allowed_batch_sizes"] = list(args.allowed_batch_sizes)
    return out


def model_config(paths, backend: str, sessions: int, batching: dict | None) -> dict:
    from benchmarks.common import processor_config

    config = processor_config(paths, sessions)
    config.pop("checkpoint_dir")  # the SavedModel's own variables: what the peer's ONNX file holds
    config["backend"] = backend
    if batching is not None:
        config["batching"] = batching
    return config


def batching_refused(config: dict) -> str | None:
    """Why this processor does not take the config (None: it does)."""
    from processor.config import ModelConfig

    try:
        ModelConfig.from_dict(config)
    except Exception as exc:  # ConfigError, pydantic errors
        return f"{type(exc).__name__}: {exc}"
    return None


# --- load ---------------------------------------------------------------------------------------

def run_load(spec: dict, clients: int, args, work: Path) -> dict:
    """``clients`` closed-loop clients split over loadgen processes; merged req/s and percentiles."""
    procs = max(1, min(args.max_loadgen_procs, math.ceil(clients / args.clients_per_loadgen), clients))
    shares = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
    start_at = time.time() + 0.8 + 0.3 * procs  # every process started and connected by then
    running = []
    for i, share in enumerate(shares):
        part = {**spec, "concurrency": share, "seconds": args.seconds, "warmup_seconds": args.warmup,
                "start_at": start_at, "latencies_file": str(work / f"latencies-{i}.npy")}
        spec_file = work / f"loadgen-{i}.json"
        spec_file.write_text(json.dumps(part))
        running.append(subprocess.Popen(loadgen_command(spec_file), cwd=ROOT, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True))
    parts, latencies = [], []
    for i, proc in enumerate(running):
        out, err = proc.communicate(timeout=args.seconds + args.warmup + 180)
        if proc.returncode != 0:
            raise RuntimeError(f"load generator failed: {err[-2000:]}")
        parts.append(json.loads(out.strip().splitlines()[-1]))
        latencies.append(np.load(work / f"latencies-{i}.npy"))
    flat = np.sort(np.concatenate(latencies))
    n = len(flat)
    return {"requests": n, "errors": sum(p["errors"] for p in parts), "rps": n / args.seconds,
            "p50_ms": float(flat[n // 2]) * 1e3 if n else None,
            "p99_ms": float(flat[min(n - 1, int(n * 0.99))]) * 1e3 if n else None,
            "client_cores": sum(p["cpu_s"] for p in parts) / (args.seconds + args.warmup),
            "loadgen_procs": procs}


def run_in_process(proc, request: bytes, clients: int, args) -> dict:
    """``clients`` threads calling ``proc.process(request)`` in a closed loop (after a warmup loop)."""
    from benchmarks.common import run_threads

    errors = [0]

    def call(i: int) -> None:
        status, _ = proc.process(request)
        if status != 200:
            errors[0] += 1

    run_threads(call, clients, args.warmup, warmup_calls=1)
    errors[0] = 0
    r = run_threads(call, clients, args.seconds, warmup_calls=0)
    return {"requests": r["calls"], "errors": errors[0], "rps": r["calls_per_s"],
            "p50_ms": r["p50_us"] / 1e3, "p99_ms": r["p99_us"] / 1e3, "client_cores": None,
            "loadgen_procs": 0}


# --- requests and answers -----------------------------------------------------------------------

class Requests:
    """Per request batch: our wire-format request (bytes and file), the feeds, the peer's feeds."""

    def __init__(self, batches, max_batch: int, work: Path) -> None:
        from demo.synthetic_data import synthetic_batch
        from processor import codec
        from processor.engine.string_hash import fingerprint

        self.feeds, self.wire, self.wire_file, self.peer_feeds = {}, {}, {}, {}
        for batch in sorted({*batches, max_batch}):
            feeds = synthetic_batch(batch, seed=7)
            self.feeds[batch] = feeds
            self.wire[batch] = codec.encode_request(feeds)
            self.wire_file[batch] = work / f"wire-{batch}.bin"
            self.wire_file[batch].write_bytes(self.wire[batch])
            # the ONNX graph's inputs: the string feature as TensorFlow's 64-bit fingerprints
            peer = {k: (fingerprint(v) if v.dtype == object else v) for k, v in feeds.items()}
            self.peer_feeds[batch] = work / f"peer-feeds-{batch}.npz"
            np.savez(self.peer_feeds[batch], **peer)


def answer(body: bytes) -> dict[str, np.ndarray]:
    from processor import codec

    out = codec.decode_response(body)
    return {k: np.asarray(out[k], dtype=np.float64) for k in OUTPUTS}


# --- ours ---------------------------------------------------------------------------------------

def bench_ours(backend: str, args, paths, reqs: Requests, work: Path, rows: list, notes: dict) -> dict:
    """Rows for one backend; returns {batch: process() answer with batching off}."""
    from processor.processor import Processor

    off_config = model_config(paths, backend, args.sessions, None)
    on_config = model_config(paths, backend, args.sessions, batching_settings(args))
    refused = batching_refused(on_config)
    modes = {"off": off_config}
    if refused:
        notes.setdefault("batching_on", f"not run: the processor refuses the batching key ({refused})")
        print(f"batching on: not run ({refused})", flush=True)
    else:
        modes["on"] = on_config

    def record(path: str, clients: int, batch: int, mode: str, result: dict) -> None:
        row = {"server": "ours", "backend": backend, "path": path, "clients": clients, "batch": batch,
               "batching": mode, **result}
        rows.append(row)
        print(f"  ours {backend:11s} {path:7s} {mode:3s} clients {clients:3d} batch {batch}: "
              f"{result['rps']:8.1f} req/s  p50 {result['p50_ms']:7.2f} ms  p99 {result['p99_ms']:7.2f} ms  "
              f"errors {result['errors']}" + (f"  client {result['client_cores']:.2f} cores"
                                               if result.get("client_cores") is not None else ""), flush=True)

    reference: dict[int, dict] = {}
    print(f"ours, {backend}: process()", flush=True)
    procs = {mode: Processor.create(f"bench-{mode}", json.dumps(config)) for mode, config in modes.items()}
    try:
        for batch in sorted(reqs.wire):
            status, body = procs["off"].process(reqs.wire[batch])
            assert status == 200, body[:300]
            reference[batch] = answer(body)
            if "on" in procs:
                status, body = procs["on"].process(reqs.wire[batch])
                assert status == 200, body[:300]
                check_same(f"{backend} batching on", answer(body), reference[batch])
        notes.setdefault("bare", {})[backend] = bare_limits(procs["off"], reqs, args)
        if "process" in args.paths:
            for clients in args.clients:
                for batch in args.batches:
                    for mode, proc in procs.items():
                        record("process", clients, batch, mode, run_in_process(proc, reqs.wire[batch], clients, args))
    finally:
        for proc in procs.values():
            proc.close()

    if not {"http", "grpc"} & set(args.paths):
        return reference
    from tools.server_process import ServerProcess

    print(f"ours, {backend}: python -m server", flush=True)
    servers = {}
    try:
        for mode, config in modes.items():
            deployment = {"models": [{"name": MODEL, "model_config": config}], "access_log": False,
                          "max_request_bytes": 64 << 20, "log_level": "WARNING"}
            servers[mode] = ServerProcess(deployment, work / f"server-{backend}-{mode}").start(timeout=300)
        for mode, server in servers.items():
            check_server(f"{backend} server batching {mode}", server, reqs, reference)
        for path in ("http", "grpc"):
            if path not in args.paths:
                continue
            for clients in args.clients:
                for batch in args.batches:
                    for mode, server in servers.items():
                        if path == "http":
                            spec = {"kind": "http", "host": "127.0.0.1", "port": server.http_port,
                                    "path": f"/api/predict/{MODEL}", "content_type": "application/x-protobuf"}
                        else:
                            spec = {"kind": "grpc", "target": server.grpc_target,
                                    "method": "/tensorflow.eas.ProcessorService/Predict",
                                    "metadata": [["model-name", MODEL]]}
                        spec["body_file"] = str(reqs.wire_file[batch])
                        record(path, clients, batch, mode, run_load(spec, clients, args, work))
    finally:
        for server in servers.values():
            server.stop()
    return reference


def check_server(what: str, server, reqs: Requests, reference: dict) -> None:
    import urllib.request

    import grpc

    for batch in reqs.wire:
        request = urllib.request.Request(f"{server.http}/api/predict/{MODEL}", data=reqs.wire[batch],
                                         headers={"Content-Type": "application/x-protobuf"})
        with urllib.request.urlopen(request, timeout=60) as resp:
            check_same(f"{what} HTTP", answer(resp.read()), reference[batch])
        with grpc.insecure_channel(server.grpc_target) as channel:
            body = channel.unary_unary("/tensorflow.eas.ProcessorService/Predict")(
                reqs.wire[batch], metadata=(("model-name", MODEL),), timeout=60)
            check_same(f"{what} gRPC", answer(body), reference[batch])


def bare_limits(proc, reqs: Requests, args) -> list[dict]:
    """The bare engine call at each request batch and at max_batch_size, from session_num threads."""
    from benchmarks.common import run_threads
    from processor import codec

    with proc.manager.acquire() as group:
        backend, signature = group.backend, group.signature
    fetches = tuple(signature.outputs)
    out = []
    for batch in sorted({*args.batches, args.max_batch_size}):
        feeds = codec.decode_request(reqs.wire[batch], signature).feeds
        bare = [bare_call(backend, lane, feeds, fetches) for lane in range(args.sessions)]
        r = run_threads(lambda i: bare[i](), args.sessions, args.bare_seconds)
        out.append({"batch": batch, "threads": args.sessions, "calls_per_s": r["calls_per_s"],
                    "rows_per_s": r["calls_per_s"] * batch, "p50_ms": r["p50_us"] / 1e3,
                    "p99_ms": r["p99_us"] / 1e3})
        print(f"  bare {batch:4d}: {r['calls_per_s']:9.1f} calls/s = {r['calls_per_s'] * batch:10.0f} rows/s "
              f"({args.sessions} threads)", flush=True)
    return out


# --- the Triton peer ----------------------------------------------------------------------------

def bench_triton(args, tpy: Path, paths, reqs: Requests, reference: dict, work: Path, rows: list) -> str:
    """Triton rows (batching off and on); returns what ran (versions) for the notes."""
    from processor.processor import Processor

    # the ONNX file our onnxruntime backend serves: its conversion cache entry
    probe = Processor.create("bench-probe", json.dumps(model_config(paths, "onnxruntime", 1, None)))
    try:
        with probe.manager.acquire() as group:
            model_dir = group.describe()["model"]["cache"]
    finally:
        probe.close()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LD_LIBRARY_PATH")}
    peer = str(TRITON_PEER)
    for batch in args.batches:
        peer_tool([str(tpy), peer, "requests", "--model-dir", model_dir, "--feeds", str(reqs.peer_feeds[batch]),
                    "--out-dir", str(work / f"triton-{batch}")], env, work)
    settings = batching_settings(args)
    for mode in ("off", "on"):
        print(f"Triton (pytriton), dynamic batching {mode}", flush=True)
        serve_args = ["--model-dir", model_dir, "--batching", mode,
                      "--max-batch-size", str(settings["max_batch_size"]),
                      "--delay-us", str(settings["batch_timeout_micros"]),
                      "--preferred", ",".join(map(str, settings.get("allowed_batch_sizes", []))),
                      "--instances", str(args.sessions), "--intra", "1", "--inter", "1"]
        with triton_server(tpy, work, env, f"triton-{mode}.log", serve_args) as (http_port, grpc_port):
            for batch in args.batches:
                out = work / f"triton-check-{mode}-{batch}.npz"
                peer_tool([str(tpy), peer, "check", "--feeds", str(reqs.peer_feeds[batch]), "--http-port",
                            str(http_port), "--grpc-port", str(grpc_port), "--out", str(out)], env, work)
                got = np.load(out)
                for proto in ("http", "grpc"):
                    check_same(f"Triton {proto} batching {mode}", {k: got[f"{proto}/{k}"] for k in OUTPUTS},
                               reference[batch])
            header = {b: json.loads((work / f"triton-{b}" / "http.json").read_text())["header_length"]
                      for b in args.batches}
            for path in ("http", "grpc"):
                if path not in args.paths:
                    continue
                for clients in args.clients:
                    for batch in args.batches:
                        if path == "http":
                            spec = {"kind": "http", "host": "127.0.0.1", "port": http_port,
                                    "path": f"/v2/models/{MODEL}/infer", "content_type": "application/octet-stream",
                                    "headers": {HEADER_LENGTH: str(header[batch])},
                                    "body_file": str(work / f"triton-{batch}" / "http.bin")}
                        else:
                            spec = {"kind": "grpc", "target": f"127.0.0.1:{grpc_port}",
                                    "method": MODEL_INFER,
                                    "body_file": str(work / f"triton-{batch}" / "grpc.bin")}
                        result = run_load(spec, clients, args, work)
                        rows.append({"server": "triton", "backend": "onnxruntime", "path": path, "clients": clients,
                                     "batch": batch, "batching": mode, **result})
                        print(f"  triton onnxruntime {path:7s} {mode:3s} clients {clients:3d} batch {batch}: "
                              f"{result['rps']:8.1f} req/s  p50 {result['p50_ms']:7.2f} ms  "
                              f"p99 {result['p99_ms']:7.2f} ms  errors {result['errors']}  "
                              f"client {result['client_cores']:.2f} cores", flush=True)
    return peer_versions(tpy, env)


# --- the run ------------------------------------------------------------------------------------

def bench(args) -> dict:
    from benchmarks.common import demo_paths

    load_before = list(os.getloadavg())
    paths = demo_paths(args.preset)
    work = Path(tempfile.mkdtemp(prefix="bench-batching-"))
    reqs = Requests(args.batches, args.max_batch_size, work)
    rows: list[dict] = []
    notes: dict = {}
    references = {}
    for backend in args.backends:
        references[backend] = bench_ours(backend, args, paths, reqs, work, rows, notes)

    tpy = triton_python(args)
    if args.skip_triton:
        notes["triton"] = "skipped (--skip-triton)"
    elif not {"http", "grpc"} & set(args.paths):
        notes["triton"] = "not run: no HTTP or gRPC path selected"
    elif not tpy.exists():
        notes["triton"] = (f"not run: no Triton environment at {tpy} (make it with "
                           f".venv/bin/python -m benchmarks.bench_batching --make-triton-venv)")
    else:
        reference = references.get("onnxruntime")
        if reference is None:  # the peer runs ONNX Runtime: compare with our onnxruntime answers
            from processor.processor import Processor

            proc = Processor.create("bench-ref", json.dumps(model_config(paths, "onnxruntime", 1, None)))
            try:
                reference = {b: answer(proc.process(reqs.wire[b])[1]) for b in args.batches}
            finally:
                proc.close()
        try:
            notes["triton"] = bench_triton(args, tpy, paths, reqs, reference, work, rows)
        except Exception as exc:
            notes["triton"] = f"not run: {type(exc).__name__}: {exc}"
            print(f"Triton: {notes['triton']}", flush=True)
    return {"rows": rows, "notes": notes, "preset": args.preset, "load_before": load_before}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    names = lambda s: [x for x in s.split(",") if x]  # noqa: E731
    parser.add_argument("--quick", action="store_true",
                        help="short smoke run: 1 s cells, 8 and 32 clients, batch 1")
    parser.add_argument("--preset", default="small", choices=["small", "full", "auto"])
    parser.add_argument("--backends", type=names, default=["onnxruntime", "tensorflow"])
    parser.add_argument("--paths", type=names, default=["process", "http", "grpc"])
    parser.add_argument("--clients", type=ints, default=None, help="default 8,32,128")
    parser.add_argument("--batches", type=ints, default=None, help="request batch sizes, default 1,8")
    parser.add_argument("--seconds", type=float, default=None, help="measured seconds per cell (default 3)")
    parser.add_argument("--warmup", type=float, default=None, help="warmup seconds per cell (default 1)")
    parser.add_argument("--bare-seconds", type=float, default=None, help="per bare-call loop (default 2)")
    parser.add_argument("--sessions", type=int, default=2, help="session_num (and Triton instances)")
    parser.add_argument("--max-batch-size", type=int, default=64)
    # 0: a free batch thread takes what is queued at once; under load requests queue up while the
    # threads run, so batches form without adding a wait (closed-loop clients gain most from it)
    parser.add_argument("--batch-timeout-micros", type=int, default=0)
    parser.add_argument("--max-enqueued-batches", type=int, default=100)
    parser.add_argument("--num-batch-threads", type=int, default=2)
    parser.add_argument("--allowed-batch-sizes", type=ints, default=[],
                        help="e.g. 8,32,128 (last = max-batch-size); Triton's preferred sizes; default none")
    parser.add_argument("--clients-per-loadgen", type=int, default=16)
    parser.add_argument("--max-loadgen-procs", type=int, default=4)
    parser.add_argument("--triton-python", help="python of the Triton venv (default artifacts/triton-venv/bin/python)")
    parser.add_argument("--skip-triton", action="store_true")
    parser.add_argument("--make-triton-venv", action="store_true", help="create artifacts/triton-venv and exit")
    args = parser.parse_args()
    if args.make_triton_venv:
        from benchmarks.triton_peer import DEFAULT_VENV, make_venv

        make_venv(DEFAULT_VENV)
        return 0
    quick = args.quick
    args.clients = args.clients or ([8, 32] if quick else [8, 32, 128])
    args.batches = args.batches or ([1] if quick else [1, 8])
    args.seconds = args.seconds or (1.0 if quick else 3.0)
    args.warmup = args.warmup if args.warmup is not None else (0.5 if quick else 1.0)
    args.bare_seconds = args.bare_seconds or (0.5 if quick else 2.0)
    unknown = set(args.paths) - {"process", "http", "grpc"} | set(args.backends) - {"onnxruntime", "tensorflow"}
    if unknown:
        parser.error(f"unknown path or backend: {sorted(unknown)}")
    if args.allowed_batch_sizes and args.allowed_batch_sizes[-1] != args.max_batch_size:
        parser.error("--allowed-batch-sizes must end with --max-batch-size (TF Serving's rule)")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from benchmarks.common import write_results

    payload, markdown = report(bench(args), args, batching_settings(args))
    write_results("batching", payload, markdown)
    for c in payload["comparisons"]["on_vs_off"]:
        if c["clients"] == TARGET_CLIENTS:
            print(f"target {c['backend']} {c['path']} batch {c['batch']}: on/off {c['rps_ratio']:.2f}x req/s, "
                  f"p99 on/off {c['p99_ratio']:.2f} -> {'met' if c['target_met'] else 'not met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
