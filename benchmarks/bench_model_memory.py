"""Counted memory against what a load really costs: ``SessionGroup.memory()`` per backend and store.

Per row, a fresh process loads one model version (``open_session_group``, with its feature store
where it has one) and reports the sum of the parts the group counts (weights, tables, caches,
shared, device) beside the process's RSS growth from that load alone: measured around the load,
after the engine was imported and a small model of the same kind was loaded and closed first (so
the runtime's one-time start-up, thread pools and kernels are not charged to the model), with
``malloc_trim`` before each reading. The ratio says how much of a load the count explains. The
version is then unloaded and loaded again: what the first unload left resident (the allocator's
free memory, the readers' buffers) and the growth of that second load are shown too.

Models: the DLRM-like ``.onnx`` model (``demo.dlrm_onnx``, 26 tables of ``--rows`` x 16) on ONNX
Runtime; the CTR demo model with the full preset's shapes (trained ``--steps`` steps only: this
benchmark needs its sizes, not its quality) on TensorFlow, its tables in the engine, in the DRAM
store, and in Redis (where ``redis-server`` exists; the hot-row cache at its default budget).
The estimate of the fit check (``estimate_load_bytes``: the parameter files' bytes) is shown too.
Writes ``benchmarks/results/model_memory.json`` and ``.md``.

    .venv/bin/python -m benchmarks.bench_model_memory [--rows 100000] [--steps 2] [--out-dir DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import write_results

MIB = 2**20


def _load(config_dict: dict, model: str):
    """(group, feature store or None) of the newest version ``config_dict`` names."""
    from processor.config import ModelConfig
    from processor.engine.open_group import open_session_group
    from processor.features.feature_store import open_feature_store
    from processor.store.checkpoint_layout import latest_version
    from processor.store.model_store import ModelStore

    config = ModelConfig.from_dict(config_dict)
    version = latest_version(ModelStore(), config.savedmodel_dir, config.checkpoint_dir)
    features = open_feature_store(config, model)
    return open_session_group(config, version, features=features), features, config, version


def child(spec: dict) -> dict:
    """In this fresh process: prime the engine with ``spec["primer"]``, then load
    ``spec["config"]`` and measure (see the module doc)."""
    import gc

    from processor import memory
    from processor.store.model_store import ModelStore

    if spec["engine"] == "tensorflow":
        from processor import tensorflow_env

        tensorflow_env.apply()  # TensorFlow's switches as the server's entry point sets them
        import tensorflow  # noqa: F401 - imported before any reading, as a server has it
    else:
        import onnxruntime  # noqa: F401
    memory.pin_malloc_thresholds()  # as the server's model manager does before any load
    group, features, _, _ = _load(spec["primer"], "primer")
    group.close()
    if features is not None:
        features.close()
    del group, features

    def settled() -> int:
        gc.collect()
        memory.trim()
        return memory.process_rss_bytes()

    def unload(group, features) -> None:
        group.close()
        if features is not None:
            features.close()

    before = settled()
    started = time.perf_counter()
    group, features, config, version = _load(spec["config"], "bench")
    seconds = time.perf_counter() - started
    grown = settled() - before
    counted = group.memory()
    estimate = memory.estimate_load_bytes(ModelStore(), version, config)
    unload(group, features)
    del group, features
    unloaded = settled()
    group, features, _, _ = _load(spec["config"], "bench")  # the same load again, on the freed memory
    regrown = settled() - unloaded
    unload(group, features)
    return {"parts": counted, "counted": sum(counted.values()), "rss_growth": grown, "file_estimate": estimate,
            "load_seconds": seconds, "kept_after_unload": unloaded - before, "reload_rss_growth": regrown}


def _ctr(directory: Path, preset: str, steps: int):
    """The CTR demo model of ``preset``'s shapes, trained ``steps`` steps (one version)."""
    from demo import ctr_spec
    from demo.ctr_model import build_ctr_model

    base = ctr_spec.PRESETS[preset]
    # the shapes are what counts here: a few small steps instead of the preset's training
    ctr_spec.PRESETS[preset] = dataclasses.replace(base, steps_per_version=steps, batch_size=256, eval_examples=1000)
    try:
        return build_ctr_model(directory, preset=preset, versions=1)
    finally:
        ctr_spec.PRESETS[preset] = base


