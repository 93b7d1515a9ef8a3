"""Deltas that remove ids (issue 45): a table that churns keeps its size in the server.

A model with one embedding table of ``--rows`` raw ids (default 1,000,000) x 64 float32, kept by
the trainer as a hash table of its own (the writer's keyed tables: EmbeddingVariable export
format), is served from the DRAM store (``ev_storage_type`` 1, session_num 2) while two client
threads send batch-256 requests. A writer process (its memory is not the server's) publishes
``--deltas`` chained deltas (default 100), each adding ``--churn`` of the table as new ids and
removing as many held ids (default 1% each), one every ``--every`` seconds (default 1; later
when the last one is not served yet). The writer computes every delta before the serving is
measured (it stands for a trainer on other machines) and publishes each by moving it in.

Measured in the serving process:

* the served key count after each delta against the trainer's (equal, every delta);
* the server's memory after the first and after the last delta: its resident set (RSS) and the
  table's own arrays (model info: values, key index, metadata). Without removals the table would
  grow by the inserted rows (``deltas x churn x rows`` of ``4 x 64`` bytes and ~14 bytes of index
  each): shown beside, computed;
* request p50 / p99 in steady state and while the deltas land;
* each delta's publication-to-serving time (from its move into the run to its serving: the
  poll interval, the read and the apply).

    .venv/bin/python -m benchmarks.bench_delta_removals [--rows 1000000] [--deltas 100] [--churn 0.01]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.bench_lifecycle import Load
from benchmarks.common import memory_of, write_results

DIM = 64
IDS_PER_EXAMPLE = 8
STAND_IN_ROWS = 1000  # the graph's table variable: the served rows come from the keyed table
POLL_SECONDS = 0.1
TABLE = "embeddings/big"


# --- writer side (a child process) ----------------------------------------------------------

def writer(model_dir: Path, rows: int, churn: float, deltas: int) -> None:
    """Build the model and, with the real writer, its full and ``deltas`` chained deltas into a
    staging run; publish the full into the served run, then, per line read from stdin, the next
    delta (moved in: data first, index last). Prints one JSON line per checkpoint published: its
    step, when it was published, the trainer's id count. The deltas are computed before the
    serving is measured: the trainer stands for a job on other machines, whose diffing would
    otherwise take this small machine's cores from the server."""
    import tensorflow as tf

    from demo.trainer.publish import update_state
    from demo.trainer.writer import DELTA_BASENAME, DELTA_DIR, FULL_BASENAME, CheckpointWriter

    rng = np.random.default_rng(0)
    table = {"keys": np.unique(rng.integers(1, 2**62, rows)), "values": None}
    table["values"] = rng.uniform(-0.05, 0.05, (len(table["keys"]), DIM)).astype(np.float32)
    graph = tf.Graph()
    with graph.as_default():
        ids = tf.compat.v1.placeholder(tf.int64, [None, IDS_PER_EXAMPLE], name="ids")
        stand_in = tf.compat.v1.get_variable(TABLE, [STAND_IN_ROWS, DIM], use_resource=True)
        w = tf.compat.v1.get_variable("mlp/kernel", [DIM, 32], use_resource=True)
        v = tf.compat.v1.get_variable("mlp/out", [32, 1], use_resource=True)
        pooled = tf.reduce_mean(tf.nn.embedding_lookup(stand_in, tf.math.floormod(ids, STAND_IN_ROWS)), axis=1)
        score = tf.sigmoid(tf.matmul(tf.nn.relu(tf.matmul(pooled, w)), v), name="score")
        sig = tf.compat.v1.saved_model.predict_signature_def({"ids": ids}, {"score": score})
        sess = tf.compat.v1.Session(graph=graph)
        sess.run(tf.compat.v1.global_variables_initializer())
        builder = tf.compat.v1.saved_model.Builder(str(model_dir / "savedmodel"))
        builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={"serving_default": sig},
                                             saver=tf.compat.v1.train.Saver(), clear_devices=True)
        builder.save()
    stage, run = model_dir / "stage", model_dir / "checkpoints" / "run_1"
    write = CheckpointWriter(sess, stage, [stand_in, w, v], delta_mode="chain",
                             keyed_tables={TABLE: lambda: (table["keys"], table["values"])})
    write.save_full(1)
    counts = {1: len(table["keys"])}
    n = int(rows * churn)
    for step in range(2, deltas + 2):
        keep = np.ones(len(table["keys"]), bool)
        keep[rng.choice(len(keep), n, replace=False)] = False  # removed ids
        new = np.setdiff1d(rng.integers(1, 2**62, n + 16), table["keys"])[:n]  # new ids
        table["keys"] = np.concatenate([table["keys"][keep], new])
        table["values"] = np.concatenate([table["values"][keep],
                                          rng.uniform(-0.05, 0.05, (len(new), DIM)).astype(np.float32)])
        write.save_delta(step)
        counts[step] = len(table["keys"])

    def move_in(source: Path, target: Path, name: str) -> None:
        target.mkdir(parents=True, exist_ok=True)
        for f in sorted(source.glob(f"{name}.data-*")) + [source / f"{name}.index"]:
            os.replace(f, target / f.name)

    move_in(stage, run, f"{FULL_BASENAME}-1")
    update_state(run, FULL_BASENAME)
    print(json.dumps({"step": 1, "published": time.time(), "keys": counts[1]}), flush=True)
    for line in sys.stdin:
        step = int(line)
        move_in(stage / DELTA_DIR, run / DELTA_DIR, f"{DELTA_BASENAME}-{step}")
        print(json.dumps({"step": step, "published": time.time(), "keys": counts[step]}), flush=True)


