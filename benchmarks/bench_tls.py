"""Our server (tensorflow) plaintext vs TLS on both ports: our protobuf over HTTP and TF Serving
Predict over gRPC, each TLS answer checked against ``process()`` first (certificates from
tools/dev_certs.py). The load generator keeps its connections open, so this is the cost of
encryption per request, the handshakes amortized. Writes ``benchmarks/results/server_tls.json``
and ``.md`` (``--out-dir`` elsewhere).

    .venv/bin/python -m benchmarks.bench_tls [--preset small] [--seconds 5] [--concurrency 4]
    .venv/bin/python -m benchmarks.bench_server --tls   # the same
"""

from __future__ import annotations

import argparse
import os
import ssl
import sys
import tempfile
import urllib.request
from pathlib import Path

from benchmarks.peers import MODEL
from benchmarks.server_payloads import add_load_arguments, check_probabilities, payloads, process_answers, run_loadgen


def bench_tls(args) -> tuple[dict, str]:
    """See the module doc: (the JSON payload, the markdown report)."""
    from benchmarks.common import demo_paths
    from demo.paths import demo_model_config
    from processor import codec
    from tools.server_process import ServerProcess
    from tools.dev_certs import write_set

    load_before = list(os.getloadavg())
    paths = demo_paths(args.preset)
    work = Path(tempfile.mkdtemp(prefix="bench-server-tls-"))
    bodies = {b: payloads(b, work) for b in args.batches}
    config = demo_model_config(paths)
    config.pop("checkpoint_dir")
    expected = process_answers(config, bodies, "bench-ref-tls")[0]
    certs = write_set(work / "certs")
    ca = str(certs["ca.crt"])
    rows = []
    for mode in ("plaintext", "TLS"):
        tls = ({"tls_cert_file": str(certs["server.crt"]), "tls_key_file": str(certs["server.key"])}
               if mode == "TLS" else {})
        deployment = {"models": [{"name": MODEL, "model_config": config}], "access_log": False,
                      "max_request_bytes": 64 << 20, "log_level": "WARNING", **tls}
        context = ssl.create_default_context(cafile=ca) if tls else None
        print(f"ours ({mode}): python -m server ({config['session_num']} sessions, tensorflow)", flush=True)
        ours = ServerProcess(deployment, work / mode, ssl_context=context).start(timeout=300)
        extra = {"ca_file": ca} if tls else {}
        try:
            for batch in args.batches:
                body = bodies[batch]
                with urllib.request.urlopen(urllib.request.Request(
                        f"{ours.http}/api/predict/{MODEL}", data=body["eas"].read_bytes()), timeout=60,
                        context=context) as r:
                    got = codec.decode_response(r.read())["probability"]
                check_probabilities(f"ours {mode} protobuf /api/predict vs process()", got,
                                    expected[batch]["probability"])
                for protocol, api, spec in (
                        ("HTTP", "protobuf /api/predict", {
                            "kind": "http", "host": "127.0.0.1", "port": ours.http_port,
                            "path": f"/api/predict/{MODEL}", "body_file": str(body["eas"]),
                            "content_type": "application/x-protobuf"}),
                        ("gRPC", "TF Serving Predict", {
                            "kind": "grpc", "target": ours.grpc_target, "body_file": str(body["tfs_grpc"]),
                            "method": "/tensorflow.serving.PredictionService/Predict"})):
                    spec = {"concurrency": args.concurrency, "seconds": args.seconds,
                            "warmup_seconds": args.warmup, **spec, **extra}
                    result = run_loadgen(spec, work)
                    rows.append({"transport": mode, "protocol": protocol, "api": api, "batch": batch, **result})
                    print(f"  {mode:9s} {protocol:4s} {api:22s} batch {batch:3d}: {result['rps']:8.1f} req/s  "
                          f"p50 {result['p50_ms']:.2f} ms  p99 {result['p99_ms']:.2f} ms  errors {result['errors']}",
                          flush=True)
        finally:
            ours.stop()
    lines = ["# Our server: plaintext vs TLS", "",
             f"Preset {args.preset}, {args.concurrency} client threads with kept-open connections, "
             f"{args.seconds:g} s per row; load average before: {', '.join(f'{x:.2f}' for x in load_before)} "
             f"(a shared machine makes these figures noisy).", "",
             "| API | batch | plaintext req/s | TLS req/s | TLS / plaintext | p50 ms plain / TLS | errors |",
             "|---|---:|---:|---:|---:|---|---:|"]
    for batch in args.batches:
        for api in ("protobuf /api/predict", "TF Serving Predict"):
            plain, tls_row = (next(r for r in rows if r["transport"] == t and r["api"] == api and r["batch"] == batch)
                              for t in ("plaintext", "TLS"))
            lines.append(f"| {plain['protocol']} {api} | {batch} | {plain['rps']:.1f} | {tls_row['rps']:.1f} | "
                         f"{tls_row['rps'] / plain['rps']:.2f} | {plain['p50_ms']:.2f} / {tls_row['p50_ms']:.2f} | "
                         f"{plain['errors'] + tls_row['errors']} |")
    payload = {"rows": rows, "preset": args.preset, "concurrency": args.concurrency, "seconds": args.seconds,
               "load_before": load_before, "cpu_count": os.cpu_count()}
    return payload, "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_load_arguments(parser)
    parser.add_argument("--out-dir", type=Path, help="write server_tls.json/.md here instead of benchmarks/results")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from benchmarks.common import write_results

    payload, markdown = bench_tls(args)
    write_results("server_tls", payload, markdown, out_dir=args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
