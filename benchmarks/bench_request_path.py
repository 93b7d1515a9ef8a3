"""process() against the bare engine call: throughput, and the GIL each request holds.

For every model, batch and thread count, the processor is built with ``session_num`` = threads
(per-session pools of one intra-op thread, MOD: calling thread ``i`` keeps lane ``i``) and two
loops run from ``threads`` Python threads for ``--seconds`` each:

* ``process``: ``Processor.process(request bytes)`` -> response bytes (decode, checks, lane pick,
  update gate, engine, encode: the whole request path the C ABI and the servers use);
* ``raw``: the engine's own call on the same lane's session with the same inputs converted once
  (``benchmarks.bare_engine.bare_call``: ``InferenceSession.run`` / the TF callable), i.e. the limit.

``ratio`` = process req/s / raw req/s. The GIL-held microseconds per request are measured on one
calling thread with ``py-spy record --gil`` (samples in which a thread holds the GIL, 1000 a
second), with the functions they fall in for process().

The C host row runs ``cpp_processor/build/processor_host`` (the real ``.so`` from C++ threads) at
batch 256 with 1 and 4 threads on a session_num=4 processor: its scaling 4 / 1.

Models (``--models``):

* ``dlrm-onnx``: demo/dlrm_onnx.py, a DLRM-like model served from a ``.onnx`` file on ONNX Runtime;
* ``demo-onnxruntime`` / ``demo-tensorflow``: the demo CTR model (``--preset``) on each backend
  (string features hashed by the processor on ONNX Runtime, by the graph on TensorFlow).

``--device cuda``: ONNX Runtime on GPU 0, one session (CUDA stream) per lane (``gpu_ids_list`` 0,
``use_multi_stream``). Results: ``benchmarks/results/request_path[-TAG].json`` and ``.md``.

    .venv/bin/python -m benchmarks.bench_request_path [--models dlrm-onnx,demo-onnxruntime]
        [--batches 1,256,2048] [--threads 1,2] [--seconds 3] [--device cpu|cuda] [--tag NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.bare_engine import bare_call
from benchmarks.common import RESULTS, run_threads, write_results

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "artifacts" / "bench_request_path"


# --- models -------------------------------------------------------------------------------------

def model_source(name: str, preset: str) -> tuple[dict, object]:
    """(model_config base, inputs(batch) -> {alias: array}) for a model name."""
    if name == "dlrm-onnx":
        from demo import dlrm_onnx

        path = WORK / "dlrm" / "model.onnx"
        if not path.is_file():
            dlrm_onnx.build(path)
        return {"savedmodel_dir": str(path.parent), "backend": "onnxruntime"}, dlrm_onnx.inputs
    from benchmarks.common import demo_paths
    from demo.synthetic_data import synthetic_batch

    paths = demo_paths(preset)
    backend = name.removeprefix("demo-")
    return ({"savedmodel_dir": str(paths.savedmodel_dir), "checkpoint_dir": str(paths.checkpoint_dir),
             "backend": backend}, lambda batch: synthetic_batch(batch, seed=batch))


def processor_config(base: dict, sessions: int, device: str, gpu_native: bool = False) -> dict:
    config = {**base, "session_num": sessions, "use_per_session_threads": True,
              "select_session_policy": "MOD", "inter_op_parallelism_threads": 1,
              "intra_op_parallelism_threads": 1, "file_system_poll_wait_seconds": 0}
    if device == "cuda":
        config.update(gpu_ids_list="0", use_multi_stream=True, native_engine_gpu_lanes=gpu_native)
    return config


# --- GIL profile (py-spy) ---------------------------------------------------------------------

def py_spy() -> str | None:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    return found if Path(found).exists() else None


def gil_profile(call, seconds: float, rate: int = 1000) -> dict | None:
    """GIL-held microseconds per ``call()`` on one thread, and where they go, by py-spy.

    ``py-spy record --gil`` samples this process ``rate`` times a second and keeps the samples
    in which a thread holds the GIL: samples / rate is the GIL-held time. The leaf functions of
    those samples say where it goes. None when py-spy is not installed.
    """
    exe = py_spy()
    if exe is None:
        return None
    out = WORK / "py-spy.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    proc = subprocess.Popen([exe, "record", "--gil", "--nonblocking", "--rate", str(rate), "--duration",
                             str(int(seconds)), "--format", "raw", "--output", str(out), "--pid", str(os.getpid())],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    calls, started = 0, time.perf_counter()
    deadline = started + int(seconds) + 0.5  # py-spy attaches, then records `seconds`
    while time.perf_counter() < deadline:
        call()
        calls += 1
    elapsed = time.perf_counter() - started
    proc.wait(60)
    if proc.returncode != 0 or not out.exists():
        print(f"py-spy failed: {proc.stderr.read()[-500:]}", file=sys.stderr)
        return None
    leaves: dict[str, int] = {}
    samples = 0
    for line in out.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        samples += int(count)
        leaf = stack.rsplit(";", 1)[-1]
        leaves[leaf] = leaves.get(leaf, 0) + int(count)
    per_call = 1e6 / rate / (calls / elapsed * int(seconds))  # us of GIL per sample, per call
    top = sorted(leaves.items(), key=lambda kv: -kv[1])[:8]
    return {"gil_us": samples * per_call, "samples": samples,
            "top": [{"where": k, "us": round(v * per_call, 2)} for k, v in top]}


# --- measurements -------------------------------------------------------------------------------

def paired_rounds(mine, theirs, threads: int, seconds: float, rounds: int) -> tuple[dict, dict, float]:
    """``rounds`` alternating loops of each; (median round of mine, of theirs, median of the
    per-round ratios). Alternating pairs keep a noisy neighbour from favouring one side."""
    pairs = [(run_threads(mine, threads, seconds), run_threads(theirs, threads, seconds)) for _ in range(rounds)]
    ratios = sorted(a["calls_per_s"] / b["calls_per_s"] for a, b in pairs)
    median = lambda runs: sorted(runs, key=lambda r: r["calls_per_s"])[len(runs) // 2]  # noqa: E731
    return median([a for a, _ in pairs]), median([b for _, b in pairs]), ratios[len(ratios) // 2]


def measure_model(name: str, args) -> list[dict]:
    from processor import codec
    from processor.processor import Processor

    base, make_inputs = model_source(name, args.preset)
    rows = []
    for threads in args.threads:
        proc = Processor.create("bench", json.dumps(processor_config(base, threads, args.device, args.gpu_native)))
        try:
            with proc.manager.acquire() as group:
                backend, signature = group.backend, group.signature
                info = group.describe()
            print("native engine:", json.dumps(info.get("native_engine")), flush=True)
            fetches = tuple(signature.outputs)
            for batch in args.batches:
                inputs = make_inputs(batch)
                request = codec.encode_request(inputs)
                decoded = codec.decode_request(request, signature)
                bare = [bare_call(backend, lane, decoded.feeds, fetches) for lane in range(threads)]
                status, body = proc.process(request)
                assert status == 200, body[:300]
                answer, limit = codec.decode_response(body), bare[0]()
                diff = max(float(np.max(np.abs(answer[k] - v), initial=0.0)) for k, v in zip(fetches, limit))
                process, raw, ratio = paired_rounds(lambda i: proc.process(request), lambda i: bare[i](),
                                                    threads, args.seconds, args.rounds)
                row = {"model": name, "device": args.device, "batch": batch, "threads": threads,
                       "request_bytes": len(request), "max_abs_diff_vs_raw": diff,
                       "process_rps": process["calls_per_s"], "raw_rps": raw["calls_per_s"],
                       "ratio": ratio, "rounds": args.rounds,
                       "process_p50_us": process["p50_us"], "process_p99_us": process["p99_us"],
                       "raw_p50_us": raw["p50_us"], "raw_p99_us": raw["p99_us"]}
                if threads == args.threads[0] and args.gil_seconds > 0:
                    mine, theirs = (gil_profile(lambda: proc.process(request), args.gil_seconds),
                                    gil_profile(bare[0], args.gil_seconds))
                    if mine and theirs:
                        row.update(gil_us_process=mine["gil_us"], gil_us_raw=theirs["gil_us"],
                                   gil_where_process=mine["top"])
                rows.append(row)
                print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}),
                      flush=True)
        finally:
            proc.close()
    rows[-1]["request_codec"] = info.get("request_codec")
    return rows


def measure_tf_strings(args) -> list[dict]:
    """TensorFlow: the string inputs as an object array of bytes (what the codec makes) vs a
    fixed-width numpy 'S' array, fed to the bare TF call; calls/s and GIL us, batch 256 / 2048."""
    from processor import codec
    from processor.processor import Processor

    base, make_inputs = model_source("demo-tensorflow", args.preset)
    proc = Processor.create("bench", json.dumps(processor_config(base, 1, "cpu")))
    rows = []
    try:
        with proc.manager.acquire() as group:
            backend, signature = group.backend, group.signature
        strings = [a for a, s in signature.inputs.items() if s.dtype == 7]
        for batch in (256, 2048):
            feeds = codec.decode_request(codec.encode_request(make_inputs(batch)), signature).feeds
            fixed = {**feeds, **{a: feeds[a].astype("S") for a in strings}}
            for form, f in (("object bytes", feeds), ("fixed-width S", fixed)):
                call = bare_call(backend, 0, f, tuple(signature.outputs))
                loop = run_threads(lambda i: call(), 1, args.seconds * args.rounds)
                gil = gil_profile(call, args.gil_seconds) if args.gil_seconds > 0 else None
                rows.append({"batch": batch, "form": form, "rps": loop["calls_per_s"],
                             "gil_us": gil["gil_us"] if gil else None})
                print(json.dumps(rows[-1]), flush=True)
    finally:
        proc.close()
    return rows


def measure_c_host(name: str, args) -> dict | None:
    """processor_host (the .so from C++ threads), batch 256, 1 and 4 threads, session_num 4."""
    host = ROOT / "cpp_processor" / "build" / "processor_host"
    if not host.exists():
        print(f"skipping the C host: {host} is not built", file=sys.stderr)
        return None
    from processor import codec

    base, make_inputs = model_source(name, args.preset)
    work = WORK / "c_host"
    work.mkdir(parents=True, exist_ok=True)
    (work / "config.json").write_text(json.dumps(processor_config(base, 4, args.device, args.gpu_native)))
    (work / "request.pb").write_bytes(codec.encode_request(make_inputs(256)))
    out = {"model": name, "device": args.device, "batch": 256}
    for threads in (1, 4):
        calls = max(200, int(args.host_calls / threads))
        proc = subprocess.run([str(host), "--config", str(work / "config.json"), "--request",
                               str(work / "request.pb"), "--threads", str(threads), "--calls", str(calls),
                               "--repeat", "3"], capture_output=True, text=True, timeout=900)
        results = [json.loads(x[len("RESULT "):]) for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if proc.returncode != 0 or not results or results[-1].get("errors"):
            raise RuntimeError(f"processor_host failed:\n{proc.stdout}\n{proc.stderr[-3000:]}")
        out[f"rps_{threads}"] = results[-1]["calls_per_s"]
    out["scaling_4_over_1"] = out["rps_4"] / out["rps_1"]
    print(json.dumps(out), flush=True)
    return out


# --- report -------------------------------------------------------------------------------------

def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    gpu = ""
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    import onnxruntime

    return {"cpu": cpu, "cores": os.cpu_count(), "gpu": gpu or None, "python": platform.python_version(),
            "onnxruntime": onnxruntime.__version__, "numpy": np.__version__}


def markdown(payload: dict) -> str:
    m = payload["machine"]
    lines = [f"# Request path: process() vs the bare engine call ({payload['device']})", "",
             f"Machine: {m['cpu']}, {m['cores']} cores" + (f", {m['gpu']}" if m["gpu"] else "") +
             f"; Python {m['python']}, onnxruntime {m['onnxruntime']}. {payload['seconds']} s per loop, "
             f"{payload.get('rounds', 1)} alternating rounds (median); session_num = threads, intra-op 1, MOD" +
             ("; GPU lanes on the native engine" if payload.get("gpu_native") else "") + ".", "",
             "| model | batch | threads | process req/s | raw req/s | ratio | p99 process / raw us "
             "| GIL us/request process / raw |", "|---|---|---|---|---|---|---|---|"]
    for r in payload["rows"]:
        gil = (f"{r['gil_us_process']:.1f} / {r['gil_us_raw']:.1f}" if "gil_us_process" in r else "")
        lines.append(f"| {r['model']} | {r['batch']} | {r['threads']} | {r['process_rps']:,.0f} | "
                     f"{r['raw_rps']:,.0f} | {r['ratio']:.2f} | {r['process_p99_us']:,.0f} / "
                     f"{r['raw_p99_us']:,.0f} | {gil} |")
    worst: dict[tuple, float] = {}
    for r in payload["rows"]:
        key = (r["model"], r["batch"])
        worst[key] = min(worst.get(key, 9.9), r["ratio"])
    lines += ["", "Worst ratio over thread counts: " +
              ", ".join(f"{m} batch {b}: {v:.2f}" for (m, b), v in worst.items())]
    for r in payload["rows"]:
        if r.get("gil_where_process"):
            lines += ["", f"Where process() holds the GIL ({r['model']}, batch {r['batch']}, us/request): " +
                      "; ".join(f"{w['where']} {w['us']}" for w in r["gil_where_process"])]
    if payload.get("tf_strings"):
        lines += ["", "TensorFlow string inputs (bare call, 1 thread): " + "; ".join(
            f"batch {r['batch']} {r['form']}: {r['rps']:,.0f} req/s"
            + (f", GIL {r['gil_us']:.0f} us" if r["gil_us"] is not None else "") for r in payload["tf_strings"])]
    for h in payload["c_host"]:
        lines += ["", f"C host ({h['model']}, batch 256, session_num 4): {h['rps_1']:,.0f} req/s on 1 thread, "
                      f"{h['rps_4']:,.0f} on 4: {h['scaling_4_over_1']:.2f}x"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    parser.add_argument("--models", default="dlrm-onnx,demo-onnxruntime,demo-tensorflow")
    parser.add_argument("--preset", default="auto", help="demo model preset (full, small, auto)")
    parser.add_argument("--batches", type=ints, default=[1, 256, 2048])
    parser.add_argument("--threads", type=ints, default=[1, 2])
    parser.add_argument("--seconds", type=float, default=2.0, help="per loop")
    parser.add_argument("--rounds", type=int, default=3, help="alternating process / raw loops per figure")
    parser.add_argument("--gil-seconds", type=float, default=3.0, help="py-spy window (0: skip)")
    parser.add_argument("--host-calls", type=int, default=4000)
    parser.add_argument("--c-host-model", default="dlrm-onnx", help="model for the C host row ('' = none)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--tf-strings", action="store_true",
                        help="also time the forms TensorFlow can take string inputs in")
    parser.add_argument("--tag", default="", help="suffix of the result files, e.g. h100")
    parser.add_argument("--gpu-native", action="store_true",
                        help="GPU lanes on the native ONNX Runtime engine too (native_engine_gpu_lanes)")
    args = parser.parse_args()

    rows = []
    for name in args.models.split(","):
        rows += measure_model(name, args)
    hosts = [h for h in [measure_c_host(args.c_host_model, args)] if h] if args.c_host_model else []
    tf_strings = measure_tf_strings(args) if args.tf_strings else []
    payload = {"device": args.device, "gpu_native": args.gpu_native, "seconds": args.seconds, "rounds": args.rounds,
               "machine": machine(), "rows": rows,
               "c_host": hosts, "tf_strings": tf_strings}
    write_results("request_path" + (f"-{args.tag}" if args.tag else ""), payload, markdown(payload))


if __name__ == "__main__":
    RESULTS.mkdir(exist_ok=True)
    main()
