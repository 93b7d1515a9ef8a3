"""Shadow traffic: what a copy of every request run on another version costs the primary.

One machine, one run. The DLRM-like ``.onnx`` model (``demo.dlrm_onnx``: 26 Gather tables of
20,000 x 16, MLP 256-128-1) as TF Serving's base directory with versions 1 and 2 (different
weights), ``model_version_policy`` latest 2, labels ``stable`` (1) and ``canary`` (2), every
request naming no version sent to ``stable`` (``traffic``); our server (``python -m server``) is
loaded with ``wrk`` (batch-1 requests of our wire format on keep-alive connections):

* **the limit**: ``process()`` in-process from 2 threads on the same model (calls/s);
* **no shadow** vs **100% shadow** (``shadow: {"label": "canary", "fraction": 1.0}``):
  - at overload (``wrk`` closed loop, 32 connections): primary req/s and p99;
  - at about half of that capacity (a paced load: each of the connections waits after each
    answer): primary p99;
  - the shadow's counters from model info: copies run, dropped (shed: the bounded queue was
    full), failed.

The issue's targets: at half capacity the primary's p99 with 100% shadow within 1.1x of no
shadow; at overload primary throughput >= 0.95 of no shadow, with the shed copies counted.
Each figure is the median of ``--rounds`` rounds (the rows of a round run back to back, in the
other order every other round: this VM's speed drifts by a factor of two within minutes); a
ratio the median of per-round ratios. Writes ``benchmarks/results/shadow.json`` and ``.md``.

    .venv/bin/python -m benchmarks.bench_shadow [--seconds 5] [--rounds 6] [--out-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import urllib.request
from pathlib import Path

from benchmarks import native_load
from benchmarks.common import run_threads, write_results

MODEL = "dlrm"


def model_config(base: Path) -> dict:
    return {"savedmodel_dir": str(base), "backend": "onnxruntime", "session_num": 2,
            "use_per_session_threads": True, "intra_op_parallelism_threads": 1, "inter_op_parallelism_threads": 1,
            "file_system_poll_wait_seconds": 0, "model_version_policy": {"latest": {"num_versions": 2}}}


def deployment(base: Path, shadow: bool) -> dict:
    entry = {"name": MODEL, "model_config": model_config(base), "version_labels": {"stable": 1, "canary": 2},
             "traffic": {"stable": 100}}
    if shadow:
        entry["shadow"] = {"label": "canary", "fraction": 1.0}
    return {"models": [entry], "access_log": False, "drain_timeout_seconds": 5}


def shadow_counts(server) -> dict:
    with urllib.request.urlopen(server.http + f"/api/models/{MODEL}", timeout=30) as resp:
        return json.loads(resp.read())["shadow"]


def bench(args) -> dict:
    from demo import dlrm_onnx
    from processor.codec import encode_request
    from processor.processor import Processor
    from tools.server_process import ServerProcess

    if not native_load.available()["wrk"]:
        raise SystemExit("needs wrk (apt-get install wrk)")
    work = Path(tempfile.mkdtemp(prefix="bench_shadow_"))
    base = work / "dlrm"
    for number in (1, 2):
        dlrm_onnx.build(base / str(number) / "model.onnx", rows=20_000, dim=16, seed=number)
    body = encode_request(dlrm_onnx.inputs(1, seed=1))

    processor = Processor.create(MODEL, json.dumps(model_config(base)))
    try:
        limit = run_threads(lambda i: processor.process(body), 2, args.seconds)["calls_per_s"]
    finally:
        processor.close()

    servers = {name: ServerProcess(deployment(base, shadow), work / name).start()
               for name, shadow in (("no_shadow", False), ("shadow", True))}
    rounds: list[dict] = []
    try:
        for index in range(args.rounds):
            row: dict = {}
            # the machine's speed drifts within a run: each round's rows in the other order
            order = list(servers.items()) if index % 2 == 0 else list(servers.items())[::-1]
            for name, server in order:
                url = server.http + f"/api/predict/{MODEL}"
                before = shadow_counts(server)
                over = native_load.wrk(url, body, {}, server.proc.pid, connections=32, seconds=args.seconds)
                after = shadow_counts(server)
                row[name] = {"overload": over, "overload_shadow": {k: after[k] - before[k] for k in
                                                                   ("offered", "ran", "dropped", "shed", "failed")}}
            capacity = row["no_shadow"]["overload"]["req_per_s"]
            # paced: connections x 1 / (delay + latency) ~ half of the capacity
            delay_ms = 20
            connections = max(1, round(capacity / 2 * delay_ms / 1000))
            for name, server in order:
                url = server.http + f"/api/predict/{MODEL}"
                before = shadow_counts(server)
                half = native_load.wrk(url, body, {}, server.proc.pid, connections=connections,
                                       seconds=args.seconds, delay_ms=delay_ms)
                after = shadow_counts(server)
                row[name]["half"] = half
                row[name]["half_shadow"] = {k: after[k] - before[k] for k in ("offered", "ran", "dropped", "shed", "failed")}
            rounds.append(row)
    finally:
        for server in servers.values():
            server.stop()

    def median(path) -> float:
        return statistics.median(path(r) for r in rounds)

    ratios = {
        "overload_throughput": median(lambda r: r["shadow"]["overload"]["req_per_s"]
                                      / r["no_shadow"]["overload"]["req_per_s"]),
        "half_p99": median(lambda r: r["shadow"]["half"]["p99_ms"] / r["no_shadow"]["half"]["p99_ms"]),
    }
    return {"machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()},
            "seconds": args.seconds, "rounds": rounds, "process_limit_calls_per_s": limit, "ratios": ratios,
            "targets": {"half_p99_at_most": 1.1, "overload_throughput_at_least": 0.95}}


def markdown(result: dict) -> str:
    rounds = result["rounds"]

    def med(name, part, key):
        return statistics.median(r[name][part][key] for r in rounds)

    lines = [f"# Shadow traffic ({result['machine']['cpus']} CPUs, {result['seconds']} s x {len(rounds)} rounds)", "",
             f"The limit, `process()` from 2 threads: {result['process_limit_calls_per_s']:,.0f} calls/s", "",
             "| load | no shadow req/s | no shadow p99 ms | 100% shadow req/s | 100% shadow p99 ms | copies run | "
             "copies shed (busy) | copies dropped (queue full) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for part, title in (("overload", "overload (32 connections)"), ("half", "about half of capacity (paced)")):
        counts = f"{part}_shadow"
        lines.append(f"| {title} | {med('no_shadow', part, 'req_per_s'):,.0f} | {med('no_shadow', part, 'p99_ms'):.2f} "
                     f"| {med('shadow', part, 'req_per_s'):,.0f} | {med('shadow', part, 'p99_ms'):.2f} "
                     f"| {statistics.median(r['shadow'][counts]['ran'] for r in rounds):,.0f} "
                     f"| {statistics.median(r['shadow'][counts]['shed'] for r in rounds):,.0f} "
                     f"| {statistics.median(r['shadow'][counts]['dropped'] for r in rounds):,.0f} |")
    ratios, targets = result["ratios"], result["targets"]
    lines += ["", "| target | bound | measured | |", "|---|---:|---:|---|",
              f"| half capacity: p99 100% shadow / no shadow | <= {targets['half_p99_at_most']} | "
              f"{ratios['half_p99']:.2f} | {'met' if ratios['half_p99'] <= targets['half_p99_at_most'] else 'not met'} |",
              f"| overload: req/s 100% shadow / no shadow | >= {targets['overload_throughput_at_least']} | "
              f"{ratios['overload_throughput']:.2f} | "
              f"{'met' if ratios['overload_throughput'] >= targets['overload_throughput_at_least'] else 'not met'} |"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--out-dir", type=Path, default=None)
    args = parser.parse_args()
    result = bench(args)
    write_results("shadow", result, markdown(result), args.out_dir)


if __name__ == "__main__":
    main()
