"""ONNX Runtime on a GPU: shared weights, deltas under load, placement, streams, process() vs ORT.

Needs onnxruntime-gpu, PyTorch with CUDA (the gpu extra) and the project; no TensorFlow. The
model is the DLRM-like ``.onnx`` of ``demo/dlrm_onnx.py`` with its 26 tables stacked into one of
``--table-rows`` x 64 (2,000,024 x 64 float32 by default, 488 MiB) and a small MLP. Sections:

* memory: GPU memory used (``torch.cuda.mem_get_info``, the whole device, minus the figure
  before the model loads) with 1 / 4 / 8 sessions (``use_multi_stream``: one session and stream
  each), all reading one device copy of the weights; each session adds its own workspace. The
  control: as many plain ORT CUDA sessions over the model file, each with its own copy;
* delta: 1% of the table's rows (20,000) written in place once a second while 2 threads send
  batch-256 requests through ``process()``: failed requests, the time requests were held (the
  update gate), written -> served (from the write's start until a request sent after it returns
  an answer computed with the new rows), p50/p99 steady vs during deltas. The write is the one a
  delta checkpoint makes (``update_parameter`` under the group's gate; a plain ``.onnx`` model
  has no TF variable names for a checkpoint to carry);
* placement on vs off at batch 1 / 256 / 2048 (on: lookups and table in a CPU session, the
  dense part on the GPU; off: everything on the GPU), 1 thread;
* streams 1 / 2 / 4 (``session_num`` with ``use_multi_stream``), as many threads, batch 256;
* ``process()`` (wire bytes in, wire bytes out) vs bare ONNX Runtime CUDA (one plain
  ``InferenceSession`` over the model file, ``run`` on ready numpy feeds), batch 1 / 256 / 2048.

Writes ``benchmarks/results/gpu.json`` and ``.md``, naming the GPU. ``--cpu-dry-run`` runs every
section on the CPU provider with a small table and short loops, into a temporary directory,
to check the script on a machine without a GPU (its figures mean nothing).

    .venv/bin/python -m benchmarks.bench_gpu [--seconds 3] [--table-rows 2000024]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks.common import run_threads, write_results

SPARSE, DIM = 26, 64


def build_model(directory: Path, table_rows: int) -> Path:
    from demo import dlrm_onnx

    path = directory / "model.onnx"
    if not path.exists():
        dlrm_onnx.build(path, rows=-(-table_rows // SPARSE), dim=DIM)
    return path


class Bench:
    def __init__(self, args) -> None:
        self.args = args
        self.gpu = not args.cpu_dry_run
        self.work = Path(tempfile.mkdtemp(prefix="sp-bench-gpu-"))
        self.model = build_model(self.work, args.table_rows)
        self.rows_per_table = -(-args.table_rows // SPARSE)

    def processor(self, sessions: int = 1, placement: bool = False):
        from processor.processor import Processor

        config = {"savedmodel_dir": str(self.model.parent), "backend": "onnxruntime", "session_num": sessions,
                  "use_per_session_threads": True, "intra_op_parallelism_threads": 2,
                  "file_system_poll_wait_seconds": 0, "enable_device_placement_optimization": placement}
        if self.gpu:
            config.update(gpu_ids_list="0", use_multi_stream=True)
        return Processor.create("", json.dumps(config))

    def request(self, batch: int, seed: int = 1) -> bytes:
        from demo import dlrm_onnx
        from processor import codec

        return codec.encode_request(dlrm_onnx.inputs(batch, seed))

    def used_mib(self) -> float | None:
        if not self.gpu:
            return None
        import torch

        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info(0)
        return (total - free) / 2**20

    # --- sections -----------------------------------------------------------------------------

    def memory(self) -> list[dict]:
        out = []
        body = self.request(256)
        for sessions in (1, 4, 8):
            gc.collect()
            base = self.used_mib()
            p = self.processor(sessions)
            for _ in range(3 * sessions):
                assert p.process(body)[0] == 200
            used = self.used_mib()
            buffers = p.model_info()["session_group"]["parameter_buffers"]
            p.close()
            out.append({"sessions": sessions, "gpu_mib": _delta(used, base), "copy_each_mib": self.copies(sessions),
                        "weights_mib": sum(b["mib"] for b in buffers),
                        "buffers": [f"{b['location']}: {b['sessions']} sessions" for b in buffers]})
            print("memory", out[-1])
        return out

    def copies(self, sessions: int) -> float | None:
        """The control: plain ORT sessions over the model file, each with its own copy of the weights."""
        import onnxruntime as ort

        from demo import dlrm_onnx

        gc.collect()
        base = self.used_mib()
        made = [ort.InferenceSession(str(self.model), providers=self.providers()) for _ in range(sessions)]
        for session in made:
            session.run(None, dlrm_onnx.inputs(256))
        used = self.used_mib()
        del made
        return _delta(used, base)

    def providers(self) -> list[str]:
        return ["CUDAExecutionProvider", "CPUExecutionProvider"] if self.gpu else ["CPUExecutionProvider"]

    def delta(self) -> dict:
        p = self.processor(2)
        body = self.request(256)
        count = max(1, self.args.table_rows // 100)
        stop, failures, steady, during = threading.Event(), [0], [], []
        phase = [steady]

        def client() -> None:
            while not stop.is_set():
                t0 = time.perf_counter()
                status, _ = p.process(body)
                phase[0].append(time.perf_counter() - t0)
                if status != 200:
                    failures[0] += 1

        threads = [threading.Thread(target=client) for _ in range(2)]
        for t in threads:
            t.start()
        time.sleep(self.args.seconds)
        phase[0] = during
        rng, held, served = np.random.default_rng(0), [], []
        table_rows = self.rows_per_table * SPARSE
        for round_ in range(self.args.deltas):
            ids = np.sort(rng.choice(table_rows, count, replace=False)).astype(np.int64)
            ids = np.union1d(ids[:count - SPARSE], _probe_ids(self.rows_per_table))
            values = rng.standard_normal((len(ids), DIM)).astype(np.float32) * 0.05 * (round_ + 2)
            before = p.process(_probe_request(self.rows_per_table))[1]
            with p.manager.acquire() as group:
                started = time.perf_counter()
                with group._gate.exclusive():
                    group.backend.update_parameter("tables", values, ids)
                held.append(time.perf_counter() - started)
            after = p.process(_probe_request(self.rows_per_table))[1]
            served.append(time.perf_counter() - started)
            assert after != before, "a request after the write was answered with the old rows"
            time.sleep(max(0.0, 1.0 - (time.perf_counter() - started)))
        stop.set()
        for t in threads:
            t.join()
        p.close()
        return {"rows_per_delta": count, "deltas": len(held), "failed_requests": failures[0],
                "held_ms_p50": _ms(statistics.median(held)), "held_ms_max": _ms(max(held)),
                "written_to_served_ms_p50": _ms(statistics.median(served)), "written_to_served_ms_max": _ms(max(served)),
                "steady": _percentiles(steady), "during_deltas": _percentiles(during)}

    def loop(self, p, body: bytes, threads: int = 1) -> dict:
        return run_threads(lambda i: p.process(body), threads, self.args.seconds, warmup_calls=5)

    def placement(self) -> list[dict]:
        out = []
        for placement in (False, True):
            p = self.processor(1, placement)
            applied = p.model_info()["session_group"]["device_placement"]["applied"]
            for batch in self.args.batches:
                r = self.loop(p, self.request(batch))
                out.append({"placement": placement, "applied": applied, "batch": batch, **_brief(r)})
                print("placement", out[-1])
            p.close()
        return out

    def streams(self) -> list[dict]:
        out = []
        body = self.request(256)
        for streams in (1, 2, 4):
            p = self.processor(streams)
            r = self.loop(p, body, threads=streams)
            out.append({"streams": streams, "threads": streams, "batch": 256, **_brief(r)})
            print("streams", out[-1])
            p.close()
        return out

    def versus_ort(self) -> list[dict]:
        import onnxruntime as ort

        from demo import dlrm_onnx

        bare = ort.InferenceSession(str(self.model), providers=self.providers())
        p = self.processor(1)
        out = []
        for batch in self.args.batches:
            feeds = dlrm_onnx.inputs(batch)
            mine = self.loop(p, self.request(batch))
            theirs = run_threads(lambda i: bare.run(None, feeds), 1, self.args.seconds, warmup_calls=5)
            out.append({"batch": batch, "process": _brief(mine), "bare_ort": _brief(theirs),
                        "ratio": round(mine["calls_per_s"] / theirs["calls_per_s"], 3)})
            print("process vs bare", out[-1])
        p.close()
        return out


def _probe_ids(rows_per_table: int) -> np.ndarray:
    """The table rows the probe request reads (feature f's id 7 + f, offset to table f)."""
    return (7 + np.arange(SPARSE, dtype=np.int64)) % rows_per_table + np.arange(SPARSE) * rows_per_table


def _probe_request(rows_per_table: int) -> bytes:
    from processor import codec

    sparse = (7 + np.arange(SPARSE, dtype=np.int64)).reshape(1, SPARSE)
    return codec.encode_request({"dense": np.zeros((1, 13), np.float32), "sparse": sparse})


def _delta(used: float | None, base: float | None) -> float | None:
    return None if used is None or base is None else round(used - base, 1)


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 2)


