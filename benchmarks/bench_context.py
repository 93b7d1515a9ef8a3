"""A ranking request's context sent once vs tiled (issue 47), and the context cache.

The model is built here (:mod:`demo.two_tower`): a two-tower ranker whose user side is a
behaviour sequence of 100 item ids through the item embedding (100,000 x 64), mean-pooled, with
4 profile ids (10,000 x 16) and 16 dense features, through a 512-256 user MLP; the candidate side
an item id and 8 dense features through a 256-128 item MLP; the two concatenated into a 256-128-1
head. A request ranks 500 candidates for one user. Served with ``context_inputs`` = the user's
three inputs, on TensorFlow and on ONNX Runtime (converted from the same SavedModel).

* **context once vs tiled**: the same request with the user's features sent once (one row) or
  tiled into every row (what clients send today); requests/s and p50 through ``process()`` (1 and
  2 calling threads, two lanes) and through HTTP (our wire format, ``server`` in a child process,
  a closed-loop load generator in another); answers checked allclose first.
* **context cache**: a stream of requests in which every user comes back 4 times (64 users,
  each return a fresh candidate list), with and without ``context_cache``; on this model and on
  variants whose user side runs each of the 100 behaviours through a per-position MLP before
  pooling (``--heavy-seq``: a stand-in for a sequence encoder, the user-side cost that caching
  is for).
* **per-candidate only**: the DLRM-like ``.onnx`` (every input per candidate), 500 and 1 rows,
  through ``DataPlane.predict`` with arrays (TF Serving / KServe's path) and ``process()``, with
  the context runner in the request path vs bypassed (its hook replaced by the backend's own run
  for the A/B; the native wire path has no Python hook, only a row check in C++: it is the
  control, showing the measurement's noise); calls per second of the calling thread's CPU time.

Figures are medians of ``--rounds`` rounds alternating the two variants (a paired ratio per
round, so a drift of the shared machine's speed cancels). Results: ``results/context.json``
and ``.md``.

    .venv/bin/python -m benchmarks.bench_context [--seconds 2] [--rounds 5] [--sections once,http,cache,dlrm]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import RESULTS, loadgen_command, run_threads, write_results

ROOT = Path(__file__).resolve().parent.parent / "artifacts" / "bench_context"
CANDIDATES = 500
USERS, RETURNS = 64, 4
SECTIONS = {"once", "http", "cache", "dlrm"}


def build_models(root: Path, heavy: list[tuple[int, ...]]) -> dict[str, Path]:
    """The two-tower model, its heavy-user variants (``heavy``: each a per-position MLP, named
    ``two_tower_heavy_<widths>``) and the DLRM-like .onnx, built once each."""
    from demo import dlrm_onnx, two_tower

    out = {}
    for widths in [(), *heavy]:
        name = f"two_tower_heavy_{'x'.join(map(str, widths))}" if widths else "two_tower"
        version = root / name / "1"
        if not (version / "saved_model.pb").is_file():
            two_tower.build(root / name, seq_hidden=widths)
        out[name] = version
    dlrm = root / "dlrm" / "model.onnx"
    if not dlrm.is_file():
        dlrm_onnx.build(dlrm)
    out["dlrm"] = dlrm.parent
    return out


def model_config(path: Path, backend: str, **extra) -> dict:
    from demo import two_tower

    return {"savedmodel_dir": str(path), "backend": backend, "session_num": 2, "use_per_session_threads": True,
            "intra_op_parallelism_threads": 1, "inter_op_parallelism_threads": 1,
            "context_inputs": list(two_tower.USER_INPUTS), **extra}


def paired(calls: dict, threads: int, seconds: float, rounds: int) -> dict:
    """Each variant of ``calls`` (name -> call(i)) for ``seconds``, alternating, ``rounds`` times."""
    runs: dict[str, list[dict]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            runs[name].append(run_threads(call, threads, seconds))
    return {name: {"calls_per_s": statistics.median(r["calls_per_s"] for r in rs),
                   "p50_us": statistics.median(r["p50_us"] for r in rs),
                   "per_round_calls_per_s": [round(r["calls_per_s"], 1) for r in rs]}
            for name, rs in runs.items()}


def ratio(results: dict, a: str, b: str, key: str) -> float:
    """Median over rounds of a's figure / b's (paired by round) for throughput; plain for p50."""
    if key == "calls_per_s":
        return statistics.median(x / y for x, y in zip(results[a]["per_round_calls_per_s"],
                                                       results[b]["per_round_calls_per_s"]))
    return results[a][key] / results[b][key]


def check_answers(proc, context: dict, tiled: dict) -> float:
    from processor import codec

    got = codec.decode_response(proc.process(codec.encode_request(context))[1])["prob"]
    want = codec.decode_response(proc.process(codec.encode_request(tiled))[1])["prob"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    return float(np.abs(got - want).max())


def once_vs_tiled(models: dict, seconds: float, rounds: int) -> list[dict]:
    from demo import two_tower
    from processor import codec
    from processor.processor import Processor

    rows = []
    feeds = two_tower.request(CANDIDATES)
    context, tiled = codec.encode_request(feeds), codec.encode_request(two_tower.tiled(feeds))
    for backend in ("tensorflow", "onnxruntime"):
        proc = Processor.create("two_tower", json.dumps(model_config(models["two_tower"], backend)))
        diff = check_answers(proc, feeds, two_tower.tiled(feeds))
        with proc.manager.acquire() as group:
            part = group.describe()["context"]["context_part"]
        for threads in (1, 2):
            res = paired({"context_once": lambda i: proc.process(context), "tiled": lambda i: proc.process(tiled)},
                         threads, seconds, rounds)
            row = {"backend": backend, "path": "process()", "threads": threads, **res,
                   "throughput_ratio": ratio(res, "context_once", "tiled", "calls_per_s"),
                   "p50_ratio": ratio(res, "context_once", "tiled", "p50_us"), "max_abs_diff": diff,
                   "request_bytes": {"context_once": len(context), "tiled": len(tiled)},
                   "context_part": {k: part[k] for k in ("boundary_tensors", "context_nodes", "model_nodes",
                                                         "work_share_estimate")}}
            rows.append(row)
            print(f"{backend:11s} process() threads={threads}: once {res['context_once']['calls_per_s']:7.1f}/s "
                  f"p50 {res['context_once']['p50_us'] / 1e3:6.2f} ms | tiled {res['tiled']['calls_per_s']:7.1f}/s "
                  f"p50 {res['tiled']['p50_us'] / 1e3:6.2f} ms | x{row['throughput_ratio']:.2f} "
                  f"p50 x{row['p50_ratio']:.2f}", flush=True)
        proc.close()
    return rows


def over_http(models: dict, seconds: float, rounds: int) -> list[dict]:
    from demo import two_tower
    from processor import codec
    from tools.server_process import ServerProcess

    feeds = two_tower.request(CANDIDATES)
    bodies = {"context_once": codec.encode_request(feeds), "tiled": codec.encode_request(two_tower.tiled(feeds))}
    deployment = {"models": [{"name": f"tt_{b}", "model_config": model_config(models["two_tower"], b)}
                             for b in ("tensorflow", "onnxruntime")], "access_log": False}
    rows = []
    with tempfile.TemporaryDirectory() as work:
        server = ServerProcess(deployment, Path(work) / "server").start(timeout=600)
        try:
            assert set(server.wait_models(600).values()) == {"ready"}, server.log()
            for backend in ("tensorflow", "onnxruntime"):
                runs: dict[str, list[dict]] = {k: [] for k in bodies}
                for _ in range(rounds):
                    for name, body in bodies.items():
                        spec = Path(work) / "spec.json"
                        (Path(work) / "body").write_bytes(body)
                        spec.write_text(json.dumps({
                            "kind": "http", "host": "127.0.0.1", "port": server.http_port,
                            "path": f"/api/predict/tt_{backend}", "content_type": "application/x-protobuf",
                            "body_file": str(Path(work) / "body"), "concurrency": 2, "seconds": seconds,
                            "warmup_seconds": 0.5}))
                        out = subprocess.run(loadgen_command(spec), capture_output=True, text=True, check=True)
                        result = json.loads(out.stdout.strip().splitlines()[-1])
                        assert result["errors"] == 0, result
                        runs[name].append(result)
                res = {name: {"calls_per_s": statistics.median(r["rps"] for r in rs),
                              "p50_us": statistics.median(r["p50_ms"] for r in rs) * 1e3,
                              "per_round_calls_per_s": [round(r["rps"], 1) for r in rs]} for name, rs in runs.items()}
                row = {"backend": backend, "path": "HTTP (our wire format)", "threads": 2, **res,
                       "throughput_ratio": ratio(res, "context_once", "tiled", "calls_per_s"),
                       "p50_ratio": ratio(res, "context_once", "tiled", "p50_us")}
                rows.append(row)
                print(f"{backend:11s} HTTP 2 connections: once {res['context_once']['calls_per_s']:7.1f}/s "
                      f"p50 {res['context_once']['p50_us'] / 1e3:6.2f} ms | tiled {res['tiled']['calls_per_s']:7.1f}/s "
                      f"p50 {res['tiled']['p50_us'] / 1e3:6.2f} ms | x{row['throughput_ratio']:.2f} "
                      f"p50 x{row['p50_ratio']:.2f}", flush=True)
        finally:
            server.stop(timeout=60)
    return rows


def stream(requests: int) -> list[bytes]:
    """``requests`` requests (at least) in cohorts of USERS new users, each user coming back
    RETURNS times within its cohort (each time with other candidates, the cohort's requests
    shuffled): a user is never seen again after its cohort, so the hit rate is the returns'."""
    from demo import two_tower
    from processor import codec

    rng = np.random.default_rng(7)
    out: list[bytes] = []
    cohort = 0
    while len(out) < requests:
        users = [cohort * USERS + u for u in range(USERS)] * RETURNS
        rng.shuffle(users)
        out += [codec.encode_request(two_tower.request(CANDIDATES, user=u, seed=len(out) + i))
                for i, u in enumerate(users)]
        cohort += 1
    return out


