"""Feature store benchmark: lookup speed per store, memory per key, end-to-end requests/s.

    .venv/bin/python -m benchmarks.bench_features [--rows 500000] [--seconds 3] [--memory-keys 10000000] [--rounds 5]

1. Lookup of a batch of 4,096 ids (ranks drawn Zipf, s = 1.1: a few hot ids, a long tail; 2 %
   unknown ids) in one 64-dim table of ``--rows`` rows: ids/s and p99 per batch for the DRAM
   store (float32 and float16 rows), DRAM+SSD with a DRAM budget of a quarter of the table, one
   redis-server and a 3-node Redis Cluster, each without and with the hot-row cache (servers on
   127.0.0.1, started and stopped here); Redis ``used_memory`` of the table in float32 and in
   float16. One calling thread; a batch = one ``lookup`` call.
2. Memory per key of the DRAM store for ``--memory-keys`` keys x 64 dims: bytes the arrays hold
   and the growth of the process RSS, minus the 256 bytes of floats per key.
3. End-to-end: the demo CTR model (small preset, 26 tables) through ``Processor.process`` with the
   tables in TensorFlow variables, the DRAM store, Redis and Redis Cluster (hot-row cache on, the
   default; Redis also with it off): requests/s, latency and the ratio to TensorFlow variables
   for batches of 256 from 2 threads, 64 different requests in turn (the demo's ids are
   Zipf-like, s ~ 1); the cache's hit rate; every case's answers allclose to TensorFlow's. Run
   twice, each in a process of its own (TensorFlow sizes its process-wide inter-op pool once):
   with a pool of 1 thread (graph runs take turns, as ``inter_op_parallelism_threads: 1`` without
   per-session pools serves) and of 2 (both client threads' graphs at once). The model is built in
   a child process, so its build does not size that pool.

Writes benchmarks/results/features.json and .md. Timings are this machine's (2 cores shared by the
Python client and the Redis servers): compare rows of one run, not runs of different machines.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import memory_of, paired_ratio, run_threads, write_results  # noqa: E402
from processor.features.dram_store import DramTable  # noqa: E402
from processor.features.rows import RowChunk, TableSpec  # noqa: E402
from tools.local_redis import LocalRedis, LocalRedisCluster  # noqa: E402

BATCH = 4096
DIM = 64


class _Source:
    """A TableSource over one in-memory table."""

    def __init__(self, name: str, keys: np.ndarray, values: np.ndarray) -> None:
        self.name, self.keys, self.values = name, keys, values
        self.full_prefix, self.delta_prefix, self.delta_step = "bench://", "", -1

    def row_count(self, specs) -> int:
        return len(self.keys)

    def rows(self, specs, chunk_rows: int = 65536):
        for s in range(0, len(self.keys), chunk_rows):
            yield self.name, RowChunk(self.keys[s:s + chunk_rows], self.values[s:s + chunk_rows])


def _batches(keys: np.ndarray, count: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    n = len(keys)
    out = []
    for _ in range(count):
        ranks = np.minimum(rng.zipf(1.1, BATCH), n) - 1  # Zipf, s = 1.1
        batch = keys[ranks]
        unknown = rng.random(BATCH) < 0.02
        batch[unknown] = rng.integers(2**62, 2**63 - 1, int(unknown.sum()))
        out.append(batch)
    return out


def bench_lookups(rows: int, seconds: float) -> dict:
    rng = np.random.default_rng(0)
    keys = rng.choice(2**40, rows, replace=False).astype(np.int64) - 2**39
    values = rng.standard_normal((rows, DIM)).astype(np.float32)
    name = "emb/bench"
    spec = TableSpec(name, DIM, "raw", rows)
    batches = _batches(keys, 64, 1)
    index = {int(k): i for i, k in enumerate(keys[:1000].tolist())}
    results = {}

    def measure(label: str, lookup, extra=None, stored=values) -> None:
        got = lookup(batches[0])
        for j, k in enumerate(batches[0][:200].tolist()):  # spot check: the rows are right
            if k in index:
                assert np.array_equal(got[j], stored[index[k]]), label
        r = run_threads(lambda i, c=[0]: lookup(batches[(c.__setitem__(0, c[0] + 1) or c[0]) % len(batches)]),
                        threads=1, seconds=seconds, warmup_calls=5)
        results[label] = {"ids_per_s": r["calls_per_s"] * BATCH, "batches_per_s": r["calls_per_s"],
                          "p50_ms": r["p50_us"] / 1e3, "p99_ms": r["p99_us"] / 1e3, **(extra() if extra else {})}
        print(f"  {label}: {results[label]['ids_per_s'] / 1e6:.2f} M ids/s, p99 {results[label]['p99_ms']:.2f} ms",
              flush=True)

    # DRAM
    from processor.features.dram_store import DramStore
    from processor.features.redis_client import RedisNodes
    from processor.features.redis_store import RedisStore
    from processor.features.redis_url import parse_redis_url
    from processor.features.tiered_store import TieredStore

    src = _Source(name, keys, values)
    vt = DramStore().open_version("v1", {name: spec}, src)
    measure("dram", lambda b: vt.lookup([(name, b)])[0])
    vt.release()
    half = TableSpec(name, DIM, "raw", rows, dtype="float16")
    vt = DramStore("float16").open_version("v1", {name: half}, src)
    measure("dram, float16 rows", lambda b: vt.lookup([(name, b)])[0],
            lambda: {"max_abs_diff": vt.tables[name].narrowing.max_abs_diff,
                     "values_bytes": vt.tables[name].nbytes()["values"], "float32_bytes": int(values.nbytes)},
            stored=values.astype(np.float16).astype(np.float32))
    vt.release()
    # DRAM + SSD, a quarter of the table in DRAM
    with tempfile.TemporaryDirectory(prefix="bench-ssd-") as root:
        store = TieredStore(root, dram_bytes=values.nbytes // 4)
        vt = store.open_version("v1", {name: spec}, src)
        table = vt.tables[name]

        def hit_rate():
            s = table.stats.extra
            return {"cache_hit_rate": s["cache_hits"] / max(1, s["cache_hits"] + s["ssd_reads"]),
                    "dram_cache_bytes": table.nbytes()["dram_cache"], "table_bytes": int(values.nbytes)}

        measure("dram_ssd (DRAM = 1/4 of the table)", lambda b: vt.lookup([(name, b)])[0], hit_rate)
        vt.release()
        store.close()
    # Redis, one node and a cluster, without and with the hot-row cache
    redis_memory = {}
    for label, make in (("redis (1 node)", lambda: LocalRedis()), ("redis cluster (3 nodes)", lambda: LocalRedisCluster(3))):
        server = make()
        try:
            cluster = isinstance(server, LocalRedisCluster)
            for cache_bytes in (0, 256 << 20):
                nodes = RedisNodes(parse_redis_url(server.url, cluster=cluster), None, 4, 2, cluster)
                store = RedisStore("cluster_redis" if cluster else "redis", nodes, f"bench{cache_bytes}", 600, 2,
                                   cache_bytes=cache_bytes)
                nodes.refresh()
                started = time.perf_counter()
                vt = store.open_version("v1", {name: spec}, src)
                load_s = time.perf_counter() - started

                def extra(vt=vt, load_s=load_s):
                    looked = vt.stats.as_dict()
                    hits, misses = looked["cache_hits"], looked["cache_misses"]
                    return {"load_rows_per_s": rows / load_s, "cache_hit_rate": hits / max(1, hits + misses),
                            "commands_per_batch": vt.stats.extra["redis_commands"] / max(1, vt.stats.lookups)}

                measure(label + (" + cache" if cache_bytes else ""), lambda b, vt=vt: vt.lookup([(name, b)])[0], extra)
                store.close()
        finally:
            server.close()
    for dtype in ("float32", "float16"):  # what the table takes in Redis
        server = LocalRedis()
        try:
            before = int(server.cli("info", "memory").split("used_memory:")[1].split()[0])
            nodes = RedisNodes(parse_redis_url(server.url), None, 4, 2, False)
            store = RedisStore("redis", nodes, "mem", 600, 2, dtype=dtype)
            store.open_version("v1", {name: TableSpec(name, DIM, "raw", rows, dtype=dtype)}, src)
            after = int(server.cli("info", "memory").split("used_memory:")[1].split()[0])
            redis_memory[dtype] = {"used_memory_bytes": after - before, "bytes_per_row": (after - before) / rows}
            store.close()
        finally:
            server.close()
    print(f"  redis used_memory per row: float32 {redis_memory['float32']['bytes_per_row']:.0f} B, "
          f"float16 {redis_memory['float16']['bytes_per_row']:.0f} B", flush=True)
    return {"rows": rows, "dim": DIM, "batch": BATCH, "distribution": "Zipf ranks (s = 1.1), 2% unknown ids",
            "stores": results, "redis_memory": redis_memory}


def _malloc_trim() -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def bench_memory(keys_count: int) -> dict:
    gc.collect()
    _malloc_trim()
    before = memory_of()["rss_mib"]
    spec = TableSpec("emb/mem", DIM, "raw", keys_count)
    table = DramTable(spec, capacity=keys_count)
    rng = np.random.default_rng(5)
    chunk = 1_000_000
    started = time.perf_counter()
    for s in range(0, keys_count, chunk):
        n = min(chunk, keys_count - s)
        keys = rng.integers(-2**63, 2**63 - 1, n, dtype=np.int64)
        table.upsert(RowChunk(keys, np.ones((n, DIM), np.float32)))
    load_s = time.perf_counter() - started
    gc.collect()
    _malloc_trim()  # give back the load's freed temporaries, so RSS shows what the table holds
    after = memory_of()["rss_mib"]
    nbytes = table.nbytes()
    floats = keys_count * DIM * 4
    probe = _batches(table.index.keys(), 20, 9)
    t0 = time.perf_counter()
    for b in probe:
        table.lookup(b)
    lookup_s = (time.perf_counter() - t0) / len(probe)
    out = {"keys": table.size, "dim": DIM, "load_seconds": round(load_s, 2),
           "array_bytes": nbytes, "overhead_bytes_per_key_arrays": (sum(nbytes.values()) - floats) / table.size,
           "rss_growth_mib": after - before,
           "overhead_bytes_per_key_rss": ((after - before) * 2**20 - floats) / table.size,
           "freq_version_metadata_bytes_per_key": 8,
           "lookup_4096_ms_at_this_size": lookup_s * 1e3}
    del table
    gc.collect()
    print(f"  memory: {out['overhead_bytes_per_key_arrays']:.2f} B/key over the floats (arrays), "
          f"{out['overhead_bytes_per_key_rss']:.2f} B/key (RSS)", flush=True)
    return out


def build_demo_model() -> dict:
    """The demo CTR model (small preset), built by ``python -m demo build`` in a child process:
    building it here would create TensorFlow's process-wide inter-op pool with the build's
    sizing, and every session opened afterwards without pools of its own would run on that pool
    instead of the one ``inter_op_parallelism_threads`` asks for. Returns its paths."""
    work = Path(tempfile.mkdtemp(prefix="bench-features-"))
    built = subprocess.run([sys.executable, "-m", "demo", "build", "--out", str(work / "model"), "--preset", "small",
                            "--versions", "1"], cwd=ROOT, check=True, capture_output=True, text=True)
    return json.loads(built.stdout)["model_config"]


def bench_end_to_end(seconds: float, rounds: int, inter_op_threads: int) -> dict:
    """Every case's processor open at once; ``rounds`` rounds of ``seconds`` per case, the order
    rotating; a case's ratio is the median over rounds of its requests/s over TensorFlow
    variables' in the same round (next to each other in time: the machine's drift cancels).

    ``inter_op_threads``: the sessions share TensorFlow's process-wide inter-op pool (no
    per-session pools), this many threads, made by the first session this process opens: 1
    runs one request's graph at a time (what the stores shorten: their graph runs without the
    lookups), 2 runs both client threads' graphs at once (what the stores' Python work competes
    with). One size per process: run each in its own process (``--inter-op``)."""
    import statistics

    from demo.synthetic_data import synthetic_batch
    from processor import codec
    from processor.processor import Processor

    model = build_demo_model()
    requests = [codec.encode_request(synthetic_batch(256, 7 + i)) for i in range(64)]
    base = {"savedmodel_dir": model["savedmodel_dir"], "checkpoint_dir": model["checkpoint_dir"],
            "session_num": 2, "inter_op_parallelism_threads": inter_op_threads, "intra_op_parallelism_threads": 1,
            "file_system_poll_wait_seconds": 0}
    redis, cluster = LocalRedis(), LocalRedisCluster(3)
    cases = [("tensorflow variables", {}), ("dram store", {"ev_storage_type": 1}),
             ("redis (1 node), no cache", {"feature_store_type": "redis", "redis_url": redis.url,
                                           "redis_cache_bytes": 0}),
             ("redis (1 node) + cache", {"feature_store_type": "redis", "redis_url": redis.url}),
             ("redis cluster (3 nodes) + cache", {"feature_store_type": "cluster_redis", "redis_url": cluster.url})]
    procs: dict[str, Processor] = {}
    runs: dict[str, list[dict]] = {label: [] for label, _ in cases}
    try:
        reference = None
        for k, (label, extra) in enumerate(cases):
            p = procs[label] = Processor.create(f"{label.split()[0]}{k}", json.dumps({**base, **extra}))
            answers = []
            for request in requests[:8]:
                status, body = p.process(request)
                assert status == 200, body
                answers.append(codec.decode_response(body)["logits"])
            reference = answers if reference is None else reference
            for got, want in zip(answers, reference):
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=label)
        labels = [label for label, _ in cases]
        for r in range(rounds):
            for label in labels[r % len(labels):] + labels[:r % len(labels)]:
                p, turn = procs[label], [0, 0]
                runs[label].append(run_threads(
                    lambda i, p=p, turn=turn: p.process(requests[(turn.__setitem__(i, turn[i] + 1) or turn[i]) % 64]),
                    threads=2, seconds=seconds))
        out = {}
        for label in labels:
            rates = [x["calls_per_s"] for x in runs[label]]
            reference = [x["calls_per_s"] for x in runs["tensorflow variables"]]
            out[label] = {"requests_per_s": statistics.median(rates), "rounds": rates,
                          "vs_tensorflow_variables": paired_ratio(rates, reference),
                          "p50_ms": statistics.median(x["p50_us"] for x in runs[label]) / 1e3,
                          "p99_ms": statistics.median(x["p99_us"] for x in runs[label]) / 1e3}
            store = procs[label].model_info()["session_group"].get("embedding", {}).get("store", {})
            rate = store.get("lookups", {}).get("cache_hit_rate")
            if rate is not None:
                out[label]["cache_hit_rate"] = rate
            print(f"  e2e {label}: {out[label]['requests_per_s']:.0f} req/s "
                  f"({out[label]['vs_tensorflow_variables']:.2f} of TF variables), p99 {out[label]['p99_ms']:.2f} ms"
                  + (f", cache hit rate {rate:.2f}" if rate is not None else ""), flush=True)
    finally:
        for p in procs.values():
            p.close()
        redis.close()
        cluster.close()
    return {"model": "demo CTR, small preset (26 tables)", "batch": 256, "threads": 2, "rounds": rounds,
            "seconds": seconds, "inter_op_threads": inter_op_threads, "cases": out}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--memory-keys", type=int, default=10_000_000)
    parser.add_argument("--rounds", type=int, default=5, help="end-to-end rounds (cases alternating)")
    parser.add_argument("--e2e-child", type=int, metavar="INTER_OP", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.e2e_child:  # one end-to-end run, its inter-op pool size fixed for this process
        print("RESULT " + json.dumps(bench_end_to_end(args.seconds, args.rounds, args.e2e_child)), flush=True)
        return
    print("memory:", flush=True)
    memory = bench_memory(args.memory_keys)  # first: RSS growth is read in a fresh process
    print("lookups:", flush=True)
    lookups = bench_lookups(args.rows, args.seconds)
    runs = []
    for inter_op in (1, 2):
        print(f"end to end, inter-op pool of {inter_op}:", flush=True)
        child = subprocess.run([sys.executable, "-m", "benchmarks.bench_features", "--e2e-child", str(inter_op),
                                "--seconds", str(args.seconds), "--rounds", str(args.rounds)],
                               cwd=ROOT, check=True, stdout=subprocess.PIPE, text=True)
        for line in child.stdout.splitlines():
            if line.startswith("RESULT "):
                runs.append(json.loads(line[len("RESULT "):]))
            else:
                print(line, flush=True)
    payload = {"machine": {"cpus": os.cpu_count()}, "lookup": lookups, "memory": memory, "end_to_end": runs}
    lines = ["# Feature store benchmark\n",
             f"Lookup of {BATCH} ids in a {args.rows:,} x {DIM} table, one thread:\n",
             "| store | M ids/s | p50 ms | p99 ms | notes |", "|---|---|---|---|---|"]
    for label, r in lookups["stores"].items():
        notes = []
        if "cache_hit_rate" in r:
            notes.append(f"cache hit rate {r['cache_hit_rate']:.2f}")
        if "max_abs_diff" in r:
            notes.append(f"values {r['values_bytes'] / 2**20:.0f} MiB (float32 {r['float32_bytes'] / 2**20:.0f} MiB), "
                         f"max abs diff {r['max_abs_diff']:.1e}")
        if "commands_per_batch" in r:
            notes.append(f"{r['commands_per_batch']:.0f} HMGET per batch, load {r['load_rows_per_s'] / 1e3:.0f}k rows/s")
        lines.append(f"| {label} | {r['ids_per_s'] / 1e6:.2f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {'; '.join(notes)} |")
    mem = lookups["redis_memory"]
    lines += ["", f"Redis used_memory of the table: float32 {mem['float32']['bytes_per_row']:.0f} bytes/row, "
              f"float16 {mem['float16']['bytes_per_row']:.0f} bytes/row (the field and hash overhead stay).",
              "", f"DRAM store memory, {memory['keys']:,} keys x {DIM} dims: "
              f"{memory['overhead_bytes_per_key_arrays']:.2f} bytes/key beyond the floats in its arrays, "
              f"{memory['overhead_bytes_per_key_rss']:.2f} bytes/key by RSS growth "
              f"(+8 bytes/key when freq/version metadata is kept); load {memory['load_seconds']} s, "
              f"a 4096-id lookup {memory['lookup_4096_ms_at_this_size']:.2f} ms.", ""]
    for e2e in runs:
        lines += [f"End to end, TensorFlow's inter-op pool of {e2e['inter_op_threads']} "
                  f"({e2e['model']}, batch {e2e['batch']}, {e2e['threads']} client threads, session_num 2, intra-op 1; "
                  f"{e2e['rounds']} rounds of {e2e['seconds']} s, the cases alternating; 'of TF variables' is the "
                  "median over rounds of the ratio to TensorFlow variables in the same round):", "",
                  "| embeddings in | requests/s | of TF variables | p50 ms | p99 ms | cache hit rate |",
                  "|---|---|---|---|---|---|"]
        for label, r in e2e["cases"].items():
            rate = f"{r['cache_hit_rate']:.2f}" if "cache_hit_rate" in r else ""
            lines.append(f"| {label} | {r['requests_per_s']:.0f} | {r['vs_tensorflow_variables']:.2f} | "
                         f"{r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {rate} |")
        lines.append("")
    lines += ["", f"Load average at the end: {os.getloadavg()[0]:.1f}; compare rows of one run."]
    write_results("features", payload, "\n".join(lines))


if __name__ == "__main__":
    main()