# --- serving side ---------------------------------------------------------------------------

class CountedLoad(Load):
    """:class:`~benchmarks.bench_lifecycle.Load` counting latencies in 10-microsecond bins up to
    10 s, allocated once: the client's own bookkeeping does not grow the process while the
    server's memory is measured (a list of a float per request would, by ~32 bytes each)."""

    BIN = 1e-5

    def __init__(self, processor, request: bytes, threads: int = 2) -> None:
        super().__init__(processor, request, threads)
        self._counts = np.zeros(1_000_001, np.int64)

    def _loop(self) -> None:
        counts, last = self._counts, len(self._counts) - 1
        while not self._stop.is_set():
            t0 = time.perf_counter()
            status, _ = self.processor.process(self.request)
            counts[min(int((time.perf_counter() - t0) / self.BIN), last)] += 1
            self.failures += status != 200

    def take(self) -> dict:
        counts, self._counts[:] = self._counts.copy(), 0
        running = np.cumsum(counts)
        total = int(running[-1])

        def quantile(q: float) -> float:
            return (int(np.searchsorted(running, q * total)) + 0.5) * self.BIN * 1e3

        return {"requests": total, "p50_ms": quantile(0.5), "p99_ms": quantile(0.99)}

def settled_rss_mib() -> float:
    """RSS once the collector ran (a delta's temporaries are freed)."""
    gc.collect()
    time.sleep(0.2)
    return memory_of()["rss_mib"]


def table_bytes(processor) -> int:
    described = processor.model_info()["session_group"]["embedding"]["store"]["tables"][TABLE]["bytes"]
    return int(sum(described.values()))


