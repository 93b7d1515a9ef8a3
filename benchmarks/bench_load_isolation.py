"""Loading does not disturb the others: a model's p99 while a ~1 GB model loads beside it.

One machine, one run. Our server (``python -m server``) serves ``probe``, the DLRM-like ``.onnx``
model (``demo.dlrm_onnx``: 26 Gather tables of 20,000 x 16, MLP 256-128-1); a paced client
(``--clients`` threads, each sending a batch-1 request of our wire format and then waiting
``--pause-ms``) records every answer's latency and when it came. Each round:

* **at rest**: ``--rest-seconds`` of that traffic alone;
* **during a load**: the big model (the same network with ``--rows`` rows per table: about 1 GB
  of parameters at the default) is loaded through KServe v2's repository API (``POST
  /v2/repository/models/big/load``, which answers once it serves), then unloaded; the probe's
  latencies between the load's start and its answer are the "during" sample. Its file is
  touched before each load, so each one imports it into the conversion cache anew, as a new
  version's file is (``--cached``: only the first round imports; the later ones load the
  cache's entry, as a restart does);
* **the unload**: the 2 s from the unload's request on, which hold the unloaded version's
  collection (``processor/memory.py`` ``reclaim_soon``: a full pass of the collector, the GIL
  held, 0.5 s after the close).

Rounds alternate the big model's ``load_nice`` between 10 (the default: the load and its warm-up
below serving priority, ``processor/load_priority.py``) and 0 (at serving priority), so the two
are compared in the same run. The figure the issue asks for is p99 during the load over p99 at
rest (target: at most 1.2x). The limit, the probe's ``process()`` from 1 thread in-process, is
shown too. Writes ``benchmarks/results/load_isolation.json`` and ``.md``.

    .venv/bin/python -m benchmarks.bench_load_isolation [--rows 600000] [--rounds 4] [--out-dir DIR]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.common import run_threads, write_results

TOKEN = "bench-load-isolation"
MIB = 2**20


def model_config(path: Path, load_nice: int = 10) -> dict:
    return {"savedmodel_dir": str(path), "backend": "onnxruntime", "session_num": 1,
            "file_system_poll_wait_seconds": 0, "load_nice": load_nice}


class PacedClient:
    """``clients`` threads, each: a request, its latency and arrival time noted, a pause."""

    def __init__(self, port: int, path: str, body: bytes, clients: int, pause_s: float) -> None:
        self.samples: list[tuple[float, float]] = []  # (time answered, latency s)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(port, path, body, pause_s), daemon=True)
                         for _ in range(clients)]
        for thread in self._threads:
            thread.start()

    def _run(self, port: int, path: str, body: bytes, pause_s: float) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        headers = {"Content-Type": "application/octet-stream"}
        while not self._stop.is_set():
            started = time.perf_counter()
            conn.request("POST", path, body=body, headers=headers)
            resp = conn.getresponse()
            resp.read()
            done = time.perf_counter()
            if resp.status != 200:
                raise RuntimeError(f"probe answered {resp.status}")
            with self._lock:
                self.samples.append((done, done - started))
            self._stop.wait(pause_s)
        conn.close()

    def between(self, start: float, end: float) -> list[float]:
        with self._lock:
            return [latency for at, latency in self.samples if start <= at <= end]

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)


def _post(port: int, path: str, doc: dict) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        conn.request("POST", path, body=json.dumps(doc),
                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"{}")
    finally:
        conn.close()


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else float("nan")


def bench(args) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bench_load_isolation_"))
    # the conversion cache keys a .onnx by its path: the ~1 GB entry of this run's big model goes
    # with the run (the server inherits the variable)
    os.environ["SP_ONNX_CACHE_DIR"] = str(work / "onnx-cache")
    try:
        return _bench(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _bench(args, work: Path) -> dict:
    from demo import dlrm_onnx
    from processor.codec import encode_request
    from processor.processor import Processor
    from tools.server_process import ServerProcess

    probe_path, big_path = work / "probe", work / "big"  # savedmodel_dir: the directory of a .onnx
    dlrm_onnx.build(probe_path / "model.onnx", rows=20_000, dim=16, seed=1)
    big_bytes = dlrm_onnx.build(big_path / "model.onnx", rows=args.rows, dim=16, seed=2).stat().st_size
    body = encode_request(dlrm_onnx.inputs(1, seed=1))

    processor = Processor.create("probe", json.dumps(model_config(probe_path)))
    try:
        limit = run_threads(lambda i: processor.process(body), 1, 3.0)
    finally:
        processor.close()

    deployment = {"models": [{"name": "probe", "model_config": model_config(probe_path)}], "access_log": False,
                  "admin_token": TOKEN, "memory_limit": 0}
    server = ServerProcess(deployment, work / "server").start(timeout=240)
    rounds: list[dict] = []
    try:
        client = PacedClient(server.http_port, "/api/predict/probe", body, args.clients, args.pause_ms / 1000)
        try:
            time.sleep(2.0)  # connections made, pools warm
            for index in range(args.rounds):
                load_nice = 10 if index % 2 == 0 else 0
                if not args.cached:
                    os.utime(big_path / "model.onnx")  # a new mtime: a new cache key, imported again
                rest_start = time.perf_counter()
                time.sleep(args.rest_seconds)
                rest = client.between(rest_start, time.perf_counter())
                started = time.perf_counter()
                status, answer = _post(server.http_port, "/v2/repository/models/big/load",
                                       {"parameters": {"config": json.dumps(model_config(big_path, load_nice))}})
                ended = time.perf_counter()
                if status != 200:
                    raise RuntimeError(f"load answered {status}: {answer}")
                during = client.between(started, ended)
                unload_started = time.perf_counter()
                _post(server.http_port, "/v2/repository/models/big/unload", {})
                time.sleep(2.0)  # the unloaded version freed (its collection runs 0.5 s after)
                unload = client.between(unload_started, time.perf_counter())
                rounds.append({"load_nice": load_nice, "load_seconds": ended - started,
                               **{part: {"n": len(sample), "p50_ms": _p(sample, 0.5), "p99_ms": _p(sample, 0.99),
                                         "max_ms": _p(sample, 1.0)}
                                  for part, sample in (("rest", rest), ("during", during), ("unload", unload))}})
                print(json.dumps(rounds[-1]), flush=True)
        finally:
            client.close()
    finally:
        server.stop()

    ratios = {}
    for nice in (10, 0):
        rows = [r for r in rounds if r["load_nice"] == nice]
        if rows:
            ratios[f"load_nice_{nice}"] = statistics.median(r["during"]["p99_ms"] / r["rest"]["p99_ms"] for r in rows)
    return {"machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()},
            "big_model_bytes": big_bytes, "rows": args.rows, "clients": args.clients, "pause_ms": args.pause_ms,
            "process_limit_calls_per_s": limit["calls_per_s"],
            "imported": "first round" if args.cached else "every round", "rounds": rounds, "p99_ratios": ratios,
            "target_p99_ratio_at_most": 1.2}


def markdown(result: dict) -> str:
    lines = [f"# Loading beside a serving model ({result['machine']['cpus']} CPUs)", "",
             f"Big model: {result['big_model_bytes'] / MIB:,.0f} MiB of ONNX (26 tables of {result['rows']:,} x 16); "
             f"probe: {result['clients']} paced clients (pause {result['pause_ms']} ms); the limit, the probe's "
             f"`process()` from 1 thread: {result['process_limit_calls_per_s']:,.0f} calls/s. "
             + ("Every round's load imports the `.onnx` into the conversion cache (as a new version's file)."
                if result.get("imported") == "every round" else
                "Round 1 imports the `.onnx` into the conversion cache; the later rounds load its entry."), "",
             "| round | load_nice | load s | rest n | rest p50 ms | rest p99 ms | rest max ms | during n "
             "| during p50 ms | during p99 ms | during max ms | p99 during / rest | unload (2 s) p99 ms "
             "| unload max ms |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for i, r in enumerate(result["rounds"], 1):
        rest, during, unload = r["rest"], r["during"], r.get("unload", {})

        def ms(part: dict, key: str) -> str:
            return f"{part[key]:.2f}" if key in part else ""
        lines.append(f"| {i} | {r['load_nice']} | {r['load_seconds']:.1f} | {rest['n']} | {rest['p50_ms']:.2f} "
                     f"| {rest['p99_ms']:.2f} | {ms(rest, 'max_ms')} | {during['n']} | {during['p50_ms']:.2f} "
                     f"| {during['p99_ms']:.2f} | {ms(during, 'max_ms')} | {during['p99_ms'] / rest['p99_ms']:.2f} "
                     f"| {ms(unload, 'p99_ms')} | {ms(unload, 'max_ms')} |")
    target = result["target_p99_ratio_at_most"]
    lines += ["", "| load priority | median p99 during / rest | target | |", "|---|---:|---:|---|"]
    for key, value in result["p99_ratios"].items():
        lines.append(f"| {key} | {value:.2f} | <= {target} | {'met' if value <= target else 'not met'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=600_000, help="rows per table of the big model (x 26 x 16 x 4 B)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--rest-seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--pause-ms", type=float, default=5.0)
    parser.add_argument("--cached", action="store_true",
                        help="the big model imported in the first round only (see the module doc)")
    parser.add_argument("--out-dir", type=Path, default=None)
    args = parser.parse_args()
    result = bench(args)
    write_results("load_isolation", result, markdown(result), args.out_dir)


if __name__ == "__main__":
    main()