def cached(models: dict, seconds: float, rounds: int) -> list[dict]:
    from processor.processor import Processor

    # enough for every call of a variant (at most ~800/s here) without coming back to a cohort
    requests = stream(int(rounds * (seconds + 0.5) * 800) + 100)
    rows = []
    for model in (m for m in models if m.startswith("two_tower")):
        for backend in ("tensorflow", "onnxruntime"):
            procs = {"no_cache": Processor.create(model, json.dumps(model_config(models[model], backend))),
                     "cache": Processor.create(model, json.dumps(model_config(
                         models[model], backend, context_cache={"max_entries": USERS})))}
            for proc in procs.values():  # same answers with and without the cache
                for data in requests[:4]:
                    assert proc.process(data)[0] == 200
            calls = {}
            for name, proc in procs.items():
                counter = iter(range(4, 1 << 62))  # after the 4 checked above
                calls[name] = (lambda p, c: lambda i: p.process(requests[next(c) % len(requests)]))(proc, counter)
            res = paired(calls, 1, seconds, rounds)
            with procs["cache"].manager.acquire() as group:
                stats = group.context.stats()["cache"]
                share = group.describe()["context"]["context_part"]["work_share_estimate"]
            row = {"model": model, "backend": backend, "threads": 1, "work_share_estimate": share, **res,
                   "throughput_ratio": ratio(res, "cache", "no_cache", "calls_per_s"),
                   "p50_ratio": ratio(res, "cache", "no_cache", "p50_us"),
                   "hit_rate": stats["hits"] / max(1, stats["hits"] + stats["misses"]), "cache_bytes": stats["bytes"]}
            rows.append(row)
            print(f"{model:15s} {backend:11s} cache {res['cache']['calls_per_s']:7.1f}/s | no cache "
                  f"{res['no_cache']['calls_per_s']:7.1f}/s | x{row['throughput_ratio']:.2f} "
                  f"(hit rate {row['hit_rate']:.2f})", flush=True)
            for proc in procs.values():
                proc.close()
    return rows


