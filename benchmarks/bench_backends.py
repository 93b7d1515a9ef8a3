"""TensorFlow vs ONNX Runtime on the demo CTR model, through the SessionGroup.

Both backends serve the same SavedModel + newest full checkpoint (ORT: converted once with
tf2onnx, checked against TF, cached under ``artifacts/onnx_cache``). Each configuration is a
SessionGroup with ``session_num`` 1/2/4, per-session pools of 1 intra / 1 inter thread, policy
MOD, called from ``session_num`` threads (one per lane) with numpy feeds built once, at batch 1
and 256. ORT's figure includes the processor-side string fingerprints (6 tokens per row).

Memory: resident set of one process holding an ORT group of 4 sessions vs 1 session (target
<= 1.1x: the sessions share one copy of the weights), measured in child processes that never
import TensorFlow (the conversion is cached before they start); TF's group for reference.

    .venv/bin/python -m benchmarks.bench_backends [--preset full|small] [--seconds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from benchmarks.common import RESULTS, demo_paths, memory_of, run_threads, write_results

BATCHES = (1, 256)
SESSIONS = (1, 2, 4)
BACKENDS = ("tensorflow", "onnxruntime")
CACHE_DIR = RESULTS.parent.parent / "artifacts" / "onnx_cache"


def open_group(paths, backend: str, session_num: int):
    from processor.config import ModelConfig
    from processor.engine.open_group import open_session_group
    from processor.store.model_version import ModelVersion

    config = ModelConfig.from_dict({
        "savedmodel_dir": str(paths.savedmodel_dir), "backend": backend, "session_num": session_num,
        "use_per_session_threads": True, "select_session_policy": "MOD",
        "inter_op_parallelism_threads": 1, "intra_op_parallelism_threads": 1,
    })
    version = ModelVersion(paths.steps[-1], -1, full_prefix=str(paths.latest_checkpoint_prefix),
                           savedmodel_dir=str(paths.savedmodel_dir))
    return open_session_group(config, version)


def throughput(paths, seconds: float) -> list[dict]:
    from demo.synthetic_data import synthetic_batch

    rows = []
    fetches = ("probability",)
    for backend in BACKENDS:
        for sessions in SESSIONS:
            group = open_group(paths, backend, sessions)
            try:
                for batch in BATCHES:
                    feeds = [synthetic_batch(batch, 100 + i) for i in range(sessions)]
                    result = run_threads(lambda i: group.run_on(i, feeds[i], fetches), sessions, seconds)
                    rows.append({"backend": backend, "batch": batch, "session_num": sessions,
                                 "threads": sessions, **{k: round(v, 1) for k, v in result.items()}})
                    print(json.dumps(rows[-1]), flush=True)
            finally:
                group.close()
    return rows


def memory_child(backend: str, sessions: int, preset: str) -> None:
    """Load a group, serve a few requests on every lane, print memory as JSON."""
    from demo.synthetic_data import synthetic_batch

    group = open_group(demo_paths(preset), backend, sessions)
    feeds = synthetic_batch(256, 1)
    for _ in range(5):
        for lane in range(sessions):
            group.run_on(lane, feeds, ("probability",))
    print(json.dumps({**memory_of(), "tensorflow_imported": "tensorflow" in sys.modules}), flush=True)
    group.close()


def memory(preset: str) -> dict:
    out = {}
    for backend in BACKENDS:
        for sessions in (1, 4):
            child = subprocess.run(
                [sys.executable, "-m", "benchmarks.bench_backends", "--preset", preset,
                 "--memory-child", backend, str(sessions)],
                capture_output=True, text=True, check=True,
                env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "SP_ONNX_CACHE_DIR": str(CACHE_DIR)})
            out[f"{backend}_{sessions}"] = json.loads(child.stdout.strip().splitlines()[-1])
    for backend in BACKENDS:
        out[f"{backend}_rss_ratio_4_vs_1"] = round(out[f"{backend}_4"]["rss_mib"] / out[f"{backend}_1"]["rss_mib"], 3)
    return out


def markdown(rows: list[dict], mem: dict | None, preset: str) -> str:
    lines = [f"# TensorFlow vs ONNX Runtime, demo CTR model ({preset} preset), {os.cpu_count()} CPUs", "",
             "| batch | session_num = threads | TF req/s | TF p99 us | ORT req/s | ORT p99 us | ORT / TF |",
             "|---|---|---|---|---|---|---|"]
    index = {(r["backend"], r["batch"], r["session_num"]): r for r in rows}
    for batch in BATCHES:
        for sessions in SESSIONS:
            tf_row = index[("tensorflow", batch, sessions)]
            ort_row = index[("onnxruntime", batch, sessions)]
            lines.append(f"| {batch} | {sessions} | {tf_row['calls_per_s']:.0f} | {tf_row['p99_us']:.0f} | "
                         f"{ort_row['calls_per_s']:.0f} | {ort_row['p99_us']:.0f} | "
                         f"{ort_row['calls_per_s'] / tf_row['calls_per_s']:.2f}x |")
    if mem:
        lines += ["", "| memory (one process) | RSS MiB | PSS MiB | TF imported |", "|---|---|---|---|"]
        for backend in BACKENDS:
            for sessions in (1, 4):
                m = mem[f"{backend}_{sessions}"]
                lines.append(f"| {backend}, session_num={sessions} | {m['rss_mib']:.0f} | {m['pss_mib']:.0f} | "
                             f"{m['tensorflow_imported']} |")
        lines.append("")
        lines.append(f"ORT RSS 4 sessions / 1 session: {mem['onnxruntime_rss_ratio_4_vs_1']}x (target <= 1.1x); "
                     f"TF: {mem['tensorflow_rss_ratio_4_vs_1']}x")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="full", choices=("full", "small"))
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--memory-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("SP_ONNX_CACHE_DIR", str(CACHE_DIR))
    if args.memory_child:
        memory_child(args.memory_child[0], int(args.memory_child[1]), args.preset)
        return
    paths = demo_paths(args.preset)
    group = open_group(paths, "onnxruntime", 1)  # converts (once) before any timing
    conversion = group.backend.describe()["model"]
    group.close()
    load_before = os.getloadavg()
    rows = throughput(paths, args.seconds)
    load_after = os.getloadavg()
    mem = None if args.skip_memory else memory(args.preset)
    payload = {"preset": args.preset, "cpus": os.cpu_count(), "seconds_per_point": args.seconds,
               "load_average_before_after": [round(load_before[0], 2), round(load_after[0], 2)],
               "settings": "per-session pools, intra=1, inter=1, policy MOD, one calling thread per lane",
               "ort_conversion": conversion, "rows": rows, "memory": mem}
    write_results("backends", payload, markdown(rows, mem, args.preset))


if __name__ == "__main__":
    main()