def bench(args) -> dict:
    from demo import dlrm_onnx
    from demo.paths import model_config

    work = Path(tempfile.mkdtemp(prefix="bench_model_memory_"))
    redis = None
    try:
        dlrm_onnx.build(work / "dlrm" / "model.onnx", rows=args.rows, dim=16, seed=1)
        dlrm_onnx.build(work / "dlrm_primer" / "model.onnx", rows=100, dim=16, seed=2)
        ctr = _ctr(work / "ctr", "full", args.steps)
        primer = _ctr(work / "ctr_primer", "small", 1)

        def ort(directory: Path) -> dict:
            return {"savedmodel_dir": str(directory), "backend": "onnxruntime", "session_num": 1,
                    "intra_op_parallelism_threads": 1, "inter_op_parallelism_threads": 1}

        cases = [("onnxruntime", "in-engine", {"engine": "onnxruntime", "primer": ort(work / "dlrm_primer"),
                                               "config": ort(work / "dlrm")})]
        stores = {"in-engine": {}, "DRAM": {"ev_storage_type": 1}}
        if shutil.which("redis-server"):
            from tools.local_redis import LocalRedis

            redis = LocalRedis()
            stores["Redis"] = {"feature_store_type": "redis", "redis_url": f"redis://{redis.url}/0"}
        for store, overrides in stores.items():
            cases.append(("tensorflow", store, {"engine": "tensorflow", "primer": model_config(primer, **overrides),
                                                "config": model_config(ctr, **overrides)}))
        rows = []
        for engine, store, spec in cases:
            out = subprocess.run([sys.executable, "-m", "benchmarks.bench_model_memory", "--child", json.dumps(spec)],
                                 capture_output=True, text=True,
                                 env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2",
                                      "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
            if out.returncode:
                raise RuntimeError(f"{engine} / {store}: the child failed:\n{out.stderr[-3000:]}")
            row = {"engine": engine, "store": store, **json.loads(out.stdout.strip().splitlines()[-1])}
            for key in ("rss_growth", "reload_rss_growth"):
                row[f"counted_over_{key}"] = row["counted"] / row[key] if row[key] > 0 else None
            rows.append(row)
            print(f"{engine:12} {store:10} counted {row['counted'] / MIB:8.1f} MiB  "
                  f"RSS growth {row['rss_growth'] / MIB:8.1f} MiB", flush=True)
        return {"dlrm_rows_per_table": args.rows, "ctr": "full preset shapes", "ctr_training_steps": args.steps,
                "redis": redis is not None, "rows": rows}
    finally:
        if redis is not None:
            redis.close()
        shutil.rmtree(work, ignore_errors=True)


def markdown(result: dict) -> str:
    lines = [f"# Counted memory vs RSS growth of one load (DLRM-like .onnx: 26 x {result['dlrm_rows_per_table']:,} x 16; "
             f"CTR demo: {result['ctr']})", "",
             "| engine | store | weights MiB | tables MiB | caches MiB | shared MiB | counted MiB | RSS growth MiB "
             "| counted / growth | kept after unload MiB | reload growth MiB | counted / reload growth "
             "| file estimate MiB | load s |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def ratio(value) -> str:
        return "" if value is None else f"{value:.2f}"

    for row in result["rows"]:
        p = row["parts"]
        lines.append(f"| {row['engine']} | {row['store']} | {p['weights'] / MIB:.1f} | {p['tables'] / MIB:.1f} | "
                     f"{p['caches'] / MIB:.1f} | {p['shared'] / MIB:.1f} | {row['counted'] / MIB:.1f} | "
                     f"{row['rss_growth'] / MIB:.1f} | {ratio(row['counted_over_rss_growth'])} | "
                     f"{row['kept_after_unload'] / MIB:.1f} | {row['reload_rss_growth'] / MIB:.1f} | "
                     f"{ratio(row['counted_over_reload_rss_growth'])} | "
                     f"{row['file_estimate'] / MIB:.1f} | {row['load_seconds']:.1f} |")
    if not result["redis"]:
        lines += ["", "No redis-server on this machine: the Redis row is left out."]
    lines += ["", "Kept after unload: what the process still holds once the version is closed and the heap "
              "trimmed (memory the load's readers and buffers left in the allocator, which the same load "
              "again reuses: the reload's growth)."]
    lines += ["", "Device memory is 0 on this CPU run. A feature store serves TensorFlow models only, so ONNX "
              "Runtime has the in-engine row alone."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--out-dir", type=Path, default=None)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    result = bench(args)
    write_results("model_memory", result, markdown(result), args.out_dir)


if __name__ == "__main__":
    main()
