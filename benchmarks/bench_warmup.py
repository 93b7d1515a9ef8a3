"""First request after warmup vs steady state, for every zoo model, on both backends (issue 14).

Issue 14's target: the first request after warmup is within 3x of the steady state for every zoo
model (before: synthetic warmup ran batch 1 only, so the first batch-8 request took 25-40 ms
against ~1 ms). For each model, each backend (ONNX Runtime where the model converts; a refusal
is recorded as ``refused: ...``) and each warmup mode, one fresh ``processor.processor.Processor``
with no warmup file (synthetic warmup from the signature), in its own subprocess (so one model's
warmup cannot warm another's kernels), serves requests at batch 1, then 8, then 64: per batch
size the first request's latency, the median of the next 50 sent back to back (steady state,
``hot``) and their ratio. Every request is encoded before the Processor is created, so the batch-1
first request is the first thing after ``create()`` returns (a request arriving once the model is
ready); the first at 8 and at 64 follows the warm batch-1 (then batch-8) loop, so its excess over
its own hot loop is the one-time cost of a new batch size. Then two controls, the median of 30
more requests per size each: ``idle``, each sent after a 10 ms sleep (the steady state of a
serving thread at under 100 requests/s), and ``cold``, each sent right after writing a buffer
larger than the CPU's last-level cache (a request after a pause in which other work ran). A
one-time cost left in the first request (an un-warmed shape, a lazy init) shows as first >> idle
and first >> cold (``batch1`` mode at batch 8 shows it); first <= idle means the first request
pays no more than any request that does not follow another one back to back: caches and a
woken core, which no warmup can keep (for models of ten microseconds that alone is 10-20x the
hot loop).

Warmup modes: ``default`` (the processor's own choice: batch sizes 1, 2, 4, 8 for a synthetic
request) and ``batch1`` (``warmup_batch_sizes: [1]``: what warmup did before, to show what the
multi-size warmup buys). Batch 64 is above the default warmed sizes: a reference point.

Models: the zoo builders of ``tests/models`` (imported from there: this script puts ``tests/`` on
``sys.path``; nothing is copied): wide & deep taking serialized tf.Examples and with raw
placeholders, the model rejecting the synthetic input (its warmup is skipped by design, so its
first request is cold), the TF2 zoo (embedding module, static hash table, int64 hashing, Keras
Hashing, py_function: its ``tf.py_function`` callback lives only in the process that built the
model, so in a fresh process it serves nothing, warmup included; recorded as the error it
answers); plus the demo CTR model (small preset) and the toy model. Inputs are
realistic: serialized tf.Examples built as the zoo tests build them, valid ids/tokens/values
otherwise. Models are built once under ``artifacts/bench_warmup`` (ONNX conversions cached in
``artifacts/onnx_cache``). Each Processor: ``demo.paths.model_config`` (1 session, 1 intra / 1
inter thread), timed around ``Processor.process`` (decode, run, encode).

Each row is repeated in ``--repeat`` fresh processes (median first and steady latencies): a
single first request is noisy on a shared machine. For
sub-millisecond models a ratio mostly measures fractions of a millisecond (the report gives the
absolute excess, first minus steady, too). Warmup replays on the session group, so the first
``Processor.process`` is also the first trip through the Python request path.

    .venv/bin/python -m benchmarks.bench_warmup [--models a,b] [--steady 50] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

from benchmarks.common import RESULTS, demo_paths, write_results

ROOT = RESULTS.parent.parent
TESTS = ROOT / "tests"
WORK = ROOT / "artifacts" / "bench_warmup"
CACHE_DIR = ROOT / "artifacts" / "onnx_cache"
BATCHES = (1, 8, 64)
BACKENDS = ("tensorflow", "onnxruntime")
MODES = {"default": {}, "batch1": {"warmup_batch_sizes": [1]}}
TARGET = 3.0
EVICT_BYTES = 128 << 20  # larger than any last-level cache of the machines we measure on
IDLE_SECONDS = 0.01
MODELS = ("wide_deep_examples", "wide_deep_raw", "rejecting", "embedding_module", "static_hash_table",
          "int64_hashing", "keras_hashing", "py_function", "ctr_small", "toy")

WD_ROWS = [
    {"age": [31.0], "hours": [1.5, 2.0], "item_id": [3, 17, 49], "city": [b"paris"]},
    {"age": [54.0], "item_id": [120], "city": [b"oslo", b"lima"]},
    {"age": [19.0], "hours": [0.0, 7.0]},
    {"age": [40.0], "hours": [3.0, 3.0], "item_id": [0], "city": [b""]},
    {"age": [22.5], "hours": [5.0, 1.0], "item_id": [7, 7], "city": [b"rome"]},
]
CITIES = [b"paris", b"oslo", b"lima", b"rome", b""]


def _tests_on_path() -> None:
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))


# --- models --------------------------------------------------------------------------------

def build(name: str):
    """The model's ModelPaths, built on first use."""
    if name == "ctr_small":
        return demo_paths("small")
    from demo.layout import read_model_paths

    out = WORK / name / "model"
    if (out / "savedmodel" / "saved_model.pb").exists():
        return read_model_paths(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    _tests_on_path()
    if name == "toy":
        from demo.toy_model import build_toy_model
        return build_toy_model(out)
    if name.startswith("wide_deep"):
        from models.wide_deep import build_wide_deep
        return build_wide_deep(out, examples=name == "wide_deep_examples")
    if name == "rejecting":
        from models.rejecting import build_rejecting_model
        return build_rejecting_model(out)
    from models import tf2_zoo
    return getattr(tf2_zoo, f"build_{name}")(out)


def feeds(name: str, n: int, seed: int) -> dict:
    """Valid inputs for ``name`` at batch ``n``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    if name == "wide_deep_examples":
        _tests_on_path()
        from models.wide_deep import example_bytes
        return {"examples": example_bytes([WD_ROWS[i % len(WD_ROWS)] for i in range(seed, seed + n)])}
    if name == "wide_deep_raw":
        return {"age": rng.uniform(18, 80, (n, 1)).astype(np.float32),
                "hours": rng.uniform(0, 8, (n, 2)).astype(np.float32),
                "item_id": rng.integers(0, 200, (n, 3), dtype=np.int64),
                "city": np.array([CITIES[i] for i in rng.integers(0, len(CITIES), n)], dtype=object)}
    if name == "rejecting":
        return {"x": rng.uniform(100, 500, (n, 1)).astype(np.float32)}
    if name == "embedding_module":
        return {"ids": rng.integers(-5, 100, n, dtype=np.int64),
                "dense": rng.standard_normal((n, 2)).astype(np.float32)}
    if name == "static_hash_table":
        vocab = [b"apple", b"banana", b"cherry", b"durian", b"elder", b"zzz", b""]
        return {"token": np.array([vocab[i] for i in rng.integers(0, len(vocab), n)], dtype=object)}
    if name == "int64_hashing":
        return {"user_id": rng.integers(-2 ** 63, 2 ** 63 - 1, n, dtype=np.int64)}
    if name == "keras_hashing":
        return {"item_id": rng.integers(0, 10 ** 12, n, dtype=np.int64)}
    if name == "py_function":
        return {"x": rng.standard_normal(n).astype(np.float32)}
    if name == "ctr_small":
        from demo.synthetic_data import synthetic_batch
        return synthetic_batch(n, seed)
    if name == "toy":
        return {"x": rng.uniform(-1, 1, (n, 1)).astype(np.float32)}
    raise ValueError(name)


# --- one model, one backend, one warmup mode (a child process) ------------------------------

_EVICT = None


def evict_caches() -> None:
    """Write a buffer larger than the CPU's last-level cache, so the next request finds the
    caches as cold as a request after a pause does (a control for the first request)."""
    global _EVICT
    import numpy as np

    if _EVICT is None:
        _EVICT = np.empty(EVICT_BYTES, dtype=np.uint8)
    _EVICT.fill(_EVICT[0] + 1)


def idle() -> None:
    """Sleep 10 ms, as a serving thread does between requests below 100 requests/s: the next
    request finds the core woken from idle and its caches as the rest of the machine left them."""
    time.sleep(IDLE_SECONDS)


# controls: (name, what runs before each of their requests); each gives <name>_ms and <name>_ratio
CONTROLS = (("idle", idle), ("cold", evict_caches))


def child(name: str, backend: str, mode: str, steady: int, cold: int = 30) -> dict:
    from demo.paths import model_config
    from processor import codec
    from processor.errors import ProcessorError
    from processor.processor import Processor

    paths = build(name)
    config = model_config(paths, backend=backend, **MODES[mode])
    # every request is encoded before the Processor exists: the batch-1 first request is the
    # first thing after create() returns, as a request arriving once the model is ready is
    bodies = {batch: {"first": codec.encode_request(feeds(name, batch, 1)),
                      "hot": [codec.encode_request(feeds(name, batch, 2 + i)) for i in range(steady)],  # all distinct
                      **{control: [codec.encode_request(feeds(name, batch, 1000 * (k + 1) + i)) for i in range(cold)]
                         for k, (control, _) in enumerate(CONTROLS)}}
              for batch in BATCHES}
    clock = time.perf_counter
    started = clock()
    try:
        p = Processor.create("", json.dumps(config))
    except ProcessorError as err:
        return {"refused": f"{type(err).__name__}: {err.message}"}
    load_s = clock() - started
    try:
        cells: dict = {}
        # phase 1, per batch size in turn: its first request, then the hot loop. The first at 8
        # and 64 follows the warm batch-1 loop, so what it pays over its own hot loop is the
        # one-time cost of a new batch size (what multi-size warmup removes)
        for batch in BATCHES:
            t0 = clock()
            status, reply = p.process(bodies[batch]["first"])
            first = clock() - t0
            if status != 200:
                cells[batch] = {"error": f"{status}: {reply[:200]!r}"}
                continue
            times = []
            for body in bodies[batch]["hot"]:
                t0 = clock()
                status, _ = p.process(body)
                times.append(clock() - t0)
                assert status == 200
            cells[batch] = {"first": first, "hot": statistics.median(times)}
        # phase 2, the controls: the same kind of requests after other work, after a pause
        for batch, cell in cells.items():
            if "error" in cell:
                continue
            for control, before in CONTROLS:
                times = []
                for body in bodies[batch][control]:
                    before()
                    t0 = clock()
                    status, _ = p.process(body)
                    times.append(clock() - t0)
                    assert status == 200
                cell[control] = statistics.median(times)
        info = p.model_info()
        warmup = {k: info["warmup"].get(k) for k in ("source", "runs", "batch_sizes", "batch_runs",
                                                      "skipped", "seconds")}
        out = {"load_s": round(load_s, 3), "warmup": warmup, "batches": {}}
        for batch, cell in cells.items():
            if "error" in cell:
                out["batches"][str(batch)] = cell
                continue
            first, hot = cell["first"], cell["hot"]
            out["batches"][str(batch)] = {"first_ms": round(first * 1e3, 3), "steady_ms": round(hot * 1e3, 3),
                                          "ratio": round(first / hot, 2), "excess_ms": round((first - hot) * 1e3, 3),
                                          **_control_cells(first * 1e3, {c: cell[c] * 1e3 for c, _ in CONTROLS})}
        return out
    finally:
        p.close()


def combine(runs: list[dict]) -> dict:
    """Repeats of one child -> the median first and steady latency per batch (ratio of the
    medians) and every repeat's ratio; a refusal or an error as the first repeat gave it."""
    served = [r for r in runs if "batches" in r]
    if len(served) < len(runs):
        return next(r for r in runs if "batches" not in r)
    out = {**served[0], "repeats": len(served), "batches": {}}
    for batch in served[0]["batches"]:
        cells = [r["batches"][batch] for r in served]
        if any("error" in c for c in cells):
            out["batches"][batch] = next(c for c in cells if "error" in c)
            continue
        first = statistics.median(c["first_ms"] for c in cells)
        steady = statistics.median(c["steady_ms"] for c in cells)
        controls = {control: statistics.median(c[f"{control}_ms"] for c in cells) for control, _ in CONTROLS}
        out["batches"][batch] = {"first_ms": round(first, 3), "steady_ms": round(steady, 3),
                                 "ratio": round(first / steady, 2), "excess_ms": round(first - steady, 3),
                                 **_control_cells(first, controls),
                                 "ratio_per_repeat": [c["ratio"] for c in cells]}
    return out


def _control_cells(first_ms: float, controls_ms: dict[str, float]) -> dict:
    """``<control>_ms`` and ``<control>_ratio`` (first / control) for each control."""
    out = {}
    for control, ms in controls_ms.items():
        out[f"{control}_ms"] = round(ms, 3)
        out[f"{control}_ratio"] = round(first_ms / ms, 2)
    return out


def run_child(name: str, backend: str, mode: str, steady: int, cold: int) -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "SP_ONNX_CACHE_DIR": str(CACHE_DIR)}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_warmup", "--child", name, backend, mode,
                           "--steady", str(steady), "--cold", str(cold)], capture_output=True, text=True, env=env, cwd=ROOT)
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": f"child exited {proc.returncode}: {proc.stderr.strip()[-400:]}"}
    return json.loads(lines[-1])


