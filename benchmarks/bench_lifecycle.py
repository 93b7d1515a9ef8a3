"""Hot update cost: delta vs full reload of a 2M x 64 embedding table, under load.

A model with one 2,000,000 x 64 float32 table (512 MB) and a small MLP is served with
session_num=2 while two client threads send batch-256 requests. A separate writer process
publishes checkpoints (so its memory is not counted):

* deltas touching 1% of the table's rows (20,000 rows), one per second;
* then one full checkpoint of the whole table.

Measured in the serving process: time from a checkpoint's publication (the writer's clock after
the final rename) to the first moment the processor serves it (the poll interval is part of it,
and the engine's own apply time is reported apart); request p50/p99 in steady state vs during
continuous deltas; peak resident memory during deltas and during the full reload vs steady.

    .venv/bin/python -m benchmarks.bench_lifecycle [--rows 2000000] [--deltas 8]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks.common import memory_of, write_results

DIM = 64
IDS_PER_EXAMPLE = 8
POLL_SECONDS = 0.1


# --- writer side (child processes) ----------------------------------------------------------

def build(model_dir: Path, rows: int) -> None:
    import tensorflow as tf

    from demo.trainer.writer import CheckpointWriter

    graph = tf.Graph()
    with graph.as_default():
        ids = tf.compat.v1.placeholder(tf.int64, [None, IDS_PER_EXAMPLE], name="ids")
        table = tf.compat.v1.get_variable("embeddings/big", [rows, DIM], use_resource=True,
                                          initializer=tf.compat.v1.random_uniform_initializer(-0.05, 0.05))
        w = tf.compat.v1.get_variable("mlp/kernel", [DIM, 32], use_resource=True)
        v = tf.compat.v1.get_variable("mlp/out", [32, 1], use_resource=True)
        pooled = tf.reduce_mean(tf.nn.embedding_lookup(table, tf.math.floormod(ids, rows)), axis=1)
        score = tf.sigmoid(tf.matmul(tf.nn.relu(tf.matmul(pooled, w)), v), name="score")
        saver = tf.compat.v1.train.Saver()
        sig = tf.compat.v1.saved_model.predict_signature_def({"ids": ids}, {"score": score})
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            builder = tf.compat.v1.saved_model.Builder(str(model_dir / "savedmodel"))
            builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={"serving_default": sig},
                                                 saver=saver, clear_devices=True)
            builder.save()
            CheckpointWriter(sess, model_dir / "checkpoints" / "run_1", [table, w, v]).save_full(1)


def write_delta(model_dir: Path, step: int, fraction: float, seed: int) -> None:
    from demo.trainer.publish import publish_checkpoint
    from processor.checkpoint.tensor_file import read_tensors, write_tensors

    run = model_dir / "checkpoints" / "run_1"
    full = read_tensors(str(run / "model.ckpt-1"))
    rng = np.random.default_rng(seed)
    rows = full["embeddings/big"].shape[0]
    keys = np.sort(rng.choice(rows, int(rows * fraction), replace=False)).astype(np.int64)
    tensors = {"embeddings/big-keys": keys,
               "embeddings/big-values": rng.uniform(-0.05, 0.05, (len(keys), DIM)).astype(np.float32),
               "embeddings/big-freqs": np.ones(len(keys), np.int64),
               "embeddings/big-versions": np.full(len(keys), step, np.int64),
               "mlp/kernel": full["mlp/kernel"], "mlp/out": full["mlp/out"] * 1.01}
    publish_checkpoint(run / ".incremental_checkpoint", "incremental_model.ckpt", step,
                       lambda tmp: write_tensors(tmp, tensors))
    print(json.dumps({"published": time.time()}), flush=True)


def write_full(model_dir: Path, step: int, seed: int) -> None:
    from demo.trainer.publish import publish_checkpoint, update_state
    from processor.checkpoint.tensor_file import read_tensors, write_tensors

    run = model_dir / "checkpoints" / "run_1"
    tensors = read_tensors(str(run / "model.ckpt-1"))
    tensors["embeddings/big"] += np.float32(0.01)
    publish_checkpoint(run, "model.ckpt", step, lambda tmp: write_tensors(tmp, tensors))
    update_state(run, "model.ckpt")
    print(json.dumps({"published": time.time()}), flush=True)


def _child(*args: str) -> float:
    out = subprocess.run([sys.executable, "-m", "benchmarks.bench_lifecycle", *args], check=True,
                         capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1])["published"] if lines else 0.0


# --- serving side ---------------------------------------------------------------------------

class Watch:
    """Samples RSS and the served version label every millisecond or so."""

    def __init__(self, processor) -> None:
        self.processor = processor
        self.changes: list[tuple[float, str]] = []
        self.peak_rss = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        last = None
        while not self._stop.is_set():
            version = self.processor.manager.served_version()
            if version is not None and version.label != last:
                last = version.label
                self.changes.append((time.time(), last))
            self.peak_rss = max(self.peak_rss, memory_of()["rss_mib"])
            time.sleep(0.001)

    def reset_peak(self) -> None:
        self.peak_rss = 0.0

    def served_at(self, label: str, timeout: float = 120) -> float:
        deadline = time.time() + timeout
        while time.time() < deadline:
            for t, seen in self.changes:
                if seen == label:
                    return t
            time.sleep(0.005)
        raise TimeoutError(f"version {label} not served within {timeout} s")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class Load:
    """Two client threads sending one request in a loop; latencies collected per phase."""

    def __init__(self, processor, request: bytes, threads: int = 2) -> None:
        self.processor, self.request = processor, request
        self.latencies: list[float] = []
        self.failures = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(threads)]

    def _loop(self) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            status, _ = self.processor.process(self.request)
            self.latencies.append(time.perf_counter() - t0)
            self.failures += status != 200

    def take(self) -> dict:
        lat, self.latencies = sorted(self.latencies), []
        return {"requests": len(lat), "p50_ms": lat[len(lat) // 2] * 1e3,
                "p99_ms": lat[int(len(lat) * 0.99)] * 1e3}

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()


def measure(rows: int, deltas: int) -> dict:
    from processor import codec
    from processor.processor import Processor

    model_dir = Path(tempfile.mkdtemp(prefix="bench-lifecycle-"))
    _child("--build", str(model_dir), "--rows", str(rows))
    config = {"savedmodel_dir": str(model_dir / "savedmodel"), "checkpoint_dir": str(model_dir / "checkpoints"),
              "session_num": 2, "use_per_session_threads": True, "inter_op_parallelism_threads": 1,
              "intra_op_parallelism_threads": 1, "file_system_poll_wait_seconds": POLL_SECONDS}
    processor = Processor.create("bench", json.dumps(config))
    ids = np.random.default_rng(0).integers(0, rows, (256, IDS_PER_EXAMPLE), dtype=np.int64)
    load = Load(processor, codec.encode_request({"ids": ids}))
    watch = Watch(processor)
    watch.start()
    load.start()
    time.sleep(5)
    steady = load.take()
    steady_rss = memory_of()["rss_mib"]
    watch.reset_peak()

    delta_rows = []
    for k in range(deltas):
        step = 2 + k
        published = _child("--write-delta", str(model_dir), "--step", str(step), "--seed", str(k))
        served = watch.served_at(f"1+{step}")
        delta_rows.append({"written_to_served_s": served - published,
                           "apply_s": processor.manager.stats["last_delta_seconds"],
                           "requests_held_s": processor.manager.stats["last_delta_hold_seconds"]})
        time.sleep(max(0.0, 1.0 - (time.time() - published)))
    during_deltas = load.take()
    delta_peak = watch.peak_rss

    watch.reset_peak()
    published = _child("--write-full", str(model_dir), "--step", str(100))
    served = watch.served_at("100")
    full = {"written_to_served_s": served - published,
            "load_s": processor.manager.stats["last_full_load_seconds"], "peak_rss_mib": watch.peak_rss}
    during_full = load.take()
    load.stop()
    watch.stop()
    processor.close()
    return {
        "rows": rows, "dim": DIM, "delta_rows": int(rows * 0.01), "poll_seconds": POLL_SECONDS,
        "failures": load.failures, "steady": steady, "steady_rss_mib": steady_rss,
        "deltas": delta_rows, "during_deltas": during_deltas, "delta_peak_rss_mib": delta_peak,
        "full": full, "during_full": during_full,
        "p99_ratio_deltas_vs_steady": during_deltas["p99_ms"] / steady["p99_ms"],
        "rss_ratio_delta": delta_peak / steady_rss, "rss_ratio_full": full["peak_rss_mib"] / steady_rss,
    }


def markdown(r: dict) -> str:
    d = r["deltas"]
    med = sorted(x["written_to_served_s"] for x in d)[len(d) // 2]
    apply = sorted(x["apply_s"] for x in d)[len(d) // 2]
    held = sorted(x["requests_held_s"] for x in d)[len(d) // 2]
    return "\n".join([
        f"# Hot update: {r['rows']:,} x {r['dim']} table, delta = {r['delta_rows']:,} rows (1%), poll {r['poll_seconds']} s",
        "", "| update | written -> served (median) | engine time | requests held |", "|---|---|---|---|",
        f"| delta (1% rows) | {med * 1e3:.0f} ms | {apply * 1e3:.0f} ms read+apply | {held * 1e3:.1f} ms |",
        f"| full reload | {r['full']['written_to_served_s'] * 1e3:.0f} ms | {r['full']['load_s'] * 1e3:.0f} ms load+warmup | 0 (swap) |",
        "", "| phase | requests | p50 ms | p99 ms | peak RSS MiB | RSS vs steady |", "|---|---|---|---|---|---|",
        f"| steady | {r['steady']['requests']} | {r['steady']['p50_ms']:.2f} | {r['steady']['p99_ms']:.2f} | {r['steady_rss_mib']:.0f} | 1.00x |",
        f"| continuous deltas | {r['during_deltas']['requests']} | {r['during_deltas']['p50_ms']:.2f} | {r['during_deltas']['p99_ms']:.2f} | {r['delta_peak_rss_mib']:.0f} | {r['rss_ratio_delta']:.2f}x |",
        f"| full reload | {r['during_full']['requests']} | {r['during_full']['p50_ms']:.2f} | {r['during_full']['p99_ms']:.2f} | {r['full']['peak_rss_mib']:.0f} | {r['rss_ratio_full']:.2f}x |",
        "", f"p99 during deltas / steady: {r['p99_ratio_deltas_vs_steady']:.2f}x; failed requests: {r['failures']}",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--deltas", type=int, default=8)
    parser.add_argument("--build", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--write-delta", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--write-full", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--step", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build:
        return build(args.build, args.rows)
    if args.write_delta:
        return write_delta(args.write_delta, args.step, 0.01, args.seed)
    if args.write_full:
        return write_full(args.write_full, args.step, args.seed)
    result = measure(args.rows, args.deltas)
    write_results("lifecycle", result, markdown(result))


if __name__ == "__main__":
    main()
