"""workers: N (issue 24): the machine's memory and the server's req/s with 1, 2, 4 workers.

* **memory**: the DLRM-like ``.onnx`` model (``demo.dlrm_onnx``) with about ``--table-gb`` GB of
  embedding tables on ONNX Runtime, ``python -m server`` with ``workers`` 1, 2 and 4: the
  machine's used memory (``MemTotal - MemAvailable`` from ``/proc/meminfo``: shared memory
  included) just before the start and once every worker serves (and has answered a few
  requests), and the server's own memory (private pages of its processes + its shared segments
  once); each worker beyond the first should add at most 0.2 of the tables' bytes. ``--rounds``
  rounds of 1, 2, 4 workers, each figure the median over rounds (the per-worker ratio of each
  round against the same round's one worker); before them, how much the machine's used memory
  moves in 10 s with no server running (other processes' drift);
* **throughput**: the same model with small tables (26 x 20,000 x 16), batch 1, workers 1 vs 2:
  HTTP our wire format (``wrk``) and gRPC ``ProcessorService.Predict`` (``h2load``), req/s and
  p50/p99 (ms). The load generators run on the same machine and take CPU from the server.

The machine may be shared: other processes' memory and CPU move both figures; the machine's
memory figure takes the used memory right before each start as its baseline, and moves by the
drift above; the server's own memory does not. Writes ``benchmarks/results/workers.json`` and
``.md``.

    .venv/bin/python -m benchmarks.bench_server --workers 1,2 [the options below]  (the same)
    .venv/bin/python -m benchmarks.bench_workers [--table-gb 1] [--workers 1,2,4] [--rounds 3]
        [--load-workers 1,2] [--load-rounds 3] [--seconds 5] [--skip-memory] [--skip-throughput] [--out-dir DIR]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from benchmarks import native_load
from benchmarks.common import write_results
from demo import dlrm_onnx
from processor.codec import encode_request

MODEL = "dlrm"
DIM = 16


def used_bytes() -> int:
    """MemTotal - MemAvailable: what the machine uses, shared memory included."""
    info = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, value = line.split(":", 1)
        info[key] = int(value.split()[0]) * 1024
    return info["MemTotal"] - info["MemAvailable"]


def server_memory(server) -> dict:
    """The server's own memory, less noisy than the machine's: the private pages (clean + dirty)
    of the supervisor and every worker, and its shared-memory segments counted once."""
    from processor import shared_segments

    pids = [server.proc.pid, *server.ports.get("workers", [])]
    private = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("Private_Clean", "Private_Dirty"):
                private += int(rest.split()[0]) * 1024
    segments = sum(p.stat().st_size for p in shared_segments.default_directory().glob(
        f"{shared_segments.PREFIX}{server.proc.pid}-*"))
    return {"private_mib": private / 2**20, "shared_segments_mib": segments / 2**20,
            "own_mib": (private + segments) / 2**20}


def deployment(model_dir: Path, workers: int) -> dict:
    config = {"savedmodel_dir": str(model_dir), "backend": "onnxruntime", "session_num": 1,
              "use_per_session_threads": True, "intra_op_parallelism_threads": 1,
              "file_system_poll_wait_seconds": 0}
    return {"models": [{"name": MODEL, "model_config": config}], "workers": workers, "access_log": False}


def answer_a_few(server, calls: int = 20) -> None:
    body = encode_request(dlrm_onnx.inputs(1))
    for _ in range(calls):  # fresh connections: the kernel spreads them over the workers
        with urllib.request.urlopen(urllib.request.Request(f"{server.http}/api/predict/{MODEL}", data=body),
                                    timeout=60) as resp:
            resp.read()


def drift_mib(seconds: float = 10.0) -> float:
    """How far the machine's used memory moves in ``seconds`` with no server running (MiB)."""
    samples = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        samples.append(used_bytes())
        time.sleep(0.25)
    return (max(samples) - min(samples)) / 2**20


def measure_once(model_dir: Path, workers: int, work: Path) -> dict:
    """One server's start with ``workers``: the machine's used memory before and while serving,
    and the server's own memory."""
    from tools.server_process import ServerProcess

    time.sleep(2)  # let the previous server's memory go back
    before = used_bytes()
    server = ServerProcess(deployment(model_dir, workers), work).start(timeout=900)
    try:
        answer_a_few(server)
        time.sleep(1)
        after = used_bytes()
        own = server_memory(server)
    finally:
        server.stop()
    return {"workers": workers, "used_before_mib": before / 2**20, "used_after_mib": after / 2**20,
            "added_mib": (after - before) / 2**20, **own}


