"""Our server against the peers a user would pick instead, over HTTP and gRPC, batch 1 and 256.

Servers, one at a time, each serving the same CTR model (the demo model's ``savedmodel/``, its own
variables):

* **ours (tensorflow)**: ``python -m server`` (session_num 2, the demo's model_config), measured on
  our protobuf endpoint ``POST /api/predict/{model}``, on TF Serving REST JSON, on our gRPC service,
  on TF Serving's gRPC ``Predict`` and on the Open Inference Protocol (KServe v2): REST JSON, REST
  with binary tensors (``Inference-Header-Content-Length``, binary outputs) and gRPC ``ModelInfer``;
* **ours (onnxruntime)**: the same server and model_config with ``backend: onnxruntime`` (the ONNX
  conversion our backend caches), on the three v2 APIs: the like-for-like row for Triton;
* **plain FastAPI**: ``benchmarks/plain_fastapi_server.py``, what a user writes by hand (TF
  Serving row JSON);
* **KServe**: KServe's Python model server (``kserve`` package) with a ``kserve.Model`` wrapping
  the SavedModel on TensorFlow (``benchmarks/kserve_server.py``), v1 REST JSON, v2 REST JSON and
  v2 gRPC ``ModelInfer``. It needs ``protobuf<7`` while this project needs ``>=7``, so it runs from
  its own virtual environment (``--kserve-python``; made with
  ``python -m benchmarks.bench_server --make-kserve-venv``);
* **Triton**: the ``tritonserver`` that ``nvidia-pytriton`` bundles (``benchmarks/triton_peer.py``,
  own venv ``--triton-python``, made with ``python -m benchmarks.bench_batching --make-triton-venv``),
  the same ONNX file on ONNX Runtime in its Python backend (instances = our session_num, our
  thread settings, no dynamic batcher: ours runs without batching here), v2 REST with binary
  tensors and gRPC ``ModelInfer``. It is sent the string feature already fingerprinted (the ONNX
  graph's uint64 input); ours receives the strings and fingerprints them itself.

The load generator is another process (``benchmarks.common.loadgen_command``): ``concurrency``
threads in a closed loop, each with its own keep-alive connection (HTTP) or channel (gRPC), sending pre-built request bytes
for ``--seconds`` after a warmup; it records every latency. Before a server is timed, the answer
to the exact request bytes of each of its rows is checked once against our in-process
``Processor.process()`` on the same runtime (logits and probability, allclose 1e-5). Writes
``benchmarks/results/server.json`` and ``.md`` (``--out-dir`` elsewhere).

    .venv/bin/python -m benchmarks.bench_server [--preset small] [--seconds 5] [--concurrency 4]
        [--skip-kserve] [--skip-triton] [--out-dir DIR]
    .venv/bin/python -m benchmarks.bench_server --tls   # bench_tls: ours plaintext vs TLS, server_tls.json/.md
    .venv/bin/python -m benchmarks.bench_server --edges # every edge under wrk / h2load: edges.json/.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks.peers import (MODEL, TRITON_PEER, check_same, free_port, peer_tool, peer_versions, post_json,
                              triton_python, triton_server, wait_http)
from benchmarks.server_payloads import add_load_arguments, check_probabilities, payloads, process_answers, run_loadgen
from benchmarks.server_report import report
from benchmarks.v2_wire import HEADER_LENGTH, MODEL_INFER, v2_grpc, v2_http

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
DEFAULT_KSERVE_VENV = ROOT / "artifacts" / "kserve-venv"
# API names shared by every server that speaks them (the like-for-like table matches on them)
V2_JSON, V2_BINARY, V2_GRPC = "v2 REST JSON", "v2 REST binary", "v2 ModelInfer"


# --- servers -------------------------------------------------------------------------------------

def v2_specs(host: str, port: int, grpc_target: str, body: dict) -> dict[str, dict]:
    """Load-generator specs of the three v2 rows (same request bytes on every server)."""
    path = f"/v2/models/{MODEL}/infer"
    return {
        V2_JSON: {"protocol": "HTTP", "kind": "http", "host": host, "port": port, "path": path,
                  "body_file": str(body["v2_json"]), "content_type": "application/json"},
        V2_BINARY: {"protocol": "HTTP", "kind": "http", "host": host, "port": port, "path": path,
                    "body_file": str(body["v2_binary"]), "content_type": "application/octet-stream",
                    "headers": {HEADER_LENGTH: str(body["v2_binary_header"])}},
        V2_GRPC: {"protocol": "gRPC", "kind": "grpc", "target": grpc_target, "method": MODEL_INFER,
                  "body_file": str(body["v2_grpc"])},
    }


# --- the run -------------------------------------------------------------------------------------

def bench(args) -> dict:
    from benchmarks.common import demo_paths
    from processor import codec
    from tools.server_process import ServerProcess

    load_before = list(os.getloadavg())  # other work on the machine makes the figures noisy
    paths = demo_paths(args.preset)
    savedmodel = str(paths.savedmodel_dir)
    work = Path(tempfile.mkdtemp(prefix="bench-server-"))
    bodies = {b: payloads(b, work) for b in args.batches}
    rows: list[dict] = []
    checks: dict[str, float] = {}  # "server runtime api batch N" -> max abs diff from process()
    notes: dict[str, str] = {}
    reference: dict[int, np.ndarray] = {}

    def measure(server: str, runtime: str, protocol: str, api: str, batch: int, spec: dict) -> None:
        spec = {"concurrency": args.concurrency, "seconds": args.seconds,
                "warmup_seconds": args.warmup, **spec}
        spec.pop("protocol", None)
        result = run_loadgen(spec, work)
        row = {"server": server, "runtime": runtime, "protocol": protocol, "api": api, "batch": batch, **result}
        rows.append(row)
        print(f"  {server:13s} {runtime:11s} {protocol:4s} {api:26s} batch {batch:3d}: {result['rps']:8.1f} req/s"
              f"  p50 {result['p50_ms']:.2f} ms  p99 {result['p99_ms']:.2f} ms  errors {result['errors']}",
              flush=True)

    def check(what: str, got: dict, want: dict) -> None:
        checks[what] = check_same(what, got, want)

    # our process() answers: the reference every row is checked against (per runtime)
    from demo.paths import demo_model_config

    config = demo_model_config(paths)
    config.pop("checkpoint_dir")  # the SavedModel's own variables, as the peers serve
    ort_config = {**config, "backend": "onnxruntime"}
    print("our process() answers (tensorflow, onnxruntime)", flush=True)
    expected = {"tensorflow": process_answers(config, bodies, "bench-ref-tf")[0]}
    onnx_dir = None
    try:
        expected["onnxruntime"], described = process_answers(ort_config, bodies, "bench-ref-ort")
        onnx_dir = described["cache"]
    except Exception as exc:  # no ONNX conversion here: no onnxruntime rows, no Triton
        notes["ours_onnxruntime"] = f"not run: {type(exc).__name__}: {exc}"
        print(f"ours onnxruntime: {notes['ours_onnxruntime']}", flush=True)

    # ours on TensorFlow
    deployment = {"models": [{"name": MODEL, "model_config": config}], "access_log": False,
                  "max_request_bytes": 64 << 20, "log_level": "WARNING"}
    print(f"ours: python -m server ({config['session_num']} sessions, tensorflow)", flush=True)
    ours = ServerProcess(deployment, work / "ours").start(timeout=300)
    try:
        host, port = "127.0.0.1", ours.http_port
        for batch in args.batches:
            body, want = bodies[batch], expected["tensorflow"][batch]
            with urllib.request.urlopen(urllib.request.Request(
                    f"{ours.http}/api/predict/{MODEL}", data=body["eas"].read_bytes()), timeout=60) as r:
                reference[batch] = codec.decode_response(r.read())["probability"].astype(np.float64)
            check_probabilities("ours protobuf /api/predict vs process()", reference[batch], want["probability"])
            got = post_json(f"{ours.http}/v1/models/{MODEL}:predict", body["tfs_json"].read_bytes())
            check_probabilities("ours TF Serving REST", [p["probability"] for p in got["predictions"]],
                                reference[batch])
            v2 = v2_specs(host, port, ours.grpc_target, body)
            check(f"ours tensorflow {V2_JSON} batch {batch}",
                  v2_http(f"{ours.http}/v2/models/{MODEL}/infer", body["v2_json"].read_bytes()), want)
            check(f"ours tensorflow {V2_BINARY} batch {batch}",
                  v2_http(f"{ours.http}/v2/models/{MODEL}/infer", body["v2_binary"].read_bytes(),
                          body["v2_binary_header"]), want)
            check(f"ours tensorflow {V2_GRPC} batch {batch}", v2_grpc(ours.grpc_target, body["v2_grpc"].read_bytes()),
                  want)
            http_spec = {"kind": "http", "host": host, "port": port}
            measure("ours", "tensorflow", "HTTP", "protobuf /api/predict", batch, {
                **http_spec, "path": f"/api/predict/{MODEL}", "body_file": str(body["eas"]),
                "content_type": "application/x-protobuf"})
            measure("ours", "tensorflow", "HTTP", "TF Serving REST JSON", batch, {
                **http_spec, "path": f"/v1/models/{MODEL}:predict", "body_file": str(body["tfs_json"]),
                "content_type": "application/json"})
            measure("ours", "tensorflow", "gRPC", "ProcessorService.Predict", batch, {
                "kind": "grpc", "target": ours.grpc_target, "body_file": str(body["eas"]),
                "method": "/tensorflow.eas.ProcessorService/Predict", "metadata": [["model-name", MODEL]]})
            measure("ours", "tensorflow", "gRPC", "TF Serving Predict", batch, {
                "kind": "grpc", "target": ours.grpc_target, "body_file": str(body["tfs_grpc"]),
                "method": "/tensorflow.serving.PredictionService/Predict"})
            for api, spec in v2.items():
                measure("ours", "tensorflow", spec["protocol"], api, batch, spec)
    finally:
        ours.stop()

    # ours on ONNX Runtime (the ONNX file Triton serves), v2 rows
    if "onnxruntime" in expected:
        deployment = {**deployment, "models": [{"name": MODEL, "model_config": ort_config}]}
        print(f"ours: python -m server ({config['session_num']} sessions, onnxruntime)", flush=True)
        ours = ServerProcess(deployment, work / "ours-ort").start(timeout=300)
        try:
            for batch in args.batches:
                body, want = bodies[batch], expected["onnxruntime"][batch]
                v2 = v2_specs("127.0.0.1", ours.http_port, ours.grpc_target, body)
                check(f"ours onnxruntime {V2_JSON} batch {batch}",
                      v2_http(f"{ours.http}/v2/models/{MODEL}/infer", body["v2_json"].read_bytes()), want)
                check(f"ours onnxruntime {V2_BINARY} batch {batch}",
                      v2_http(f"{ours.http}/v2/models/{MODEL}/infer", body["v2_binary"].read_bytes(),
                              body["v2_binary_header"]), want)
                check(f"ours onnxruntime {V2_GRPC} batch {batch}",
                      v2_grpc(ours.grpc_target, body["v2_grpc"].read_bytes()), want)
                for api, spec in v2.items():
                    measure("ours", "onnxruntime", spec["protocol"], api, batch, spec)
        finally:
            ours.stop()
        notes["ours_onnxruntime"] = f"ran: ONNX file {onnx_dir}/model.onnx"

    # plain FastAPI + TF
    port = free_port()
    print("plain FastAPI + TensorFlow", flush=True)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.Popen([sys.executable, str(HERE / "plain_fastapi_server.py"), "--savedmodel", savedmodel,
                             "--port", str(port)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=open(work / "plain.log", "wb"))
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc)
        for batch in args.batches:
            got = post_json(f"http://127.0.0.1:{port}/v1/models/{MODEL}:predict",
                            bodies[batch]["tfs_json"].read_bytes())
            check_probabilities("plain FastAPI", [p["probability"] for p in got["predictions"]], reference[batch])
            measure("plain FastAPI", "tensorflow", "HTTP", "row JSON", batch, {
                "kind": "http", "host": "127.0.0.1", "port": port, "path": f"/v1/models/{MODEL}:predict",
                "body_file": str(bodies[batch]["tfs_json"]), "content_type": "application/json"})
    finally:
        proc.terminate()
        proc.wait(30)

    # KServe
    kpy = Path(args.kserve_python) if args.kserve_python else DEFAULT_KSERVE_VENV / "bin" / "python"
    notes["kserve"] = run_peer("KServe", kpy, args.skip_kserve, "python -m benchmarks.bench_server --make-kserve-venv",
                               None, lambda: run_kserve(args, kpy, savedmodel, bodies, reference,
                                                        expected["tensorflow"], work, measure, check))
    # Triton

    tpy = triton_python(args)
    no_onnx = f"no ONNX conversion of the model ({notes.get('ours_onnxruntime')})" if onnx_dir is None else None
    notes["triton"] = run_peer("Triton", tpy, args.skip_triton,
                               ".venv/bin/python -m benchmarks.bench_batching --make-triton-venv", no_onnx,
                               lambda: run_triton(args, tpy, onnx_dir, config, bodies, expected["onnxruntime"],
                                                  work, measure, check))
    return {"rows": rows, "notes": notes, "kserve": notes["kserve"], "checks": checks, "preset": args.preset,
            "savedmodel": savedmodel, "ours_model_config": config, "load_before": load_before}


def run_peer(name: str, python: Path, skip: bool, make_it: str, unavailable: str | None,
             run: Callable[[], str]) -> str:
    """A peer server's run: its note (what ran, or why it did not), printed when it did not run."""
    if skip:
        note = f"skipped (--skip-{name.lower()})"
    elif not python.exists():
        note = f"not run: no {name} environment at {python} (make it with {make_it})"
    elif unavailable is not None:
        note = f"not run: {unavailable}"
    else:
        try:
            return run()
        except Exception as exc:
            note = f"not run: {type(exc).__name__}: {exc}"
    print(f"{name}: {note}", flush=True)
    return note


