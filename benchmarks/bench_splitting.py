"""Large request splitting (issue 26): latency of one large request split across the lanes vs
run whole on one lane, and throughput at batch 256 (never split) with splitting on vs off.

Models, ``session_num`` 2 (one intra-op thread per lane, as the benchmarks serve): the DLRM-like
``.onnx`` (``demo.dlrm_onnx``) at batch 8192 and the demo CTR model on TensorFlow at batch 4096,
each split into chunks of half the batch (``max_execution_batch_size``) or not split (None).
Calls go through ``process()`` (serialized requests, the C ABI's path: the native decode's
length check sends a large one to the split run). Answers are checked equal (allclose) first.
Targets (the issue): split p50 <= 0.6 x whole; batch-256 throughput split/whole >= 0.95. The
control, chunk-sized requests from 2 threads vs 1, shows whether the machine can run two lanes at
once at all (on a shared 2-core machine it often cannot).

    python -m benchmarks.bench_splitting [--seconds 2] [--rounds 3] [--preset auto|small|full]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import demo_paths, processor_config, run_threads, write_results


def _configs(args) -> list[tuple[str, dict, int, dict]]:
    """(name, model_config, large batch, feeds maker) per model."""
    from demo import dlrm_onnx
    from demo.synthetic_data import synthetic_batch

    work = Path(tempfile.mkdtemp(prefix="bench_splitting_"))
    onnx_dir = work / "dlrm"
    dlrm_onnx.build(onnx_dir / "model.onnx", rows=20_000, dim=16)
    dlrm = {"savedmodel_dir": str(onnx_dir), "backend": "onnxruntime", "session_num": 2,
            "use_per_session_threads": True, "inter_op_parallelism_threads": 1,
            "intra_op_parallelism_threads": 1}
    demo = {**processor_config(demo_paths(args.preset), 2), "backend": "tensorflow"}
    return [("dlrm .onnx (onnxruntime)", dlrm, 8192, dlrm_onnx.inputs),
            ("demo CTR (tensorflow)", demo, 4096, synthetic_batch)]


def _latency(processor, data: bytes, seconds: float) -> dict:
    """One caller, calls back to back: p50 / p99 in ms."""
    for _ in range(3):
        processor.process(data)
    took = []
    until = time.perf_counter() + seconds
    while time.perf_counter() < until or len(took) < 10:
        t0 = time.perf_counter()
        status, out = processor.process(data)
        took.append(time.perf_counter() - t0)
        assert status == 200, out
    took.sort()
    return {"calls": len(took), "p50_ms": took[len(took) // 2] * 1e3,
            "p99_ms": took[min(len(took) - 1, int(len(took) * 0.99))] * 1e3}


def _rounds(processors: dict, large: bytes, small: bytes, args) -> tuple[dict, dict]:
    """``args.rounds`` rounds, the order of whole and split swapped each round (the machine is
    shared: its load drifts); per processor the median of the rounds' p50 / p99 and calls/s."""
    lat: dict[str, list] = {k: [] for k in processors}
    thr: dict[str, list] = {k: [] for k in processors}
    for r in range(args.rounds):
        for label in (list(processors) if r % 2 == 0 else list(processors)[::-1]):
            p = processors[label]
            lat[label].append(_latency(p, large, args.seconds))
            thr[label].append(run_threads(lambda _i, p=p: p.process(small), 2, args.seconds)["calls_per_s"])
    med = statistics.median
    return ({k: {"p50_ms": med(x["p50_ms"] for x in v), "p99_ms": med(x["p99_ms"] for x in v)}
             for k, v in lat.items()},
            {k: {"calls_per_s": med(v)} for k, v in thr.items()})


def bench(args) -> dict:
    from processor.codec import decode_response, encode_request
    from processor.processor import Processor

    rows = []
    for name, config, batch, make_feeds in _configs(args):
        large = encode_request(make_feeds(batch, 1))
        small = encode_request(make_feeds(256, 2))
        split = Processor.create("split", json.dumps({**config, "max_execution_batch_size": batch // 2}))
        whole = Processor.create("whole", json.dumps({**config, "max_execution_batch_size": None}))
        try:
            got, want = (decode_response(p.process(large)[1]) for p in (split, whole))
            for key in want:
                np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6)
            lat, thr = _rounds({"whole": whole, "split": split}, large, small, args)
            # the control: can this machine run two lanes at once? (2.0 when it has two free cores)
            chunk = encode_request(make_feeds(batch // 2, 3))
            rates = [run_threads(lambda _i: whole.process(chunk), n, args.seconds)["calls_per_s"] for n in (1, 2)]
            info = split.model_info()["session_group"]["splitting"]
        finally:
            split.close()
            whole.close()
        row = {"model": name, "batch": batch, "chunk": batch // 2,
               "p50_whole_ms": lat["whole"]["p50_ms"], "p50_split_ms": lat["split"]["p50_ms"],
               "p99_whole_ms": lat["whole"]["p99_ms"], "p99_split_ms": lat["split"]["p99_ms"],
               "p50_ratio": lat["split"]["p50_ms"] / lat["whole"]["p50_ms"],
               "b256_whole_per_s": thr["whole"]["calls_per_s"], "b256_split_per_s": thr["split"]["calls_per_s"],
               "b256_ratio": thr["split"]["calls_per_s"] / thr["whole"]["calls_per_s"],
               "split_requests": info["split_requests"], "chunks_run": info["chunks_run"],
               "two_lanes_speedup": rates[1] / rates[0]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return {"seconds": args.seconds, "rounds": args.rounds, "session_num": 2, "load_average": os.getloadavg(),
            "rows": rows}


def markdown(result: dict) -> str:
    lines = ["# bench_splitting: large requests split across lanes (session_num 2)", "",
             "| model | batch | chunk | p50 whole ms | p50 split ms | split/whole | p99 whole | p99 split "
             "| b256 whole /s | b256 split /s | b256 split/whole | two lanes at once |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['model']} | {r['batch']} | {r['chunk']} | {r['p50_whole_ms']:.1f} | "
                     f"{r['p50_split_ms']:.1f} | {r['p50_ratio']:.2f} | {r['p99_whole_ms']:.1f} | "
                     f"{r['p99_split_ms']:.1f} | {r['b256_whole_per_s']:.0f} | {r['b256_split_per_s']:.0f} | "
                     f"{r['b256_ratio']:.2f} | {r['two_lanes_speedup']:.2f} x |")
    lines += ["", "Targets: p50 split/whole <= 0.6; batch 256 split/whole >= 0.95. Calls through "
              "process() (serialized requests); answers checked allclose first. 'two lanes at once': "
              "chunk-sized requests/s from 2 threads over 1 thread, run whole (2.0 where two cores are "
              "free; the most splitting can gain). Medians of "
              f"{result['rounds']} rounds of {result['seconds']} s each (whole and split alternating); "
              f"load average at the end {result['load_average'][0]:.1f} on this machine's "
              f"{os.cpu_count()} CPUs."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--preset", default="auto", choices=("auto", "small", "full"))
    args = parser.parse_args()
    result = bench(args)
    write_results("bench_splitting", result, markdown(result))


if __name__ == "__main__":
    main()