def measure_memory(model_dir: Path, table_bytes: int, workers_list: list[int], rounds: int,
                   work: Path) -> tuple[list[dict], list[list[dict]]]:
    """``rounds`` rounds of one server per entry of ``workers_list`` (the first: one worker, the
    base of the ratios); returns the medians per entry and each round's rows."""
    each_round = []
    for r in range(rounds):
        rows = [measure_once(model_dir, workers, work / f"memory-{r}-{workers}") for workers in workers_list]
        for row in rows:
            print(f"round {r + 1} workers {row['workers']}: machine +{row['added_mib']:.0f} MiB; server's own "
                  f"{row['own_mib']:.0f} MiB (private {row['private_mib']:.0f}, shared "
                  f"{row['shared_segments_mib']:.0f})", flush=True)
        for key in ("added_mib", "own_mib"):
            for row in rows:
                extra = row["workers"] - 1
                row[f"per_extra_worker_over_tables_{key[:-4]}"] = (
                    (row[key] - rows[0][key]) * 2**20 / extra / table_bytes if extra else None)
        each_round.append(rows)
    medians = []
    for i, workers in enumerate(workers_list):
        rows = [each[i] for each in each_round]
        row: dict = {"workers": workers}
        for key in rows[0]:
            if key != "workers":
                values = [r[key] for r in rows]
                row[key] = None if None in values else statistics.median(values)
        row["added_min_mib"] = min(r["added_mib"] for r in rows)
        row["added_max_mib"] = max(r["added_mib"] for r in rows)
        row["added_over_tables"] = row["added_mib"] * 2**20 / table_bytes
        medians.append(row)
    return medians, each_round


def measure_throughput(model_dir: Path, workers_list: list[int], seconds: float, work: Path,
                       rounds: int = 1) -> tuple[list[dict], list[dict]]:
    """``rounds`` rounds, each of every worker count in turn (so a machine's slow minute hits them
    alike): (every row, with its round; per edge and worker count, the median req/s and p99 and
    the median over rounds of the req/s against the same round's first worker count)."""
    rows = []
    for round_ in range(rounds):
        rows += [{"round": round_ + 1, **row} for row in _throughput_round(model_dir, workers_list, seconds, work)]
    summary = []
    for edge in dict.fromkeys(r["edge"] for r in rows):
        base = {r["round"]: r["req_per_s"] for r in rows if r["edge"] == edge and r["workers"] == workers_list[0]}
        for workers in workers_list:
            mine = [r for r in rows if r["edge"] == edge and r["workers"] == workers]
            summary.append({"workers": workers, "edge": edge,
                            "req_per_s": statistics.median(r["req_per_s"] for r in mine),
                            "p99_ms": statistics.median(r["p99_ms"] for r in mine),
                            "vs_first": statistics.median(r["req_per_s"] / base[r["round"]] for r in mine),
                            "errors": sum(r["errors"] for r in mine)})
    return rows, summary


