"""``bench_batching``'s report: the figures table, the bare-engine ceiling, batching on against
off (the target) and ours against Triton at the same load. Pure formatting of the run's rows;
writes nothing.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time

TARGET_CLIENTS = 32  # the target: batching on >= TARGET_RATIO x the req/s of off at this many
TARGET_RATIO = 3.0   # clients, with p99 no worse


def _find(rows, **key):
    return next((r for r in rows if all(r[k] == v for k, v in key.items())), None)


def comparisons(rows: list[dict]) -> dict:
    on_off, vs_triton = [], []
    for r in rows:
        if r["server"] != "ours" or r["batching"] != "on":
            continue
        key = {k: r[k] for k in ("backend", "path", "clients", "batch")}
        off = _find(rows, server="ours", batching="off", **key)
        if off:
            rps, p99 = r["rps"] / off["rps"], r["p99_ms"] / off["p99_ms"]
            on_off.append({**key, "rps_on": r["rps"], "rps_off": off["rps"], "rps_ratio": rps,
                           "p99_on_ms": r["p99_ms"], "p99_off_ms": off["p99_ms"], "p99_ratio": p99,
                           "target_met": (rps >= TARGET_RATIO and p99 <= 1.0) if r["clients"] == TARGET_CLIENTS
                           else None})
    for r in rows:
        if r["server"] != "ours" or r["backend"] != "onnxruntime" or r["path"] == "process":
            continue
        key = {k: r[k] for k in ("path", "clients", "batch", "batching")}
        peer = _find(rows, server="triton", **key)
        if peer:
            rps, p99 = r["rps"] / peer["rps"], r["p99_ms"] / peer["p99_ms"]
            vs_triton.append({**key, "rps_ours": r["rps"], "rps_triton": peer["rps"], "rps_ratio": rps,
                              "p99_ours_ms": r["p99_ms"], "p99_triton_ms": peer["p99_ms"], "p99_ratio": p99,
                              "beats": rps > 1.0 and p99 <= 1.0})
    return {"on_vs_off": on_off, "ours_vs_triton": vs_triton}


def report(result: dict, args, settings: dict) -> tuple[dict, str]:
    from benchmarks.bench_request_path import machine

    m = machine()
    if "tensorflow" in sys.modules:
        m["tensorflow"] = sys.modules["tensorflow"].__version__
    m.update(platform=platform.platform(), load_average_before=result["load_before"],
             load_average_after=list(os.getloadavg()))
    rows, notes = result["rows"], result["notes"]
    comp = comparisons(rows)
    lines = [
        "# Server-side batching: on vs off, ours vs Triton's dynamic batcher",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores; Python {m['python']}, onnxruntime {m['onnxruntime']}"
        + (f", tensorflow {m['tensorflow']}" if "tensorflow" in m else "")
        + f"; load average {m['load_average_before'][0]:.1f} before / {m['load_average_after'][0]:.1f} after "
        "(other work on the machine adds noise).",
        "",
        f"Model: the demo CTR model ({result['preset']} preset, SavedModel variables), model_config "
        f"`benchmarks.common.processor_config` (session_num {args.sessions}, intra/inter-op threads 1). "
        f"Batching on: `\"batching\": {json.dumps(settings)}`; off: no `batching` key. "
        f"Every cell: {args.warmup:g} s warmup then {args.seconds:g} s measured, off and on back to back.",
        "",
        "Load: closed-loop clients (each sends its next request when the answer arrives). `process`: "
        "that many Python threads calling `Processor.process(bytes)` in the benchmark's process. "
        "`http` / `grpc`: `benchmarks.common.loadgen` processes (one keep-alive connection / channel per "
        f"client, pre-built request bytes), the clients split over ceil(clients / {args.clients_per_loadgen}) "
        f"processes (at most {args.max_loadgen_procs}) started on one clock, latencies merged; `client cores` "
        "is the CPU the generators used (client and server share the machine's cores).",
        "",
        f"Triton peer: {notes.get('triton')}. " + (
            "Triton Inference Server as nvidia-pytriton bundles it, the same ONNX file on ONNX Runtime in a "
            "`@batch` inference callable, one instance per our session, intra/inter-op 1, `max_batch_size` "
            f"{settings['max_batch_size']}, dynamic batching on: `max_queue_delay_microseconds` "
            f"{settings['batch_timeout_micros']}, preferred sizes {settings.get('allowed_batch_sizes') or 'none'}; "
            "off: no dynamic batcher. HTTP: KServe v2 with binary tensors; gRPC: `ModelInfer` with raw "
            "contents. It is sent the string feature already fingerprinted (the ONNX graph's uint64 input); "
            "ours hashes the strings itself. Its answers equal our process() outputs (checked, 1e-5)."
            if str(notes.get("triton", "")).startswith("ran") else ""),
    ]
    if notes.get("batching_on"):
        lines += ["", f"Batching on: {notes['batching_on']}."]
    lines += ["", "| server | backend | path | clients | batch | batching | req/s | p50 ms | p99 ms | errors | "
              "client cores |", "|---|---|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    order = {"process": 0, "http": 1, "grpc": 2}
    for r in sorted(rows, key=lambda r: (r["backend"], order[r["path"]], r["batch"], r["clients"],
                                         r["server"] != "ours", r["batching"])):
        cores = f"{r['client_cores']:.2f}" if r.get("client_cores") is not None else "in process"
        lines.append(f"| {r['server']} | {r['backend']} | {r['path']} | {r['clients']} | {r['batch']} | "
                     f"{r['batching']} | {r['rps']:,.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['errors']} | "
                     f"{cores} |")
    bare = notes.get("bare", {})
    if bare:
        lines += ["", f"Bare engine call (`benchmarks.bare_engine.bare_call`, {args.sessions} threads, one per session): "
                  "the most requests/s without batching at a request batch, and the rows/s ceiling at "
                  "max_batch_size.", "", "| backend | batch | calls/s | rows/s | p50 ms |", "|---|---:|---:|---:|---:|"]
        for backend, entries in bare.items():
            for e in entries:
                lines.append(f"| {backend} | {e['batch']} | {e['calls_per_s']:,.0f} | {e['rows_per_s']:,.0f} | "
                             f"{e['p50_ms']:.3f} |")
        lines += ["", "Req/s against the bare call at the same batch (ours, best over clients):", ""]
        for backend, entries in bare.items():
            limits = {e["batch"]: e["calls_per_s"] for e in entries}
            for batch in args.batches:
                for mode in ("off", "on"):
                    cell = [r for r in rows if r["server"] == "ours" and r["backend"] == backend
                            and r["batch"] == batch and r["batching"] == mode]
                    if cell:
                        best = max(cell, key=lambda r: r["rps"])
                        lines.append(f"- {backend}, batch {batch}, batching {mode}: {best['rps'] / limits[batch]:.2f}x "
                                     f"bare ({best['path']}, {best['clients']} clients)")
    if comp["on_vs_off"]:
        lines += ["", f"Batching on / off (target: >= {TARGET_RATIO:g}x req/s at {TARGET_CLIENTS} clients with "
                  "p99 on <= p99 off):", "",
                  "| backend | path | clients | batch | req/s on / off | p99 on / off | target |",
                  "|---|---|---:|---:|---:|---:|---|"]
        for c in sorted(comp["on_vs_off"], key=lambda c: (c["backend"], order[c["path"]], c["batch"], c["clients"])):
            met = "" if c["target_met"] is None else ("met" if c["target_met"] else "not met")
            lines.append(f"| {c['backend']} | {c['path']} | {c['clients']} | {c['batch']} | {c['rps_ratio']:.2f}x | "
                         f"{c['p99_ratio']:.2f} | {met} |")
    if comp["ours_vs_triton"]:
        lines += ["", "Ours (onnxruntime) / Triton at the same load (ours beats it when req/s > 1x at p99 <= 1):",
                  "", "| path | clients | batch | batching | req/s ours / Triton | p99 ours / Triton | beats |",
                  "|---|---:|---:|---|---:|---:|---|"]
        for c in sorted(comp["ours_vs_triton"], key=lambda c: (c["batching"], order[c["path"]], c["batch"],
                                                                  c["clients"])):
            lines.append(f"| {c['path']} | {c['clients']} | {c['batch']} | {c['batching']} | {c['rps_ratio']:.2f}x | "
                         f"{c['p99_ratio']:.2f} | {'yes' if c['beats'] else 'no'} |")
    payload = {"benchmark": "batching", "when": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": m,
               "settings": {"backends": args.backends, "paths": args.paths, "clients": args.clients,
                            "batches": args.batches, "seconds": args.seconds, "warmup": args.warmup,
                            "sessions": args.sessions, "batching": settings,
                            "clients_per_loadgen": args.clients_per_loadgen,
                            "max_loadgen_procs": args.max_loadgen_procs, "quick": args.quick},
               "preset": result["preset"], "notes": notes, "rows": rows, "comparisons": comp}
    return payload, "\n".join(lines)