def run_kserve(args, kpy: Path, savedmodel: str, bodies, reference, expected, work: Path, measure, check) -> str:
    http_port, grpc_port = free_port(), free_port()
    print("KServe ModelServer", flush=True)
    for batch in args.batches:  # v2 gRPC request bytes, built with KServe's own protos
        subprocess.run([str(kpy), str(HERE / "kserve_server.py"), "--make-grpc-request",
                        str(bodies[batch]["npz"]), str(work / f"kserve_v2-{batch}.bin"), "--model", MODEL],
                       check=True, cwd=work, env=_kserve_env())
    proc = subprocess.Popen([str(kpy), str(HERE / "kserve_server.py"), "--savedmodel", savedmodel,
                             "--model", MODEL, "--http_port", str(http_port), "--grpc_port", str(grpc_port)],
                            cwd=work, env=_kserve_env(), stdout=open(work / "kserve.log", "wb"),
                            stderr=subprocess.STDOUT)
    try:
        wait_http(f"http://127.0.0.1:{http_port}/v1/models/{MODEL}", proc)
        for batch in args.batches:
            body, want = bodies[batch], expected[batch]
            got = post_json(f"http://127.0.0.1:{http_port}/v1/models/{MODEL}:predict",
                            body["kserve_v1"].read_bytes())
            check_probabilities("KServe v1", [p["probability"] for p in got["predictions"]], reference[batch])
            grpc_body = work / f"kserve_v2-{batch}.bin"
            check(f"KServe tensorflow {V2_JSON} batch {batch}",
                  v2_http(f"http://127.0.0.1:{http_port}/v2/models/{MODEL}/infer", body["v2_json"].read_bytes()),
                  want)
            check(f"KServe tensorflow {V2_GRPC} batch {batch}",
                  v2_grpc(f"127.0.0.1:{grpc_port}", grpc_body.read_bytes()), want)
            measure("KServe", "tensorflow", "HTTP", "v1 REST JSON", batch, {
                "kind": "http", "host": "127.0.0.1", "port": http_port, "path": f"/v1/models/{MODEL}:predict",
                "body_file": str(body["kserve_v1"]), "content_type": "application/json"})
            measure("KServe", "tensorflow", "HTTP", V2_JSON, batch,
                    v2_specs("127.0.0.1", http_port, "", body)[V2_JSON])
            measure("KServe", "tensorflow", "gRPC", V2_GRPC, batch, {
                "kind": "grpc", "target": f"127.0.0.1:{grpc_port}", "body_file": str(grpc_body),
                "method": MODEL_INFER})
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    version = subprocess.run([str(kpy), "-c", "import kserve, importlib.metadata as m; print(m.version('kserve'))"],
                             capture_output=True, text=True).stdout.strip()
    return f"kserve {version}"