def _throughput_round(model_dir: Path, workers_list: list[int], seconds: float, work: Path) -> list[dict]:
    from tools.server_process import ServerProcess

    body = encode_request(dlrm_onnx.inputs(1))
    rows = []
    for workers in workers_list:
        with ServerProcess(deployment(model_dir, workers), work / f"load-{workers}") as server:
            answer_a_few(server)
            pid = server.proc.pid  # the CPU figure is the supervisor's (not its live workers'): left out
            http = native_load.wrk(f"{server.http}/api/predict/{MODEL}", body, {}, pid, seconds=seconds)
            grpc = native_load.h2load(f"http://{server.grpc_target}/tensorflow.eas.ProcessorService/Predict",
                                      body, {"model-name": MODEL}, pid, seconds=seconds,
                                      metrics_url=f"{server.http}/metrics")
        for edge, result in (("HTTP ours (wrk)", http), ("gRPC ours (h2load)", grpc)):
            result.pop("cpu_us_per_request", None)
            rows.append({"workers": workers, "edge": edge, **result})
            print(f"workers {workers} {edge}: {result['req_per_s']:.0f} req/s, p99 {result['p99_ms']:.2f} ms",
                  flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table-gb", type=float, default=1.0)
    parser.add_argument("--workers", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4])
    parser.add_argument("--rounds", type=int, default=3, help="memory: rounds of every --workers entry")
    parser.add_argument("--load-workers", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--load-rounds", type=int, default=3, help="throughput: rounds of every --load-workers entry")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--out-dir", type=Path)
    args = parser.parse_args(argv)
    os.environ.setdefault("SP_ONNX_CACHE_DIR", tempfile.mkdtemp(prefix="sp-bench-workers-cache-"))
    payload: dict = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                 "load_average": os.getloadavg()}}
    md = [""]  # the heading, once the load average at the end is known
    with tempfile.TemporaryDirectory(prefix="sp-bench-workers-") as tmp:
        work = Path(tmp)
        if not args.skip_memory:
            rows_per_table = int(args.table_gb * 2**30 / (dlrm_onnx.SPARSE * DIM * 4))
            big = work / "big"
            # built in a child process: the building's gigabytes must not stay in this one's heap
            # (they would sit in the first baseline)
            subprocess.run([sys.executable, "-m", "demo.dlrm_onnx", str(big), "--rows", str(rows_per_table),
                            "--dim", str(DIM)], check=True, stdout=subprocess.DEVNULL)
            table_bytes = dlrm_onnx.SPARSE * rows_per_table * DIM * 4
            drift = drift_mib()
            print(f"the machine's used memory moved by {drift:.0f} MiB in 10 s with no server", flush=True)
            memory, each_round = measure_memory(big, table_bytes, args.workers, args.rounds, work)
            payload["memory"] = {"table_bytes": table_bytes, "rounds": args.rounds,
                                 "drift_mib_in_10s_without_server": drift, "rows": memory, "each_round": each_round}
            md.append(f"## Memory: {table_bytes / 2**30:.2f} GiB of tables, median of {args.rounds} rounds\n\n"
                      "Machine: MemTotal - MemAvailable before the start and while serving; other processes "
                      f"move it: by {drift:.0f} MiB in 10 s with no server running, just before. Server: "
                      "private pages of the supervisor and every worker + the shared segments once.\n\n"
                      "| workers | machine before (MiB) | machine serving (MiB) | machine added (MiB) "
                      "| min - max (MiB) | per extra worker / tables | server private (MiB) "
                      "| shared segments (MiB) | server own (MiB) | per extra worker / tables |\n"
                      "|---|---|---|---|---|---|---|---|---|---|")

            def ratio(value) -> str:
                return "-" if value is None else f"{value:.3f}"

            for r in memory:
                md.append(f"| {r['workers']} | {r['used_before_mib']:.0f} | {r['used_after_mib']:.0f} | "
                          f"{r['added_mib']:.0f} | {r['added_min_mib']:.0f} - {r['added_max_mib']:.0f} | "
                          f"{ratio(r['per_extra_worker_over_tables_added'])} | {r['private_mib']:.0f} | "
                          f"{r['shared_segments_mib']:.0f} | {r['own_mib']:.0f} | "
                          f"{ratio(r['per_extra_worker_over_tables_own'])} |")
            md.append("\nA worker's private memory does not grow with the tables (they are in the shared "
                      "segment); it is the process itself: Python, ONNX Runtime, grpcio, numpy, FastAPI / "
                      "uvicorn (TensorFlow is not imported by a server of `.onnx` models: TF Serving's messages come "
                      "from `server/tfserving/messages.py`).")
            md.append("")
        if not args.skip_throughput:
            small = work / "small"
            small.mkdir()
            dlrm_onnx.build(small / "model.onnx", rows=20_000, dim=DIM)
            load, summary = measure_throughput(small, args.load_workers, args.seconds, work, args.load_rounds)
            payload["throughput"] = {"rounds": load, "summary": summary}
            first = args.load_workers[0]
            md.append(f"## Throughput: batch 1, 26 x 20,000 x 16 tables, {args.load_rounds} rounds\n\n"
                      f"Medians over the rounds; \"vs {first}\": the median of each round's req/s against the same "
                      f"round's {first} worker(s).\n\n"
                      f"| workers | edge | req/s | p99 (ms) | vs {first} | errors |\n|---|---|---|---|---|---|")
            for r in summary:
                md.append(f"| {r['workers']} | {r['edge']} | {r['req_per_s']:.0f} | {r['p99_ms']:.2f} | "
                          f"{r['vs_first']:.2f}x | {r['errors']} |")
            md.append("\nEvery round:\n\n| round | workers | edge | req/s | p50 (ms) | p99 (ms) | errors |\n"
                      "|---|---|---|---|---|---|---|")
            for r in load:
                md.append(f"| {r['round']} | {r['workers']} | {r['edge']} | {r['req_per_s']:.0f} | {r['p50_ms']:.2f} | "
                          f"{r['p99_ms']:.2f} | {r['errors']} |")
    payload["machine"]["load_average_at_the_end"] = os.getloadavg()
    md[0] = (f"# workers: N (issue 24)\n\n{os.cpu_count()} CPUs, load average at the start "
             f"{', '.join(f'{x:.1f}' for x in payload['machine']['load_average'])}, at the end "
             f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} (a shared machine moves these figures).\n")
    write_results("workers", payload, "\n".join(md), args.out_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