def _percentiles(latencies: list[float]) -> dict:
    flat = sorted(latencies)
    if not flat:
        return {"requests": 0}
    return {"requests": len(flat), "p50_ms": _ms(flat[len(flat) // 2]),
            "p99_ms": _ms(flat[min(len(flat) - 1, int(len(flat) * 0.99))])}


def _brief(r: dict) -> dict:
    return {"calls_per_s": round(r["calls_per_s"], 1), "p50_us": round(r["p50_us"], 1), "p99_us": round(r["p99_us"], 1)}


def machine(gpu: bool) -> dict:
    import onnxruntime as ort

    out = {"host": platform.node(), "onnxruntime": ort.__version__, "providers": ort.get_available_providers()}
    if gpu:
        import torch

        out.update(gpu=torch.cuda.get_device_name(0), torch=torch.__version__, cuda=torch.version.cuda,
                   gpu_total_mib=round(torch.cuda.mem_get_info(0)[1] / 2**20))
    else:
        out["gpu"] = "none: --cpu-dry-run (every figure on the CPU provider; checks the script only)"
    return out


def markdown(payload: dict) -> str:
    m = payload["machine"]
    lines = [f"# ONNX Runtime on a GPU: {m['gpu']}", "",
             f"onnxruntime {m['onnxruntime']}; torch {m.get('torch', '-')}; CUDA {m.get('cuda', '-')}; "
             f"table {payload['table_rows']:,} x {DIM} float32; loops of {payload['seconds']} s.", "",
             "## GPU memory (one device copy of the weights, shared)", "",
             "| sessions | GPU MiB used | plain ORT sessions, a copy each | weights MiB | buffers |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['sessions']} | {r['gpu_mib']} | {r['copy_each_mib']} | {r['weights_mib']} | {'; '.join(r['buffers'])} |"
              for r in payload["memory"]]
    d = payload["delta"]
    lines += ["", f"## 1% delta ({d['rows_per_delta']:,} rows) once a second under load (2 threads, batch 256)", "",
              f"{d['deltas']} deltas, {d['failed_requests']} failed requests; requests held p50 {d['held_ms_p50']} ms "
              f"(max {d['held_ms_max']}); written -> served p50 {d['written_to_served_ms_p50']} ms "
              f"(max {d['written_to_served_ms_max']}); p50/p99 steady {d['steady'].get('p50_ms')}/"
              f"{d['steady'].get('p99_ms')} ms, during deltas {d['during_deltas'].get('p50_ms')}/"
              f"{d['during_deltas'].get('p99_ms')} ms.",
              "", "## Placement on vs off (1 thread)", "", "| placement | batch | calls/s | p50 us | p99 us |",
              "|---|---|---|---|---|"]
    lines += [f"| {'on' if r['placement'] else 'off'}{'' if r['applied'] == r['placement'] else ' (not applied)'} "
              f"| {r['batch']} | {r['calls_per_s']} | {r['p50_us']} | {r['p99_us']} |" for r in payload["placement"]]
    lines += ["", "## Streams (session_num with use_multi_stream, batch 256)", "",
              "| streams | threads | calls/s | p50 us | p99 us |", "|---|---|---|---|---|"]
    lines += [f"| {r['streams']} | {r['threads']} | {r['calls_per_s']} | {r['p50_us']} | {r['p99_us']} |"
              for r in payload["streams"]]
    lines += ["", "## process() vs bare ONNX Runtime CUDA (1 thread)", "",
              "| batch | process calls/s | bare calls/s | process / bare | process p50 us | bare p50 us |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {r['batch']} | {r['process']['calls_per_s']} | {r['bare_ort']['calls_per_s']} | {r['ratio']} | "
              f"{r['process']['p50_us']} | {r['bare_ort']['p50_us']} |" for r in payload["versus_ort"]]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table-rows", type=int, default=2_000_024)
    parser.add_argument("--seconds", type=float, default=3.0, help="per loop")
    parser.add_argument("--deltas", type=int, default=8)
    parser.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 256, 2048])
    parser.add_argument("--cpu-dry-run", action="store_true", help="check the script without a GPU")
    parser.add_argument("--out", type=Path, default=None, help="results directory (default benchmarks/results)")
    args = parser.parse_args()
    if args.cpu_dry_run:
        args.table_rows, args.seconds, args.deltas = min(args.table_rows, 26_000), min(args.seconds, 0.3), 2
        args.out = args.out or Path(tempfile.mkdtemp(prefix="sp-bench-gpu-dry-"))
    else:
        from processor.engine.onnx.param_buffers import why_no_gpu

        why = why_no_gpu()
        if why:
            raise SystemExit(f"no GPU for ONNX Runtime: {why} (--cpu-dry-run checks the script)")
    bench = Bench(args)
    os.environ["SP_ONNX_CACHE_DIR"] = str(bench.work / "onnx-cache")  # the 488 MiB entry goes with the run
    try:
        payload = {"machine": machine(bench.gpu), "table_rows": bench.rows_per_table * SPARSE,
                   "seconds": args.seconds, "memory": bench.memory(), "delta": bench.delta(),
                   "placement": bench.placement(), "streams": bench.streams(), "versus_ort": bench.versus_ort()}
    finally:
        shutil.rmtree(bench.work, ignore_errors=True)
    write_results("gpu", payload, markdown(payload), args.out)


if __name__ == "__main__":
    main()
