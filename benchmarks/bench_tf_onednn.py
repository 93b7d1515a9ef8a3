"""TensorFlow with and without oneDNN: what serving's default costs or gains in speed.

Serving turns oneDNN off by default (``processor/tensorflow_env.py``: its
allocator keeps every buffer it allocated, so an unloaded version stayed resident; the memory
side is ``bench_model_memory``'s). Per round, a fresh process per setting
(``TF_ENABLE_ONEDNN_OPTS`` 1 or 0, read once when TensorFlow starts) serves the demo CTR model
(``--preset``) through ``process()`` from 2 threads at batch 1 and 256 (``--seconds`` each, after
a warm-up). Rounds alternate the settings' order (the machine's speed drifts); a ratio is the
median of the rounds' ratios. Writes ``benchmarks/results/tf_onednn.json`` and ``.md``.

    .venv/bin/python -m benchmarks.bench_tf_onednn [--preset small] [--rounds 3] [--seconds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.common import write_results

BATCHES = (1, 256)
ROOT = Path(__file__).resolve().parent.parent


def child(preset: str, seconds: float) -> dict:
    """In a fresh process (the environment set by the parent): calls/s per batch."""
    import tensorflow as tf  # noqa: F401 - started with the parent's TF_ENABLE_ONEDNN_OPTS

    from benchmarks.common import demo_paths, processor_config, run_threads
    from demo.synthetic_data import synthetic_batch
    from processor.codec import encode_request
    from processor.tensorflow_env import onednn_enabled
    from processor.processor import Processor

    processor = Processor.create("m", json.dumps(processor_config(demo_paths(preset), 2)))
    out = {"onednn": onednn_enabled(), "calls_per_s": {}}
    for batch in BATCHES:
        body = encode_request(synthetic_batch(batch, 5))
        for _ in range(20):
            processor.process(body)
        out["calls_per_s"][batch] = run_threads(lambda _i, b=body: processor.process(b), 2, seconds)["calls_per_s"]
    processor.close()
    return out


def bench(args) -> dict:
    rows = []
    for round_ in range(args.rounds):
        for setting in (("1", "0") if round_ % 2 == 0 else ("0", "1")):
            env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": setting, "TF_CPP_MIN_LOG_LEVEL": "2",
                   "PYTHONPATH": str(ROOT)}
            run = subprocess.run([sys.executable, "-m", "benchmarks.bench_tf_onednn", "--child", args.preset,
                                  "--seconds", str(args.seconds)], env=env, capture_output=True, text=True)
            if run.returncode:
                raise RuntimeError(f"TF_ENABLE_ONEDNN_OPTS={setting}: the child failed:\n{run.stderr[-3000:]}")
            row = {"round": round_, "setting": setting, **json.loads(run.stdout.strip().splitlines()[-1])}
            rows.append(row)
            print(f"round {round_} oneDNN {row['onednn']}: " + ", ".join(
                f"batch {b} {v:.0f}/s" for b, v in row["calls_per_s"].items()), flush=True)
    return {"machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()},
            "preset": args.preset, "seconds": args.seconds, "rounds": args.rounds, "rows": rows}


def markdown(result: dict) -> str:
    rows = result["rows"]

    def of(setting: str) -> list[dict]:
        return sorted((r for r in rows if r["setting"] == setting), key=lambda r: r["round"])

    on, off = of("1"), of("0")
    lines = [f"# TensorFlow with and without oneDNN ({result['machine']['cpus']} CPUs, "
             f"{result['machine']['processor']})", "",
             f"Demo CTR model ({result['preset']} preset), `process()` from 2 threads, {result['seconds']} s per "
             f"batch, {result['rounds']} rounds of a fresh process per setting (alternating order).", "",
             "| oneDNN | " + " | ".join(f"batch {b} calls/s" for b in BATCHES) + " |",
             "|---|" + "---:|" * len(BATCHES)]
    for label, group in (("on (TensorFlow's default)", on), ("off (serving's default)", off)):
        if group:
            lines.append(f"| {label} | " + " | ".join(
                f"{statistics.median(r['calls_per_s'][str(b)] for r in group):,.0f}" for b in BATCHES) + " |")
    if on and off:
        lines += ["", "| off / on | " + " | ".join(f"batch {b}" for b in BATCHES) + " |",
                  "|---|" + "---:|" * len(BATCHES),
                  "| calls/s (median of the rounds' ratios) | " + " | ".join(
                      f"{statistics.median(f['calls_per_s'][str(b)] / n['calls_per_s'][str(b)] for f, n in zip(off, on)):.2f}"
                      for b in BATCHES) + " |"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="small", choices=("small", "full"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--out-dir", type=Path, default=None)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.seconds)))
        return
    result = bench(args)
    write_results("tf_onednn", result, markdown(result), args.out_dir)


if __name__ == "__main__":
    main()
