"""The cost of timeline tracing: process() with the timeline keys absent, present but off, and on.

Modes, each its own Processor on the demo CTR model (session_num 1, one inter/intra thread),
called from one thread with the same serialized request:

* ``absent``    - no timeline keys (the baseline);
* ``finished``  - keys present, all traces taken: the steady state of a configured model
                  (DataPlane dropped the tracer; one empty-dict check per request);
* ``counting``  - keys present, ``timeline_start_step`` not reached yet: every request is
                  counted under the tracer's lock, none traced;
* ``traced``    - every request traced (interval 1, huge count): FULL_TRACE run, stage timing,
                  a StepStats file written per request by the writer thread.

The untraced modes alternate call by call (absent, absent 2nd, finished, counting, ...), so
machine noise hits them alike; ``absent 2nd`` is a second processor without the keys, and its
difference from ``absent`` (an A/A comparison) is the noise floor a difference must exceed to
be measurable. ``traced`` alternates with ``absent`` the same way. A micro-benchmark times the
per-request decision itself (nanoseconds).

    .venv/bin/python -m benchmarks.bench_tracing [--preset small|full] [--calls 3000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import timeit
from pathlib import Path

from benchmarks.common import demo_paths, write_results

BATCHES = (1, 64)
UNTRACED = ("absent", "absent 2nd", "finished", "counting")


def config(paths, mode: str, trace_dir: str) -> dict:
    base = {
        "savedmodel_dir": str(paths.savedmodel_dir), "checkpoint_dir": str(paths.checkpoint_dir),
        "signature_name": "serving_default", "session_num": 1,
        "inter_op_parallelism_threads": 1, "intra_op_parallelism_threads": 1,
        "file_system_poll_wait_seconds": 0,
    }
    timeline = {
        "absent": None,
        "finished": (0, 1, 1),
        "counting": (10**15, 1, 1),
        "traced": (0, 1, 10**12),
    }[mode]
    if timeline is not None:
        base.update(timeline_start_step=timeline[0], timeline_interval_step=timeline[1],
                    timeline_trace_count=timeline[2], timeline_path=os.path.join(trace_dir, mode))
    return base


def decision_cost_ns() -> dict:
    """Nanoseconds per request for the tracing decision alone, outside any request."""
    from processor.tracing import Tracer

    with tempfile.TemporaryDirectory() as tmp:
        counting = Tracer("bench", 10**15, 1, 1, tmp)
        empty: dict = {}
        live = {"m": counting}
        n = 1_000_000

        def per_call(stmt, glb) -> float:
            return min(timeit.repeat(stmt, globals=glb, number=n, repeat=5)) / n * 1e9

        return {
            "off_check_ns": per_call("if d:\n    pass", {"d": empty}),
            "counting_ns": per_call("if d:\n    d.get('m').begin()", {"d": live}),
        }


def interleaved(calls: dict, n: int) -> dict[str, list[float]]:
    """Latencies (us) of ``n`` calls per mode, the modes alternating call by call (rotating order).

    Alternating single calls spreads machine noise evenly over the modes, so a difference in
    their distributions is the modes' own.
    """
    modes = list(calls)
    for call in calls.values():
        for _ in range(50):
            call()
    lat: dict[str, list[float]] = {m: [] for m in modes}
    clock = time.perf_counter_ns
    for i in range(n):
        for j in range(len(modes)):
            mode = modes[(i + j) % len(modes)]
            t0 = clock()
            calls[mode]()
            lat[mode].append((clock() - t0) / 1000)
    return lat


def traced_calls(absent, proc, request, n: int) -> list[float]:
    """Latencies (us) of traced requests, alternating with untraced ones (as the untraced modes).

    The writer is drained (untimed) after each traced call, so timed calls never overlap a
    background write; the write's own time is reported from the tracer's stats.
    """
    clock = time.perf_counter_ns
    lat = []
    for _ in range(n):
        absent()
        t0 = clock()
        proc.process(request)
        lat.append((clock() - t0) / 1000)
        proc.tracer.flush(60)
    return lat


def stats_of(values: list[float]) -> dict:
    xs = sorted(values)
    k = len(xs) // 10
    trimmed = xs[k:len(xs) - k] or xs
    return {"calls": len(xs), "p25_us": xs[len(xs) // 4], "p50_us": xs[len(xs) // 2],
            "p75_us": xs[3 * len(xs) // 4], "trimmed_mean_us": statistics.fmean(trimmed)}


def measure(paths, calls: int, trace_dir: str) -> dict:
    from demo.synthetic_data import synthetic_batch
    from processor import codec
    from processor.processor import Processor

    procs = {mode: Processor.create("bench", json.dumps(config(paths, mode.split()[0], trace_dir)))
             for mode in (*UNTRACED, "traced")}
    requests = {b: codec.encode_request(synthetic_batch(b, seed=b)) for b in BATCHES}
    procs["finished"].process(requests[1])  # takes its one trace; the tracer is done
    procs["finished"].tracer.flush()
    assert not procs["finished"].dataplane._tracers
    out: dict = {"batches": {}}
    for batch in BATCHES:
        request = requests[batch]
        fns = {m: (lambda p=procs[m].process: p(request)) for m in UNTRACED}
        row = {m: stats_of(v) for m, v in interleaved(fns, calls).items()}
        tracer = procs["traced"].tracer
        before = dict(tracer.stats)
        row["traced"] = stats_of(traced_calls(fns["absent"], procs["traced"], request, max(100, calls // 10)))
        after = dict(tracer.stats)
        for mode in UNTRACED[1:] + ("traced",):
            row[mode]["added_p50_us"] = row[mode]["p50_us"] - row["absent"]["p50_us"]
            row[mode]["added_trimmed_mean_us"] = row[mode]["trimmed_mean_us"] - row["absent"]["trimmed_mean_us"]
        row["traced"]["writes"] = {k: after[k] - before[k] for k in ("traced", "written", "write_errors", "dropped",
                                                                     "write_ms_total")}
        row["traced"]["write_ms_mean"] = (row["traced"]["writes"]["write_ms_total"]
                                          / max(1, row["traced"]["writes"]["written"]))
        files = list(Path(trace_dir, "traced").glob("timeline-*"))
        row["traced"]["file_bytes_mean"] = (statistics.fmean(f.stat().st_size for f in files[:200])
                                            if files else None)
        for f in files:
            f.unlink()
        out["batches"][str(batch)] = row
        print(f"batch {batch:3d}: absent p50 {row['absent']['p50_us']:.1f} us | "
              + " | ".join(f"{m} {row[m]['added_p50_us']:+.1f} us" for m in UNTRACED[1:] + ("traced",)),
              flush=True)
    for p in procs.values():
        p.close()
    return out


def markdown(result: dict) -> str:
    lines = [f"# Timeline tracing cost (demo CTR model, preset {result['preset']}, 1 calling thread, "
             f"{result['cpus']} CPUs, load average {result['loadavg_1min_before']:.1f} before / "
             f"{result['loadavg_1min_after']:.1f} after; untraced modes alternate call by call, "
             f"{result['calls']} calls each)", "",
             "| batch | mode | p25 us | p50 us | p75 us | trimmed mean us | added p50 us | added trimmed mean us |",
             "|---|---|---|---|---|---|---|---|"]
    for batch, row in result["batches"].items():
        for mode in (*UNTRACED, "traced"):
            r = row[mode]
            add = ("", "") if mode == "absent" else (f"{r['added_p50_us']:+.1f}", f"{r['added_trimmed_mean_us']:+.1f}")
            lines.append(f"| {batch} | {mode} | {r['p25_us']:.1f} | {r['p50_us']:.1f} | {r['p75_us']:.1f} | "
                         f"{r['trimmed_mean_us']:.1f} | {add[0]} | {add[1]} |")
        w = row["traced"]["writes"]
        lines.append(f"| {batch} | traced: files | {w['written']} written, {w['dropped']} dropped, "
                     f"{w['write_errors']} errors | {(row['traced']['file_bytes_mean'] or 0) / 1024:.1f} KiB each "
                     f"| writer {row['traced']['write_ms_mean']:.2f} ms per file, off the request path | | | |")
    d = result["decision"]
    lines += ["", "`absent 2nd` is a second processor without timeline keys: its difference from `absent` "
                  "is the noise floor (an A/A comparison). `traced`: every request traced, measured after "
                  "the untraced modes with the writer drained between calls.", "",
              f"Per-request decision alone: tracing off {d['off_check_ns']:.0f} ns "
              f"(one empty-dict check), counting {d['counting_ns']:.0f} ns (lock + counter)."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small", choices=["small", "full"])
    parser.add_argument("--calls", type=int, default=3000, help="calls per mode and batch")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    paths = demo_paths(args.preset)
    with tempfile.TemporaryDirectory(prefix="bench-tracing-") as trace_dir:
        result = {"preset": args.preset, "calls": args.calls, "cpus": os.cpu_count(),
                  "loadavg_1min_before": os.getloadavg()[0], "decision": decision_cost_ns()}
        result.update(measure(paths, args.calls, trace_dir))
        result["loadavg_1min_after"] = os.getloadavg()[0]
    write_results("tracing", result, markdown(result))


if __name__ == "__main__":
    main()