def _kserve_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # not this project's packages
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


def run_triton(args, tpy: Path, onnx_dir: str, config: dict, bodies, expected, work: Path, measure, check) -> str:
    """Triton rows: v2 REST binary and gRPC ModelInfer, the ONNX file on ONNX Runtime in PyTriton's
    Python backend, as many instances as our sessions, our thread settings, no dynamic batcher."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LD_LIBRARY_PATH")}
    peer = str(TRITON_PEER)
    for batch in args.batches:  # request bytes built with tritonclient (binary inputs and outputs)
        peer_tool([str(tpy), peer, "requests", "--model-dir", onnx_dir, "--feeds", str(bodies[batch]["peer_npz"]),
                    "--out-dir", str(work / f"triton-{batch}")], env, work)
    print(f"Triton (pytriton, {config['session_num']} ONNX Runtime instances, no dynamic batcher)", flush=True)
    serve_args = ["--model-dir", onnx_dir, "--batching", "off", "--max-batch-size", str(max(args.batches)),
                  "--instances", str(config["session_num"]),
                  "--intra", str(config["intra_op_parallelism_threads"]),
                  "--inter", str(config["inter_op_parallelism_threads"])]
    with triton_server(tpy, work, env, "triton.log", serve_args) as (http_port, grpc_port):
        for batch in args.batches:
            want, files = expected[batch], work / f"triton-{batch}"
            header = json.loads((files / "http.json").read_text())["header_length"]
            http_spec = {"kind": "http", "host": "127.0.0.1", "port": http_port,
                         "path": f"/v2/models/{MODEL}/infer", "content_type": "application/octet-stream",
                         "headers": {HEADER_LENGTH: str(header)}, "body_file": str(files / "http.bin")}
            grpc_spec = {"kind": "grpc", "target": f"127.0.0.1:{grpc_port}", "method": MODEL_INFER,
                         "body_file": str(files / "grpc.bin")}
            check(f"Triton onnxruntime {V2_BINARY} batch {batch}",
                  v2_http(f"http://127.0.0.1:{http_port}/v2/models/{MODEL}/infer", (files / "http.bin").read_bytes(),
                          header), want)
            check(f"Triton onnxruntime {V2_GRPC} batch {batch}",
                  v2_grpc(grpc_spec["target"], (files / "grpc.bin").read_bytes()), want)
            measure("Triton", "onnxruntime", "HTTP", V2_BINARY, batch, http_spec)
            measure("Triton", "onnxruntime", "gRPC", V2_GRPC, batch, grpc_spec)
    return peer_versions(tpy, env)


def make_kserve_venv(path: Path) -> None:
    """A separate environment for KServe (its protobuf<7 pin conflicts with ours)."""
    from benchmarks.common import make_peer_venv

    make_peer_venv(path, ["kserve>=0.15,<1", "tensorflow-cpu>=2.18,<2.22"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_load_arguments(parser)
    parser.add_argument("--kserve-python", help=f"python of a venv with kserve + tensorflow-cpu "
                        f"(default {DEFAULT_KSERVE_VENV}/bin/python)")
    parser.add_argument("--skip-kserve", action="store_true")
    parser.add_argument("--make-kserve-venv", action="store_true", help="create the KServe venv and exit")
    parser.add_argument("--triton-python", help="python of the Triton venv (default artifacts/triton-venv/bin/python; "
                        "make it with python -m benchmarks.bench_batching --make-triton-venv)")
    parser.add_argument("--skip-triton", action="store_true")
    parser.add_argument("--out-dir", type=Path, help="write server.json/.md here instead of benchmarks/results")
    parser.add_argument("--tls", action="store_true", help="only ours, plaintext vs TLS (server_tls.json/.md): runs "
                        "benchmarks.bench_tls")
    parser.add_argument("--workers", help="only ours, worker processes: req/s with these counts (e.g. 1,2) and "
                        "memory with 1, 2, 4: runs benchmarks.bench_workers, which takes the other arguments")
    parser.add_argument("--edges", action="store_true", help="only ours, every edge under wrk / h2load beside the "
                        "bare uvicorn and grpcio floors and process(): runs benchmarks.bench_edges (--rounds ...)")
    args, rest = parser.parse_known_args()
    out = ["--out-dir", str(args.out_dir)] if args.out_dir else []
    if args.workers:
        from benchmarks import bench_workers

        return bench_workers.main(["--load-workers", args.workers, *out, *rest])
    if args.edges:
        from benchmarks import bench_edges

        return bench_edges.main(["--seconds", str(args.seconds), *out, *rest])
    if args.tls:
        from benchmarks import bench_tls

        return bench_tls.main(["--preset", args.preset, "--seconds", str(args.seconds), "--warmup", str(args.warmup),
                               "--concurrency", str(args.concurrency),
                               "--batches", ",".join(map(str, args.batches)), *out, *rest])
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.make_kserve_venv:
        make_kserve_venv(DEFAULT_KSERVE_VENV)
        return 0
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from benchmarks.common import write_results


    payload, markdown = report(bench(args), args)
    write_results("server", payload, markdown, out_dir=args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