def alternating(call, use, variants: dict, seconds: float, block: int = 200) -> dict:
    """``call()`` with each of ``variants`` (name -> what ``use`` installs) in turn, call by call,
    for about ``seconds``: per variant the calling thread's CPU time per call (the engine runs on
    it here: intra-op pools of one) and the wall time; the ratio is the median over blocks of
    ``block`` calls of each. Alternating every call cancels the shared machine's drift, which
    alternating rounds of seconds do not (the control row shows what is left)."""
    names = list(variants)
    for name in names:
        use(variants[name])
        for _ in range(20):
            call()
    cpu = {n: [] for n in names}
    wall = {n: [] for n in names}
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop:
        sums = {n: [0, 0.0] for n in names}
        for _ in range(block):
            for name in names:
                use(variants[name])
                c0, w0 = time.thread_time_ns(), time.perf_counter()
                call()
                sums[name][0] += time.thread_time_ns() - c0
                sums[name][1] += time.perf_counter() - w0
        for name in names:
            cpu[name].append(sums[name][0] / 1e9 / block)
            wall[name].append(sums[name][1] / block)
    return {"calls_per_cpu_s": {n: 1 / statistics.median(cpu[n]) for n in names},
            "calls_per_s": {n: 1 / statistics.median(wall[n]) for n in names},
            "blocks": len(cpu[names[0]]),
            "cpu_ratio": statistics.median(b / a for a, b in zip(cpu[names[0]], cpu[names[1]])),
            "wall_ratio": statistics.median(b / a for a, b in zip(wall[names[0]], wall[names[1]]))}


