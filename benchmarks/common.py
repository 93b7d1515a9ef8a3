"""Helpers shared by the benchmarks: demo-model config, timed thread loops, memory, result files."""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def processor_config(paths, session_num: int) -> dict:
    """The model_config the benchmarks serve the demo model (``demo.layout.ModelPaths``) with."""
    return {
        "savedmodel_dir": str(paths.savedmodel_dir), "checkpoint_dir": str(paths.checkpoint_dir),
        "signature_name": "serving_default", "session_num": session_num,
        "use_per_session_threads": True, "select_session_policy": "MOD",
        "inter_op_parallelism_threads": 1, "intra_op_parallelism_threads": 1,
    }


def paired_ratio(values: Sequence[float], reference: Sequence[float]) -> float:
    """The median over rounds of ``values[i] / reference[i]``: each round's figures were taken
    next to each other in time, so a drift of the machine's speed cancels."""
    return statistics.median(v / r for v, r in zip(values, reference))


def run_threads(call: Callable[[int], object], threads: int, seconds: float,
                warmup_calls: int = 20) -> dict:
    """Call ``call(thread_index)`` in a loop from ``threads`` threads for ``seconds``.

    Returns calls/s over all threads and latency percentiles in microseconds.
    """
    for i in range(threads):
        for _ in range(warmup_calls):
            call(i)
    latencies: list[list[float]] = [[] for _ in range(threads)]
    start = threading.Barrier(threads + 1)
    stop_at = [0.0]

    def worker(i: int) -> None:
        own = latencies[i]
        start.wait()
        clock = time.perf_counter
        while True:
            t0 = clock()
            call(i)
            t1 = clock()
            own.append(t1 - t0)
            if t1 >= stop_at[0]:
                return

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    began = time.perf_counter()
    stop_at[0] = began + seconds
    start.wait()
    for t in pool:
        t.join()
    elapsed = time.perf_counter() - began
    flat = sorted(x for own in latencies for x in own)
    return {
        "calls": len(flat),
        "calls_per_s": len(flat) / elapsed,
        "p50_us": flat[len(flat) // 2] * 1e6,
        "p99_us": flat[min(len(flat) - 1, int(len(flat) * 0.99))] * 1e6,
        "mean_us": statistics.fmean(flat) * 1e6,
    }


def memory_of(pid: int | str = "self") -> dict:
    """Resident and proportional set size of a process, in MiB."""
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("Rss", "Pss"):
                out[key.lower() + "_mib"] = int(rest.split()[0]) / 1024
    return out


def write_results(name: str, payload: dict, markdown: str, out_dir: Path | None = None) -> None:
    """``name``.json and .md into ``out_dir`` (default ``benchmarks/results``)."""
    out_dir = Path(out_dir) if out_dir is not None else RESULTS
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(payload, indent=2) + "\n")
    (out_dir / f"{name}.md").write_text(markdown + "\n")
    print(markdown)
    print(f"\nwrote {out_dir / (name + '.json')} and .md")


def demo_paths(preset: str):
    """The demo CTR model of ``preset`` (``full``, ``small``), built on first use.

    ``auto``: the full preset if it is already built, else the small one (quick to build).
    """
    from demo.layout import read_model_card
    from demo.paths import DEFAULT_DEMO_DIR, ensure_demo_model

    if preset == "auto":
        card = read_model_card(DEFAULT_DEMO_DIR)
        preset = "full" if card is not None and card.get("preset") == "full" else "small"
    out_dir = DEFAULT_DEMO_DIR if preset == "full" else DEFAULT_DEMO_DIR.with_name(f"demo-{preset}")
    return ensure_demo_model(out_dir, preset=preset)