# --- report --------------------------------------------------------------------------------

def worst(row: dict, batches=BATCHES, key: str = "ratio") -> float | None:
    ratios = [row["batches"][str(b)].get(key) for b in batches if str(b) in row.get("batches", {})]
    ratios = [r for r in ratios if r is not None]
    return max(ratios) if ratios else None


def versions() -> dict:
    out = {"python": platform.python_version()}
    for mod in ("tensorflow_cpu", "tensorflow", "onnxruntime", "tf2onnx", "keras", "numpy"):
        try:
            from importlib.metadata import version
            out[mod] = version(mod)
        except Exception:  # noqa: BLE001 - not installed
            out[mod] = None
    return out


def markdown(rows: list[dict], payload: dict) -> str:
    lines = [f"# First request after warmup vs steady state ({payload['cpus']} CPUs, {payload['machine']})", "",
             "Fresh Processor per row (own subprocess), no warmup file, every request encoded before it is created. "
             "Per batch size (1, then 8, then 64): the first request (at batch 1: the first thing after "
             "`create()` returns; at 8 and 64: right after the hot loop of the size before); "
             f"`hot`: the median of the next {payload['steady']}, sent back to back (caches warm from the "
             f"previous request); two controls, the median of {payload['cold']} more requests each: `idle`, each "
             f"sent after a {IDLE_SECONDS * 1e3:g} ms sleep (a serving thread at under 100 requests/s), and `cold`, "
             f"each sent right after writing {EVICT_BYTES >> 20} MiB (more than the last-level cache: a request "
             "after a pause in which other work ran). "
             "Ratios: first / hot, first / idle, first / cold. "
             f"Medians over {payload['repeat']} fresh processes per row. Target: first <= {TARGET:g}x steady. "
             "`default`: warmup at its own sizes (1, 2, 4, 8 for synthetic requests); `batch1`: "
             "`warmup_batch_sizes: [1]` (the old behaviour). Batch 64 is above the default warmed sizes. "
             "Times in ms.", "",
             "| model | backend | warmup | warmed sizes | b1 first / hot / idle / cold | b1 vs hot, idle, cold "
             "| b8 first / hot / idle / cold | b8 vs hot, idle, cold | b64 first / hot / idle / cold "
             "| b64 vs hot, idle, cold | <= 3x hot at 1, 8 | <= 3x idle at 1, 8, 64 | <= 3x cold at 1, 8, 64 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        head = f"| {r['model']} | {r['backend']} | {r['mode']} |"
        if "refused" in r or "error" in r:
            text = r.get("refused") or r.get("error")
            lines.append(head + f" {'refused' if 'refused' in r else 'error'}: {text[:160].replace('|', '/')} "
                         "| | | | | | | | | |")
            continue
        cells = [str(r["warmup"].get("batch_sizes")) + (" (skipped)" if r["warmup"].get("skipped") else "")]
        for b in BATCHES:
            c = r["batches"][str(b)]
            if "error" in c:
                cells += [c["error"][:60], ""]
            else:
                cells += [" / ".join(f"{c[k]:.2f}" for k in ("first_ms", "steady_ms", "idle_ms", "cold_ms")),
                          ", ".join(f"{c[k]:.1f}x" for k in ("ratio", "idle_ratio", "cold_ratio"))]
        for batches, key in MEASURES:
            ratio = worst(r, batches, key)
            cells.append("yes" if ratio is not None and ratio <= TARGET else "**no**")
        lines.append(head + " " + " | ".join(cells) + " |")
    lines += ["", "| backend | warmup | worst vs hot at 1, 8 (model) | worst vs idle at 1, 8, 64 (model) "
              "| worst vs cold at 1, 8, 64 (model) | rows <= 3x hot / idle / cold | worst first - hot at 1, 8 (ms) |",
              "|---|---|---|---|---|---|---|"]
    for h in payload["headline"]:
        worsts = " | ".join(f"{w['ratio']}x ({w['model']})" for w in h["worst"].values())
        meets = " / ".join(w["meet"] for w in h["worst"].values())
        lines.append(f"| {h['backend']} | {h['mode']} | {worsts} | {meets} | "
                     f"{h['worst_excess_ms_1_8']} ({h['worst_excess_at']}) |")
    lines += ["", "Excluding `rejecting` (its synthetic warmup is skipped by design, so its first request is cold):",
              ""]
    for h in payload["headline"]:
        lines.append(f"* {h['backend']} / {h['mode']}: " + ", ".join(
            f"worst vs {name} = {w['excl_rejecting']}x" for name, w in h["worst"].items()))
    lines += ["", f"Versions: {payload['versions']}; load average before/after "
              f"{payload['load_average_before_after']}; runtime {payload['runtime_s']} s. A single first request is noisy on a "
              "shared machine: medians over the repeats."]
    return "\n".join(lines)


# what the target is checked against: the hot loop at the warmed sizes, the controls at every size
MEASURES = (((1, 8), "ratio"), (BATCHES, "idle_ratio"), (BATCHES, "cold_ratio"))


def headline(rows: list[dict]) -> list[dict]:
    out = []
    for backend in BACKENDS:
        for mode in MODES:
            served = [r for r in rows if r["backend"] == backend and r["mode"] == mode and "batches" in r]
            if not served:
                continue

            def top(batches, key, pool):
                scored = [(worst(r, batches, key), r["model"]) for r in pool if worst(r, batches, key) is not None]
                return max(scored) if scored else (None, None)

            kept = [r for r in served if r["model"] != "rejecting"]
            summary = {}
            for (batches, key), name in zip(MEASURES, ("hot", "idle", "cold")):
                ratio, model = top(batches, key, served)
                meet = sum(1 for r in served if (worst(r, batches, key) or 1e9) <= TARGET)
                summary[name] = {"ratio": ratio, "model": model, "excl_rejecting": top(batches, key, kept)[0],
                                 "meet": f"{meet}/{len(served)}"}
            excess = [(r["batches"][str(b)].get("excess_ms"), r["model"], b) for r in served for b in (1, 8)
                      if str(b) in r["batches"] and r["batches"][str(b)].get("excess_ms") is not None]
            ex, exm, exb = max(excess) if excess else (None, None, None)
            out.append({"backend": backend, "mode": mode, "worst": summary,
                        "worst_excess_ms_1_8": ex, "worst_excess_at": f"{exm} b{exb}"})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--steady", type=int, default=50)
    parser.add_argument("--cold", type=int, default=30, help="requests per batch size for each control")
    parser.add_argument("--repeat", type=int, default=3, help="fresh processes per row (medians)")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        os.environ.setdefault("SP_ONNX_CACHE_DIR", str(CACHE_DIR))
        print(json.dumps(child(*args.child, args.steady, args.cold)), flush=True)
        return
    began = time.time()
    models = args.models.split(",")
    # build every model first (in a child: TF's eager/graph state stays out of this process)
    subprocess.run([sys.executable, "-c", "import sys; from benchmarks.bench_warmup import build; "
                    "[build(m) for m in sys.argv[1:]]", *models], check=True, cwd=ROOT,
                   env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    print(f"built {len(models)} models in {time.time() - began:.0f} s", flush=True)
    load_before = os.getloadavg()
    rows = []
    for name in models:
        for backend in BACKENDS:
            for mode in MODES:
                result = run_child(name, backend, mode, args.steady, args.cold)
                if "batches" in result and args.repeat > 1:
                    result = combine([result] + [run_child(name, backend, mode, args.steady, args.cold)
                                                 for _ in range(args.repeat - 1)])
                rows.append({"model": name, "backend": backend, "mode": mode, **result})
                brief = {b: [v.get(k) for k in ("ratio", "idle_ratio", "cold_ratio")]
                         for b, v in result.get("batches", {}).items()}
                print(json.dumps({"model": name, "backend": backend, "mode": mode,
                                  **({"ratios": brief} if brief else {k: str(result.get(k))[:160]
                                                                       for k in ("refused", "error") if k in result})}),
                      flush=True)
                if "refused" in result:
                    # the same refusal for the other mode: record it without a second conversion
                    for other in MODES:
                        if other != mode:
                            rows.append({"model": name, "backend": backend, "mode": other, **result})
                    break
    payload = {"cpus": os.cpu_count(), "machine": f"{platform.node()} {platform.machine()}",
               "steady": args.steady, "cold": args.cold, "repeat": args.repeat, "batches": list(BATCHES), "target_ratio": TARGET,
               "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
               "versions": versions(), "settings": "demo.paths.model_config: session_num 1, intra 1, inter 1; "
               "no warmup file; one subprocess per model/backend/mode",
               "runtime_s": round(time.time() - began, 1), "rows": rows}
    payload["headline"] = headline(rows)
    write_results("warmup", payload, markdown(rows, payload))


if __name__ == "__main__":
    main()
