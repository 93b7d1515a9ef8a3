"""``bench_server``'s report: the figures table, and each of our rows against the better peer
(own APIs, the Open Inference Protocol, like for like on ONNX Runtime) with the target met or not.
Pure formatting of the run's rows; writes nothing.
"""

from __future__ import annotations

import os
import platform
import time

TARGET = 1.5  # ours' req/s over the better peer's, at equal or lower p99


def _compare(rows: list[dict], mine, peers_of, batches, table: str, lines: list, comparisons: list) -> None:
    """One comparison line per ours row ``mine(r)`` against the best row of ``peers_of(r, rows)``
    (under the table header, the last two of ``lines``; no rows: a sentence instead of the table)."""
    before = len(comparisons)
    for protocol in ("HTTP", "gRPC"):
        for batch in batches:
            ours = [r for r in rows if r["protocol"] == protocol and r["batch"] == batch and mine(r)]
            for best in sorted(ours, key=lambda r: -r["rps"]):
                peers = peers_of(best, rows)
                if not peers:
                    continue
                peer = max(peers, key=lambda r: r["rps"])
                ratio = best["rps"] / peer["rps"]
                p99 = best["p99_ms"] / peer["p99_ms"]
                met = ratio >= TARGET and p99 <= 1.0
                comparisons.append({"table": table, "protocol": protocol, "batch": batch, "ours_api": best["api"],
                                    "ours_runtime": best["runtime"],
                                    "peer": f"{peer['server']} {peer['api']} ({peer['runtime']})",
                                    "rps_ratio": ratio, "p99_ratio": p99, "target_met": met})
                lines.append(f"| {protocol} | {batch} | {best['api']} ({best['runtime']}) | {peer['server']} "
                             f"({peer['api']}, {peer['runtime']}) | {ratio:.2f}x | {p99:.2f} | "
                             f"{'yes' if met else 'no'} |")
    if len(comparisons) == before:
        lines[-2:] = ["(none: no peer rows to compare with, see Peers above)"]


def report(result: dict, args) -> tuple[dict, str]:
    rows = result["rows"]
    notes = result["notes"]
    lines = [
        "# Server benchmark: ours vs plain FastAPI + TensorFlow vs KServe vs Triton",
        "",
        f"CTR demo model ({result['preset']} preset, the SavedModel's own variables), load generator in "
        f"another process: {args.concurrency} closed-loop clients, {args.seconds:g} s per cell after "
        f"{args.warmup:g} s warmup; {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
        f"load average {result['load_before'][0]:.1f} before / {os.getloadavg()[0]:.1f} after (other work "
        f"on the machine adds noise).",
        "",
        "Runtimes: the *tensorflow* rows (ours, plain FastAPI, KServe) run the SavedModel on TensorFlow; "
        "the *onnxruntime* rows run the ONNX conversion our onnxruntime backend caches, on ONNX Runtime: "
        "ours (same server, `backend: onnxruntime`) and Triton (`tritonserver` as nvidia-pytriton bundles "
        "it, ONNX Runtime in its Python backend, one instance per our session, our thread settings, no "
        "dynamic batcher as ours runs without batching here). Triton is sent the string feature already "
        "fingerprinted (the ONNX graph's uint64 input); every other server receives the strings. "
        "v2 = the Open Inference Protocol (KServe v2): REST JSON, REST binary (binary tensor extension, "
        "binary outputs), gRPC `ModelInfer` (raw contents). Every row's request bytes were answered like "
        "our in-process `process()` on the same runtime (allclose 1e-5) before it was timed.",
        "",
        f"Peers: KServe: {notes.get('kserve')}. Triton: {notes.get('triton')}. "
        f"Ours on ONNX Runtime: {notes.get('ours_onnxruntime')}.",
        "",
        "| protocol | batch | server | runtime | API | req/s | p50 ms | p99 ms | errors |",
        "|---|---:|---|---|---|---:|---:|---:|---:|",
    ]
    for r in sorted(rows, key=lambda r: (r["protocol"], r["batch"], r["server"] != "ours", -r["rps"])):
        lines.append(f"| {r['protocol']} | {r['batch']} | {r['server']} | {r['runtime']} | {r['api']} | "
                     f"{r['rps']:.1f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['errors']} |")
    header = ["| protocol | batch | ours (API, runtime) | better peer | req/s ratio | p99 ours / peer | target met |",
              "|---|---:|---|---|---:|---:|---|"]
    comparisons: list[dict] = []
    is_v2 = lambda r: r["api"].startswith("v2 ")  # noqa: E731
    same_cell = lambda a, b: a["protocol"] == b["protocol"] and a["batch"] == b["batch"]  # noqa: E731
    lines += ["", "Ours' own APIs against the better peer (any API, any runtime) on the same protocol and batch "
              f"(target: >= {TARGET}x requests/s at equal or lower p99):", "", *header]
    _compare(rows, lambda r: r["server"] == "ours" and not is_v2(r),
             lambda m, rs: [r for r in rs if r["server"] != "ours" and same_cell(r, m)],
             args.batches, "own_apis", lines, comparisons)
    lines += ["", "Open Inference Protocol (v2): ours against the better v2 peer (KServe or Triton, any v2 "
              "encoding) on the same protocol and batch:", "", *header]
    _compare(rows, lambda r: r["server"] == "ours" and is_v2(r),
             lambda m, rs: [r for r in rs if r["server"] != "ours" and is_v2(r) and same_cell(r, m)],
             args.batches, "v2", lines, comparisons)
    lines += ["", "Like for like: ours on ONNX Runtime against Triton, the same ONNX file, the same v2 API "
              "and encoding:", "", *header]
    _compare(rows, lambda r: r["server"] == "ours" and r["runtime"] == "onnxruntime",
             lambda m, rs: [r for r in rs if r["server"] == "Triton" and r["api"] == m["api"] and same_cell(r, m)],
             args.batches, "like_for_like", lines, comparisons)
    payload = {"benchmark": "server", "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
               "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                           "python": platform.python_version(),
                           "load_average_before": result.get("load_before"),
                           "load_average_after": list(os.getloadavg())},
               "settings": {"concurrency": args.concurrency, "seconds": args.seconds, "warmup": args.warmup,
                            "batches": list(args.batches)},
               **result, "comparisons": comparisons}
    return payload, "\n".join(lines)
