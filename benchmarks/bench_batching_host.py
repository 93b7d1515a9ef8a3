"""What batching costs and gains for blocking callers: the C ABI host, 32 threads, batch-1 calls.

The example host (``cpp_processor/build/processor_host``: ``libserving_processor.so`` in an
embedded interpreter) calls ``process()`` from ``--threads`` threads, each sending its next
batch-1 request when the answer comes. Two models, each served twice by two hosts up together,
batching off (no ``batching`` key) and on (``max_batch_size`` 64, ``batch_timeout_micros`` 0,
``num_batch_threads`` 2):

* the demo CTR model on TensorFlow (``benchmarks.common.processor_config``: session_num 2, one
  intra- and inter-op thread per session);
* the DLRM-like ``.onnx`` model (``demo.dlrm_onnx``: 26 tables of 20,000 x 16) on ONNX Runtime's
  native engine, the same session settings.

Each round runs off and on back to back (in the other order every other round: this VM's speed
drifts); every figure is the median over ``--rounds``. Besides calls/s, p50 and p99, each phase
reports what its timed calls cost the whole host process (``getrusage``: every thread): CPU
microseconds, voluntary and involuntary context switches per call. The limit, in the same run:
the backend's bare engine call at batch 1 from 2 threads (``benchmarks.bare_engine``).

The issue's targets (batching that pays): on / off >= 3x calls/s on the demo TensorFlow model and
>= 1.5x on the DLRM-like model, p99 no worse; at most 0.5 context switches per call with
batching on. Writes ``benchmarks/results/batching_host.json`` and ``.md``.

    .venv/bin/python -m benchmarks.bench_batching_host [--threads 32] [--seconds 3] [--rounds 4]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
from pathlib import Path

from benchmarks.bench_c_abi import BUILD, HostSession, build_native
from benchmarks.common import demo_paths, processor_config, write_results

BATCHING = {"max_batch_size": 64, "batch_timeout_micros": 0, "num_batch_threads": 2}
FIGURES = ("calls_per_s", "p50_us", "p99_us", "cpu_us_per_call", "vcsw_per_call", "ivcsw_per_call")


def models(work: Path) -> dict[str, tuple[dict, bytes]]:
    """Per model: (model_config without batching, a batch-1 request)."""
    from demo import dlrm_onnx
    from demo.synthetic_data import synthetic_batch
    from processor.codec import encode_request

    dlrm = work / "dlrm"
    dlrm_onnx.build(dlrm / "model.onnx", rows=20_000, dim=16, seed=1)
    onnx_config = {"savedmodel_dir": str(dlrm), "backend": "onnxruntime", "session_num": 2,
                   "use_per_session_threads": True, "intra_op_parallelism_threads": 1,
                   "inter_op_parallelism_threads": 1}
    return {"demo (tensorflow)": (processor_config(demo_paths("small"), 2), encode_request(synthetic_batch(1, 5))),
            "dlrm (onnxruntime native)": (onnx_config, encode_request(dlrm_onnx.inputs(1, seed=1)))}


def bench(args) -> dict:
    if not (BUILD / "processor_host").exists():
        build_native()
    work = Path(tempfile.mkdtemp(prefix="bench_batching_host_"))
    results: dict[str, dict] = {}
    for name, (config, request) in models(work).items():
        slug = name.split()[0]
        request_file = work / f"{slug}.pb"
        request_file.write_bytes(request)
        hosts = {}
        for mode, cfg in (("off", config), ("on", {**config, "batching": BATCHING})):
            config_file = work / f"{slug}_{mode}.json"
            config_file.write_text(json.dumps(cfg))
            # batched floats may differ from the first answer in their last bits: the tests
            # compare batched answers with a tolerance (tests/e2e/test_c_abi_batching.py)
            hosts[mode] = HostSession(config_file, request_file, work / f"{slug}_{mode}.log",
                                      extra=("--no-compare",) if mode == "on" else ())
        rounds = []
        try:
            for index in range(args.rounds):
                order = ("off", "on") if index % 2 == 0 else ("on", "off")
                rounds.append({mode: hosts[mode].phase(args.threads, args.seconds) for mode in order})
                print(name, json.dumps({m: {k: rounds[-1][m][k] for k in FIGURES} for m in order}), flush=True)
        finally:
            for host in hosts.values():
                host.close()
        median = {mode: {k: statistics.median(r[mode][k] for r in rounds) for k in FIGURES} for mode in ("off", "on")}
        ratio = statistics.median(r["on"]["calls_per_s"] / r["off"]["calls_per_s"] for r in rounds)
        p99 = statistics.median(r["on"]["p99_us"] / r["off"]["p99_us"] for r in rounds)
        results[name] = {"rounds": rounds, "median": median, "on_off_calls_per_s": ratio, "on_off_p99": p99}
    return {"machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                        "load_average": os.getloadavg()},
            "threads": args.threads, "seconds": args.seconds, "batching": BATCHING, "models": results,
            "targets": {"demo (tensorflow)": 3.0, "dlrm (onnxruntime native)": 1.5, "vcsw_per_call_on": 0.5}}


def markdown(result: dict) -> str:
    lines = [f"# Batching for blocking callers: the C ABI host, {result['threads']} threads, batch 1 "
             f"({result['machine']['cpus']} CPUs, load average {result['machine']['load_average'][0]:.1f})", "",
             f"Batching on: `{json.dumps(result['batching'])}`; medians of {len(next(iter(result['models'].values()))['rounds'])} "
             f"rounds of {result['seconds']} s, off and on back to back.", "",
             "| model | batching | calls/s | p50 us | p99 us | CPU us / call | voluntary cs / call | involuntary cs / call |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in result["models"].items():
        for mode in ("off", "on"):
            m = r["median"][mode]
            lines.append(f"| {name} | {mode} | {m['calls_per_s']:,.0f} | {m['p50_us']:,.0f} | {m['p99_us']:,.0f} | "
                         f"{m['cpu_us_per_call']:.1f} | {m['vcsw_per_call']:.2f} | {m['ivcsw_per_call']:.2f} |")
    lines += ["", "| model | on / off calls/s | target | on / off p99 | context switches / call (on) | target |",
              "|---|---:|---:|---:|---:|---:|"]
    for name, r in result["models"].items():
        on = r["median"]["on"]
        lines.append(f"| {name} | {r['on_off_calls_per_s']:.2f} | >= {result['targets'][name]} | {r['on_off_p99']:.2f} "
                     f"| {on['vcsw_per_call'] + on['ivcsw_per_call']:.2f} | <= {result['targets']['vcsw_per_call_on']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out-dir", type=Path, default=None)
    args = parser.parse_args()
    result = bench(args)
    write_results("batching_host", result, markdown(result), args.out_dir)


if __name__ == "__main__":
    main()