def per_candidate_only(models: dict, seconds: float, rounds: int) -> list[dict]:
    from demo import dlrm_onnx
    from processor import codec
    from processor.processor import Processor
    from processor.request import PredictCall

    proc = Processor.create("dlrm", json.dumps({"savedmodel_dir": str(models["dlrm"]), "session_num": 1,
                                                "intra_op_parallelism_threads": 1, "inter_op_parallelism_threads": 1}))
    rows = []
    with proc.manager.acquire() as group:
        variants = {"hook": group._engine_run, "bypassed": group.backend.run}

        def use(run):
            group._engine_run = run  # the A/B: the context runner's hook vs the backend's run

        for batch in (CANDIDATES, 1):
            feeds = dlrm_onnx.inputs(batch, seed=batch)
            wire = codec.encode_request(feeds)
            arrays = PredictCall("dlrm", feeds)
            for path, call in (("DataPlane.predict(arrays)", lambda: proc.dataplane.predict(arrays)),
                               ("process() (native wire path, no hook: the noise control)",
                                lambda: proc.process(wire))):
                res = alternating(call, use, variants, seconds * rounds)
                use(variants["hook"])
                row = {"batch": batch, "path": path, **res}
                rows.append(row)
                print(f"dlrm batch={batch:3d} {path:28.28s}: hook {res['calls_per_cpu_s']['hook']:8.0f}/cpu-s | "
                      f"bypassed {res['calls_per_cpu_s']['bypassed']:8.0f}/cpu-s | x{row['cpu_ratio']:.3f} "
                      f"(wall x{row['wall_ratio']:.3f}, {res['blocks']} blocks)", flush=True)
    proc.close()
    return rows


