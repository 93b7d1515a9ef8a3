"""process() end to end vs the raw engine call, and memory of a session group.

The limit is a tight loop on a bare TensorFlow Session (the same SavedModel + checkpoint, the
same ConfigProto: intra/inter threads and one inter-op pool per session) fed with numpy arrays
built once. ``process()`` takes serialized PredictRequest bytes and returns PredictResponse
bytes. Both run at batch 1 and 256, from 1/2/4 calling threads, at session_num 1/2/4.

Memory: resident (RSS) and proportional (PSS) set size of one process serving the model at
session_num 1 and 4, and of four separate session_num=1 processes together.

    .venv/bin/python -m benchmarks.bench_processor [--preset full|small] [--seconds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from benchmarks.common import demo_paths, memory_of, processor_config, run_threads, write_results

BATCHES = (1, 256)
THREADS = (1, 2, 4)
SESSIONS = (1, 2, 4)


class RawEngine:
    """The limit: plain TF, same session settings, pre-built numpy feeds."""

    def __init__(self, paths, session_num: int) -> None:
        import tensorflow as tf

        cfg = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)
        for _ in range(session_num):
            cfg.session_inter_op_thread_pool.add(num_threads=1)
        self.graph = tf.Graph()
        self.sess = tf.compat.v1.Session(graph=self.graph, config=cfg)
        meta = tf.compat.v1.saved_model.loader.load(self.sess, ["serve"], str(paths.savedmodel_dir))
        self.sess.run(meta.saver_def.restore_op_name,
                      {meta.saver_def.filename_tensor_name: str(paths.latest_checkpoint_prefix)})
        sig = meta.signature_def["serving_default"]
        self.aliases = list(sig.inputs)
        feeds = [self.graph.get_tensor_by_name(sig.inputs[a].name) for a in self.aliases]
        fetches = [self.graph.get_tensor_by_name(sig.outputs[a].name) for a in sig.outputs]
        self.fn = self.sess.make_callable(fetches, feeds, accept_options=True)
        self.options = [tf.compat.v1.RunOptions(inter_op_thread_pool=i) for i in range(session_num)]

    def caller(self, feeds: dict[str, np.ndarray]):
        args = [feeds[a] for a in self.aliases]
        options, fn = self.options, self.fn
        return lambda i: fn(*args, options=options[i % len(options)])

    def close(self) -> None:
        self.sess.close()


def throughput(paths, seconds: float) -> list[dict]:
    from demo.synthetic_data import synthetic_batch
    from processor import codec
    from processor.processor import Processor

    rows = []
    for session_num in SESSIONS:
        raw = RawEngine(paths, session_num)
        proc = Processor.create("bench", json.dumps(processor_config(paths, session_num)))
        for batch in BATCHES:
            feeds = synthetic_batch(batch, seed=batch)
            request = codec.encode_request(feeds)
            raw_call = raw.caller(feeds)
            process = proc.process
            for threads in THREADS:
                r = run_threads(raw_call, threads, seconds)
                p = run_threads(lambda i: process(request), threads, seconds)
                row = {"session_num": session_num, "batch": batch, "threads": threads,
                       "raw": r, "process": p,
                       "throughput_ratio": p["calls_per_s"] / r["calls_per_s"],
                       "added_p50_us": p["p50_us"] - r["p50_us"]}
                rows.append(row)
                print(f"session_num={session_num} batch={batch:3d} threads={threads}: "
                      f"raw {r['calls_per_s']:8.0f}/s p50 {r['p50_us']:7.0f} us | "
                      f"process {p['calls_per_s']:8.0f}/s p50 {p['p50_us']:7.0f} us | "
                      f"ratio {row['throughput_ratio']:.2f}", flush=True)
        proc.close()
        raw.close()
    return rows


def memory_child(session_num: int, hold_seconds: float, preset: str) -> None:
    """Load the model, serve a few requests, print memory as JSON, optionally wait."""
    from demo.synthetic_data import synthetic_batch
    from processor import codec
    from processor.processor import Processor

    paths = demo_paths(preset)
    proc = Processor.create("mem", json.dumps(processor_config(paths, session_num)))
    request = codec.encode_request(synthetic_batch(256, 1))
    for _ in range(20):
        assert proc.process(request)[0] == 200
    print(json.dumps(memory_of()), flush=True)
    time.sleep(hold_seconds)


def _spawn(session_num: int, hold: float, preset: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "benchmarks.bench_processor", "--memory-child",
                             str(session_num), "--hold", str(hold), "--preset", preset],
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})


def memory(preset: str) -> dict:
    out = {}
    for n in (1, 4):
        child = _spawn(n, 0, preset)
        out[f"session_num_{n}"] = json.loads(child.stdout.readline())
        child.wait()
    # Four separate processes alive together: PSS splits the shared pages fairly among them.
    children = [_spawn(1, 30, preset) for _ in range(4)]
    readings = [json.loads(c.stdout.readline()) for c in children]
    pss_together = [memory_of(c.pid) for c in children]
    for c in children:
        c.kill()
        c.wait()
    out["four_processes"] = {
        "rss_mib": sum(r["rss_mib"] for r in readings),
        "pss_mib": sum(m["pss_mib"] for m in pss_together),
    }
    return out


def markdown(rows: list[dict], mem: dict | None, preset: str) -> str:
    lines = [f"# process() vs raw TensorFlow (demo CTR model, preset {preset})", "",
             "| session_num | batch | threads | raw calls/s | process calls/s | ratio | raw p50 us | process p50 us | added p50 us |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['session_num']} | {r['batch']} | {r['threads']} | {r['raw']['calls_per_s']:.0f} | "
                     f"{r['process']['calls_per_s']:.0f} | {r['throughput_ratio']:.2f} | "
                     f"{r['raw']['p50_us']:.0f} | {r['process']['p50_us']:.0f} | {r['added_p50_us']:.0f} |")
    if mem:
        base = mem["session_num_1"]
        lines += ["", "| memory | RSS MiB | PSS MiB | RSS vs session_num=1 |", "|---|---|---|---|"]
        for key in ("session_num_1", "session_num_4", "four_processes"):
            m = mem[key]
            lines.append(f"| {key} | {m['rss_mib']:.0f} | {m['pss_mib']:.0f} | {m['rss_mib'] / base['rss_mib']:.2f}x |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="full", choices=["full", "small"])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--memory-child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--hold", type=float, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        memory_child(args.memory_child, args.hold, args.preset)
        return
    paths = demo_paths(args.preset)
    rows = throughput(paths, args.seconds)
    mem = None if args.skip_memory else memory(args.preset)
    write_results("processor", {"preset": args.preset, "cpus": os.cpu_count(), "rows": rows, "memory": mem},
                  markdown(rows, mem, args.preset))


if __name__ == "__main__":
    main()
