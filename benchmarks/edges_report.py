"""``bench_edges``'s report: the figures table (medians of the rounds) and the targets of issues
23, 44 and 50 (medians of the rounds' ratios), and the row names the run and the report share.
Pure formatting of the run's rows; writes nothing.
"""

from __future__ import annotations

import statistics

from benchmarks.common import paired_ratio

BATCHES = (1, 256)
NATIVE = "ours, batching, gRPC native"  # the default cpu_scheduling: "io_batch"
NATIVE_OTHER = "ours, batching, gRPC native, cpu_scheduling other"
NATIVE_SCHED_BATCH = "ours, batching, gRPC native, cpu_scheduling batch"
NATIVE_PYTHON = "ours, batching, gRPC python"
# gRPC ours paced by h2load at this share of process()'s req/s (per batch), below the native
# server's capacity: latency where the cores are not saturated, cpu_scheduling io_batch vs other
PACED = "gRPC ours, paced"
PACED_SHARE = {1: 0.3, 256: 0.6}
DEMO = "ours (demo, TensorFlow)"


def report(result: dict) -> str:
    rows = result["rows"]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["server"], r["edge"], r["batch"]), []).append(r)

    def find(server: str, edge: str, batch: int) -> list[dict]:
        return groups.get((server, edge, batch), [])

    def median(group: list[dict], key: str) -> float:
        return statistics.median(r[key] for r in group)

    order = "odd rounds in reverse order" if result.get("order") == "alternating" else "round after round"
    lines = [f"# Network edges vs the engine and the bare stack ({result['machine']})", "",
             f"{result['seconds']} s per row, {result.get('rounds', 1)} rounds (every row in turn, {order}: "
             "each figure is the median of its rounds, each ratio the median of the rounds' ratios); DLRM-like "
             ".onnx, session_num 2, per-session pools, intra-op 1; HTTP: wrk, 32 connections; gRPC: h2load, "
             f"8 connections x 4 streams; {result.get('placement', 'one machine')}.", "",
             "| server | edge | batch | req/s | p50 ms | p99 ms | server CPU us/req | server cs/req (vol + invol) "
             "| errors |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for (server, edge, batch), group in groups.items():
        cpu = "" if "cpu_us_per_request" not in group[0] else f"{median(group, 'cpu_us_per_request'):,.0f}"
        cs = "" if "voluntary_cs_per_request" not in group[0] else (
            f"{median(group, 'voluntary_cs_per_request'):.2f} + {median(group, 'involuntary_cs_per_request'):.2f}")
        errors = sum(r.get("errors", 0) for r in group) if "errors" in group[0] else ""
        lines.append(f"| {server} | {edge} | {batch} | {median(group, 'req_per_s'):,.0f} | "
                     f"{median(group, 'p50_ms'):.2f} | {median(group, 'p99_ms'):.2f} | {cpu} | {cs} | {errors} |")
    targets = []

    def ratio(a: list[dict], b: list[dict], key: str = "req_per_s") -> float | None:
        """The median of the rounds' a / b where both have rounds; else of the medians."""
        if not a or not b:
            return None
        if "round" in a[0] and "round" in b[0] and len(a) == len(b):
            return paired_ratio([r[key] for r in a], [r[key] for r in b])
        return median(a, key) / median(b, key)

    def target(what: str, value: float | None, bound: float, more: bool = True) -> None:
        ok = value is not None and (value >= bound if more else value <= bound)
        targets.append(f"| {what} | {'n/a' if value is None else f'{value:.2f}'} | "
                       f"{'>=' if more else '<='} {bound:g} | {'met' if ok else 'NOT met'} |")

    limit = {b: find("process() in-process", "process()", b) for b in BATCHES}
    http1 = find("ours", "HTTP ours", 1)
    if http1:  # issue 23's targets (left out with --grpc-server native-only)
        target("batch 1: HTTP ours / process() (2 threads)", ratio(http1, limit[1]), 0.5)
        target("batch 1: HTTP ours server CPU us/request", http1 and median(http1, "cpu_us_per_request"), 120, more=False)
        quiet = find("ours, access_log false", "HTTP ours", 1)
        target("batch 1: the same, access_log false", quiet and median(quiet, "cpu_us_per_request"), 120, more=False)
        target("batch 1: gRPC ours / bare grpcio floor (sync)", ratio(find("ours", "gRPC ours", 1),
                                                                       find("floor", "gRPC floor (sync)", 1)), 0.8)
        for edge in ("HTTP ours", "gRPC ours"):
            target(f"batch 256: {edge} / process()", ratio(find("ours", edge, 256), limit[256]), 0.85)
        for edge, base, bound in (("TF Serving REST JSON", "HTTP ours", 0.5), ("v2 REST JSON", "HTTP ours", 0.5),
                                  ("v2 REST binary", "HTTP ours", 0.7), ("TF Serving gRPC", "gRPC ours", 0.7),
                                  ("v2 gRPC", "gRPC ours", 0.7)):
            target(f"batch 1: {edge} / {base}", ratio(find("ours", edge, 1), find("ours", base, 1)), bound)
        on, off = find(DEMO, "HTTP ours, batching on", 1), find(DEMO, "HTTP ours, batching off", 1)
        if on and off:
            target("demo TF, 64 connections: batching on / off req/s", ratio(on, off), 2.0)
            target("demo TF, 64 connections: p99 on / off", ratio(on, off, "p99_ms"), 1.0, more=False)
    if targets:
        lines += ["", "| target (issue 23) | measured | bound | |", "|---|---:|---:|---|", *targets]
    if find(DEMO, "gRPC ours, batching on", 1):  # issue 44's edge targets
        targets.clear()
        for edge, load_ in (("HTTP", "wrk, 64 connections"), ("gRPC", "h2load, 64 streams")):
            on, off = find(DEMO, f"{edge} ours, batching on", 1), find(DEMO, f"{edge} ours, batching off", 1)
            target(f"demo TF, {edge} ({load_}), batch 1: batching on / off req/s", ratio(on, off), 2.5)
            target(f"demo TF, {edge} ({load_}), batch 1: p99 on / off", ratio(on, off, "p99_ms"), 1.0, more=False)
            target(f"demo TF, {edge}, batch 1: server context switches a request, batching on",
                   median(on, "voluntary_cs_per_request") + median(on, "involuntary_cs_per_request"), 0.5, more=False)
        lines += ["", "| target (issue 44) | measured | bound | |", "|---|---:|---:|---|", *targets]
    native1 = find(NATIVE, "gRPC ours", 1)
    if native1:  # issue 50's targets (--grpc-server native)
        targets.clear()
        target("batch 1: native gRPC server CPU us/request", median(native1, "cpu_us_per_request"), 60, more=False)
        target("batch 1: native gRPC ours / bare grpcio floor (sync)",
               ratio(native1, find("floor", "gRPC floor (sync)", 1)), 2.0)
        target("batch 1: native / Python gRPC server (both batching)",
               ratio(native1, find(NATIVE_PYTHON, "gRPC ours", 1)), 1.0)
        target("batch 256: native gRPC ours / process()", ratio(find(NATIVE, "gRPC ours", 256), limit[256]), 0.85)
        target("batch 256: the same, cpu_scheduling other",
               ratio(find(NATIVE_OTHER, "gRPC ours", 256), limit[256]), 0.85)
        target("batch 256: the same, cpu_scheduling batch",
               ratio(find(NATIVE_SCHED_BATCH, "gRPC ours", 256), limit[256]), 0.85)
        for b in BATCHES:  # what io_batch costs where the cores are not saturated (not an issue target)
            target(f"batch {b}, paced at {PACED_SHARE[b]:g} of process(): p99 io_batch / other",
                   ratio(find(NATIVE, PACED, b), find(NATIVE_OTHER, PACED, b), "p99_ms"), 1.1, more=False)
        target("batch 1: native gRPC server CPU us/request, cpu_scheduling batch",
               median(find(NATIVE_SCHED_BATCH, "gRPC ours", 1), "cpu_us_per_request"), 60, more=False)
        for edge in ("TF Serving gRPC", "v2 gRPC"):
            target(f"batch 256: native {edge} / native gRPC ours",
                   ratio(find(NATIVE, edge, 256), find(NATIVE, "gRPC ours", 256)), 0.9)
        lines += ["", "| target (issue 50) | measured | bound | |", "|---|---:|---:|---|", *targets]
    return "\n".join(lines)