def markdown(result: dict) -> str:
    lines = [f"# A ranking request's context sent once vs tiled ({result['cpus']} CPUs, {CANDIDATES} candidates)", "",
             "Two-tower model (user: 100 behaviour ids through a 100,000 x 64 item embedding, mean-pooled, 4 profile "
             "ids, 16 dense, a 512-256 MLP; item: id + 8 dense through a 256-128 MLP; head 256-128-1). Medians of "
             f"{result['rounds']} alternating rounds of {result['seconds']} s; ratios paired per round.", "",
             "| backend | path | threads | once req/s | tiled req/s | req/s ratio | once p50 ms | tiled p50 ms | p50 ratio |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in result["once_vs_tiled"]:
        lines.append(f"| {r['backend']} | {r['path']} | {r['threads']} | {r['context_once']['calls_per_s']:.1f} | "
                     f"{r['tiled']['calls_per_s']:.1f} | {r['throughput_ratio']:.2f} | "
                     f"{r['context_once']['p50_us'] / 1e3:.2f} | {r['tiled']['p50_us'] / 1e3:.2f} | {r['p50_ratio']:.2f} |")
    first = result["once_vs_tiled"][0]
    lines += ["", f"Request bytes: {first['request_bytes']['context_once']:,} (context once) vs "
              f"{first['request_bytes']['tiled']:,} (tiled). Context part: "
              + "; ".join(f"{r['backend']}: {r['context_part']['context_nodes']} of {r['context_part']['model_nodes']} "
                          f"nodes, work share {r['context_part']['work_share_estimate']:.2f}"
                          for r in result["once_vs_tiled"] if r["path"] == "process()" and r["threads"] == 1), ""]
    lines += ["## Context cache: every user returns 4 times", "",
              "`two_tower_heavy_AxB`: the same model with each of the 100 behaviours through a per-position "
              "A-B MLP before pooling (a stand-in for a sequence encoder: the user-side cost a cache is for). "
              "`context share`: the context part's estimated share of a context-once request's work, from model "
              "info's `work_share_estimate` s (its share per row of the tiled model): s / (s + (1 - s) N), "
              f"N = {CANDIDATES}: what a cache hit can save.", "",
              "| model | backend | context share | cache req/s | no cache req/s | ratio | p50 ratio | hit rate |",
              "|---|---|---|---|---|---|---|---|"]
    for r in result["cache"]:
        s = r["work_share_estimate"]
        once_share = s / (s + (1 - s) * CANDIDATES)
        lines.append(f"| {r['model']} | {r['backend']} | {once_share:.3f} | {r['cache']['calls_per_s']:.1f} | "
                     f"{r['no_cache']['calls_per_s']:.1f} | {r['throughput_ratio']:.2f} | {r['p50_ratio']:.2f} | "
                     f"{r['hit_rate']:.2f} |")
    lines += ["", "## Every input per candidate (DLRM-like .onnx): the context runner's hook vs bypassed", "",
              "One calling thread, intra-op pool of one (the engine runs on it); the two variants alternate call by "
              "call; calls per second of that thread's CPU time and the median ratio over blocks of 200 calls "
              "(hook / bypassed; the wall-clock ratio beside it).", "",
              "| batch | path | hook calls/cpu-s | bypassed calls/cpu-s | ratio | wall ratio |", "|---|---|---|---|---|---|"]
    for r in result["per_candidate_only"]:
        lines.append(f"| {r['batch']} | {r['path']} | {r['calls_per_cpu_s']['hook']:.0f} | "
                     f"{r['calls_per_cpu_s']['bypassed']:.0f} | {r['cpu_ratio']:.3f} | {r['wall_ratio']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sections", default="once,http,cache,dlrm",
                        help="which to run (a subset replaces those of the existing results/context.json)")
    parser.add_argument("--heavy-seq", default="512,256;1024,512",
                        help="heavy variants for the cache: each a per-position MLP over the 100 behaviours "
                             "(widths, variants separated by ';')")
    args = parser.parse_args()
    heavy = [tuple(int(w) for w in variant.split(",")) for variant in args.heavy_seq.split(";") if variant]
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    models = build_models(ROOT, heavy)
    sections = set(args.sections.split(","))
    started = time.monotonic()
    previous = RESULTS / "context.json"
    result = json.loads(previous.read_text()) if sections != SECTIONS and previous.is_file() else {}
    result.update({"cpus": os.cpu_count(), "seconds": args.seconds, "rounds": args.rounds,
                   "heavy_seq": [list(h) for h in heavy]})
    if "once" in sections:
        result["once_vs_tiled"] = once_vs_tiled(models, args.seconds, args.rounds) + [
            r for r in result.get("once_vs_tiled", []) if r["path"] != "process()"]
    if "http" in sections:
        result["once_vs_tiled"] = [r for r in result.get("once_vs_tiled", []) if r["path"] == "process()"] + \
            over_http(models, args.seconds, args.rounds)
    if "cache" in sections:
        result["cache"] = cached(models, args.seconds, args.rounds)
    if "dlrm" in sections:
        result["per_candidate_only"] = per_candidate_only(models, args.seconds, args.rounds)
    result["wall_seconds"] = round(time.monotonic() - started, 1)
    write_results("context", result, markdown(result))


if __name__ == "__main__":
    main()