def loadgen(spec: dict) -> dict:
    """A closed-loop load generator (run it in its own process: it is GIL-bound).

    ``spec["concurrency"]`` threads, each with its own keep-alive connection (``kind`` ``http``:
    ``host``, ``port``, ``path``, ``content_type``, optional extra ``headers``) or channel
    (``grpc``: ``target``, ``method``, optional ``metadata``; with ``ca_file`` both use TLS), send the bytes of ``body_file``
    for ``seconds`` after ``warmup_seconds`` and record every latency. Optional: ``start_at``
    (a ``time.time()`` to start at, so that several generator processes measure the same window)
    and ``latencies_file`` (every recorded latency in seconds, saved with ``numpy.save``, for
    percentiles over several processes). Returns requests, errors, req/s, p50/p99 ms and the
    process's CPU seconds (``cpu_s``).
    """
    body = Path(spec["body_file"]).read_bytes()
    threads, seconds, warmup = spec["concurrency"], spec["seconds"], spec["warmup_seconds"]
    if spec["kind"] == "http":
        import http.client

        host, port = spec["host"], spec["port"]
        headers = {"Content-Type": spec["content_type"], **spec.get("headers", {})}

        def make():
            if spec.get("ca_file"):  # HTTPS, the server's certificate verified against this CA
                import ssl

                context = ssl.create_default_context(cafile=spec["ca_file"])
                conn = http.client.HTTPSConnection(host, port, timeout=60, context=context)
            else:
                conn = http.client.HTTPConnection(host, port, timeout=60)

            def call() -> bool:
                conn.request("POST", spec["path"], body, headers)
                resp = conn.getresponse()
                resp.read()
                return resp.status == 200
            return call
    else:
        import grpc

        def make():
            options = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
            if spec.get("ca_file"):
                credentials = grpc.ssl_channel_credentials(Path(spec["ca_file"]).read_bytes())
                channel = grpc.secure_channel(spec["target"], credentials, options=options)
            else:
                channel = grpc.insecure_channel(spec["target"], options=options)
            stub = channel.unary_unary(spec["method"])
            metadata = tuple(tuple(kv) for kv in spec.get("metadata", []))

            def call() -> bool:
                stub(body, metadata=metadata, timeout=60)
                return True
            return call

    latencies: list[list[float]] = [[] for _ in range(threads)]
    errors = [0] * threads
    phase = {"record_from": 0.0, "stop_at": 0.0}
    barrier = threading.Barrier(threads + 1)

    def worker(i: int) -> None:
        call = make()
        own = latencies[i]
        barrier.wait()
        clock = time.perf_counter
        while True:
            t0 = clock()
            try:
                ok = call()
            except Exception:
                ok = False
                call = make()
            t1 = clock()
            if t0 >= phase["record_from"]:
                own.append(t1 - t0)
                if not ok:
                    errors[i] += 1
            if t1 >= phase["stop_at"]:
                return

    pool = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
    for t in pool:
        t.start()
    if spec.get("start_at"):
        time.sleep(max(0.0, spec["start_at"] - time.time()))
    cpu0 = time.process_time()
    now = time.perf_counter()
    phase["record_from"] = now + warmup
    phase["stop_at"] = now + warmup + seconds
    barrier.wait()
    for t in pool:
        t.join()
    flat = sorted(x for own in latencies for x in own)
    if spec.get("latencies_file"):
        import numpy as np

        np.save(spec["latencies_file"], np.asarray(flat, dtype=np.float64))
    n = len(flat)
    return {"requests": n, "errors": sum(errors), "rps": n / seconds,
            "p50_ms": flat[n // 2] * 1e3 if n else None,
            "p99_ms": flat[min(n - 1, int(n * 0.99))] * 1e3 if n else None,
            "cpu_s": time.process_time() - cpu0}


def make_peer_venv(path: Path, packages: list[str]) -> None:
    """A separate virtual environment for a peer server (their pins conflict with ours), made
    with the system's python3.11 when there is one, with ``packages`` from the registry."""
    import shutil
    import subprocess
    import sys

    python = shutil.which("python3.11") or shutil.which("python3") or sys.executable
    subprocess.run([python, "-m", "venv", str(path)], check=True)
    subprocess.run([str(path / "bin" / "pip"), "install", "--quiet", *packages], check=True)



def loadgen_command(spec_file: Path) -> list[str]:
    """The command that runs :func:`loadgen` on a JSON spec file in a child process (it prints
    the result as one JSON line)."""
    return [sys.executable, "-m", "benchmarks.common", "--loadgen", str(spec_file)]


if __name__ == "__main__":  # the load generator's child process (loadgen_command)
    if sys.argv[1:2] != ["--loadgen"] or len(sys.argv) != 3:
        sys.exit("usage: python -m benchmarks.common --loadgen SPEC.json")
    print(json.dumps(loadgen(json.loads(Path(sys.argv[2]).read_text()))))