def measure(rows: int, deltas: int, churn: float, steady_seconds: float, every: float) -> dict:
    from processor import codec
    from processor.processor import Processor

    model_dir = Path(tempfile.mkdtemp(prefix="bench-removals-"))
    child = subprocess.Popen([sys.executable, "-m", "benchmarks.bench_delta_removals", "--writer", str(model_dir),
                              "--rows", str(rows), "--churn", str(churn), "--deltas", str(deltas)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})

    def published() -> dict:
        while True:
            line = child.stdout.readline()
            if not line:
                raise RuntimeError("the writer process ended")
            if line.startswith("{"):
                return json.loads(line)

    first = published()
    config = {"savedmodel_dir": str(model_dir / "savedmodel"), "checkpoint_dir": str(model_dir / "checkpoints"),
              "ev_storage_type": 1, "delta_mode": "chain", "session_num": 2, "use_per_session_threads": True,
              "inter_op_parallelism_threads": 1, "intra_op_parallelism_threads": 1,
              "file_system_poll_wait_seconds": POLL_SECONDS}
    processor = Processor.create("bench", json.dumps(config))
    tables = processor.manager._current.group.backend._embedding.tables
    assert tables.tables[TABLE].size == first["keys"]
    ids = np.random.default_rng(1).choice(tables.held_ids(TABLE), (256, IDS_PER_EXAMPLE))
    load = CountedLoad(processor, codec.encode_request({"ids": ids}))
    load.start()
    time.sleep(steady_seconds)
    steady = load.take()
    steady_rss = settled_rss_mib()
    rows_log, mismatches = [], 0
    rss_first = bytes_first = None
    started = time.time()
    for k in range(deltas):
        step = 2 + k
        child.stdin.write(f"{step}\n")
        child.stdin.flush()
        written = published()
        deadline = time.time() + 120
        while processor.manager.served_version().delta_step != step:
            if time.time() > deadline:
                raise TimeoutError(f"delta {step} not served: {processor.model_info()['failed_versions']}")
            time.sleep(0.005)
        served_at = time.time()
        served_keys = processor.manager._current.group.backend._embedding.tables.tables[TABLE].size
        mismatches += served_keys != written["keys"]
        rows_log.append({"step": step, "trainer_keys": written["keys"], "served_keys": served_keys,
                         "publish_to_serve_s": served_at - written["published"],
                         "requests_held_s": processor.manager.stats["last_delta_hold_seconds"]})
        if k == 0:
            rss_first, bytes_first = settled_rss_mib(), table_bytes(processor)
        time.sleep(max(0.0, every - (time.time() - written["published"])))
    during = load.take()
    rss_last, bytes_last = settled_rss_mib(), table_bytes(processor)
    load.stop()
    child.stdin.close()
    child.wait(timeout=60)
    info = processor.model_info()["session_group"]["embedding"]["store"]["tables"][TABLE]
    processor.close()
    shutil.rmtree(model_dir, ignore_errors=True)  # the checkpoints: ~300 MB at the default size
    inserted = deltas * int(rows * churn)
    latencies = sorted(r["publish_to_serve_s"] for r in rows_log)
    return {
        "rows": rows, "dim": DIM, "deltas": deltas, "churn": churn, "ids_added_per_delta": int(rows * churn),
        "ids_removed_per_delta": int(rows * churn), "poll_seconds": POLL_SECONDS, "failures": load.failures,
        "key_count_mismatches": mismatches, "final_trainer_keys": rows_log[-1]["trainer_keys"],
        "final_served_keys": rows_log[-1]["served_keys"], "freed_rows_left": info["freed_rows"],
        "removed_rows": info.get("removed_rows"),
        "steady": steady, "steady_rss_mib": steady_rss, "during_deltas": during,
        "deltas_seconds": time.time() - started,
        "p99_ratio_deltas_vs_steady": during["p99_ms"] / steady["p99_ms"],
        "rss_after_first_mib": rss_first, "rss_after_last_mib": rss_last,
        "rss_change": rss_last / rss_first - 1,
        "table_bytes_after_first": bytes_first, "table_bytes_after_last": bytes_last,
        "table_bytes_change": bytes_last / bytes_first - 1,
        "growth_without_removals_mib": inserted * (4 * DIM + 14) / 2**20,
        "publish_to_serve_median_s": latencies[len(latencies) // 2],
        "publish_to_serve_p90_s": latencies[int(len(latencies) * 0.9)],
        "requests_held_median_s": sorted(r["requests_held_s"] for r in rows_log)[len(rows_log) // 2],
        "requests_held_max_s": max(r["requests_held_s"] for r in rows_log),
    }


def markdown(r: dict) -> str:
    return "\n".join([
        f"# Deltas that remove ids: {r['rows']:,} x {r['dim']} table, {r['deltas']} deltas of "
        f"+{r['ids_added_per_delta']:,} / -{r['ids_removed_per_delta']:,} ids (DRAM store, chain, poll {r['poll_seconds']} s)",
        "", "| check | value |", "|---|---|",
        f"| served key count = trainer's, every delta | {r['deltas'] - r['key_count_mismatches']} / {r['deltas']} "
        f"(last: {r['final_served_keys']:,} vs {r['final_trainer_keys']:,}) |",
        f"| server RSS after first -> last delta | {r['rss_after_first_mib']:.0f} -> {r['rss_after_last_mib']:.0f} MiB "
        f"({r['rss_change']:+.1%}) |",
        f"| the table's arrays after first -> last delta | {r['table_bytes_after_first'] / 2**20:.1f} -> "
        f"{r['table_bytes_after_last'] / 2**20:.1f} MiB ({r['table_bytes_change']:+.1%}) |",
        f"| growth without removals (computed: every inserted row kept) | +{r['growth_without_removals_mib']:.0f} MiB |",
        f"| request p99 steady -> during deltas | {r['steady']['p99_ms']:.2f} -> {r['during_deltas']['p99_ms']:.2f} ms "
        f"({r['p99_ratio_deltas_vs_steady']:.2f}x) |",
        f"| request p50 steady -> during deltas | {r['steady']['p50_ms']:.2f} -> {r['during_deltas']['p50_ms']:.2f} ms |",
        f"| requests steady / during deltas, failed | {r['steady']['requests']} / {r['during_deltas']['requests']}, "
        f"{r['failures']} |",
        f"| delta publication -> serving, median / p90 | {r['publish_to_serve_median_s'] * 1e3:.0f} / "
        f"{r['publish_to_serve_p90_s'] * 1e3:.0f} ms ({r['deltas_seconds']:.0f} s for all deltas) |",
        f"| requests held per delta (the apply), median / max | {r['requests_held_median_s'] * 1e3:.1f} / "
        f"{r['requests_held_max_s'] * 1e3:.1f} ms |",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--deltas", type=int, default=100)
    parser.add_argument("--churn", type=float, default=0.01, help="ids added, and removed, per delta (fraction)")
    parser.add_argument("--steady-seconds", type=float, default=10.0)
    parser.add_argument("--every", type=float, default=1.0, help="seconds from a delta's publication to the next")
    parser.add_argument("--writer", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.writer:
        return writer(args.writer, args.rows, args.churn, args.deltas)
    result = measure(args.rows, args.deltas, args.churn, args.steady_seconds, args.every)
    write_results("delta_removals", result, markdown(result))


if __name__ == "__main__":
    main()
