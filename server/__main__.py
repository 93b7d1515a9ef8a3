"""``python -m server [--config deployment.json] [--http-port N] [--grpc-port N]``.

Also installed as the ``serving-processor`` console script. Without ``--config`` it serves the
demo CTR model (built on first use by ``demo.paths.ensure_demo_model()``) as model ``demo`` on
the default ports (HTTP 8080, gRPC 8500) of 127.0.0.1 (``--host 0.0.0.0`` to widen) and prints
the URLs and an example request.

Exit status: 0 after a clean shutdown, 1 when the drain timeout cut requests off, 2 for a bad
config or command line. The run path after the command line is :mod:`server.launch`'s, shared
with ``tensorflow_model_server`` (:mod:`server.tfserving.cli`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from processor.errors import ConfigError

from . import launch
from .app import ServingApp

PROG = "serving-processor"
DEMO_MODEL = "demo"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Serve TensorFlow recommendation models over HTTP (our wire format and TF Serving "
                    "REST) and gRPC (ours and TF Serving's).")
    parser.add_argument("--config", help="deployment JSON ({\"models\": [{\"name\", \"model_config\"}], ...}), "
                        "or TF Serving's text-format ModelServerConfig; omitted: serve the demo model")
    parser.add_argument("--http-port", type=int, help="overrides http_port (0: a free port)")
    parser.add_argument("--grpc-port", type=int, help="overrides grpc_port (0: a free port)")
    parser.add_argument("--host", help="overrides host, the address both servers bind (default 127.0.0.1: "
                        "this machine only; 0.0.0.0 for every interface)")
    parser.add_argument("--ports-file", help="write the bound ports as JSON {\"http\", \"grpc\", \"pid\"}")
    parser.add_argument("--workers", type=int, help="overrides workers: server processes on the same ports "
                        "(default 1: this process serves)")
    parser.add_argument("--check", action="store_true", help="validate the config and exit")
    # a worker of a supervisor (server/supervisor.py passes these)
    parser.add_argument("--worker-of", help=argparse.SUPPRESS)
    parser.add_argument("--shm-dir", help=argparse.SUPPRESS)
    parser.add_argument("--admin-journal", help=argparse.SUPPRESS)
    return parser


def _demo_deployment() -> dict:
    try:
        from demo.paths import demo_model_config, ensure_demo_model
    except ImportError as exc:
        raise ConfigError(f"no --config given and the demo model is unavailable ({exc}); "
                          f"pass --config deployment.json") from None
    print("[server] preparing the demo model (built on first use) ...", flush=True)
    paths = ensure_demo_model()
    return {"models": [{"name": DEMO_MODEL, "model_config": demo_model_config(paths)}]}


def overrides(args: argparse.Namespace) -> dict:
    """The deployment keys the command line sets (None: the file's)."""
    return {"http_port": args.http_port, "grpc_port": args.grpc_port, "host": args.host, "workers": args.workers}


def load_deployment(args: argparse.Namespace):
    """(the validated deployment, the JSON it was validated from, overrides applied)."""
    from .settings import DeploymentConfig

    from .model_set import read_deployment

    if args.config:
        return read_deployment(args.config, overrides(args))  # ConfigError: unreadable, not JSON, invalid
    data = _demo_deployment()
    data.update({k: v for k, v in overrides(args).items() if v is not None})
    return DeploymentConfig.from_dict(data), data


def example_request(app: ServingApp, name: str) -> str | None:
    """A curl line for the TF Serving REST predict of ``name`` (built from its signature)."""
    if app.http_port is None:
        return None
    try:
        sig = app.runtime.dataplane.served(name).signature.describe()
    except Exception:
        return None
    row = {}
    for spec in sig["inputs"]:
        dims = [d if d and d > 0 else 1 for d in (spec["shape"] or [1])[1:]]
        value: object = "a" if spec["type"] == "DT_STRING" else 0
        for d in reversed(dims):
            value = [value] * d
        row[spec["name"]] = value
    host = "127.0.0.1" if app.deployment.host in ("0.0.0.0", "::") else app.deployment.host
    body = json.dumps({"instances": [row]}, separators=(",", ":"))
    return (f"curl -s -X POST http://{host}:{app.http_port}/v1/models/{name}:predict "
            f"-H 'Content-Type: application/json' -d '{body}'")


def main(argv: list[str] | None = None) -> int:
    """Run the server; returns (for bad configs) or ends the process with the exit status."""
    args = _parser().parse_args(argv)
    launch.hold_sighup()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        deployment, data = load_deployment(args)
        if args.check:
            if deployment.tls_enabled:  # the files too: unreadable, key mismatch, expired
                from .tls import load_material

                load_material(deployment)
            print(json.dumps(deployment.redacted(), indent=2))
            return 0
    except ConfigError as exc:
        return launch.bad_config(PROG, exc)
    source = None
    if args.config:  # the live model set follows the file
        from .model_set import read_deployment

        source = launch.Source(args.config, lambda: read_deployment(args.config, overrides(args)))
    worker = launch.Worker(args.worker_of, args.shm_dir, args.admin_journal) if args.worker_of else None
    on_ready = [] if args.config else [_announce_demo]
    return launch.run(deployment, data, prog=PROG, source=source, ports_file=args.ports_file, worker=worker,
                      on_ready=on_ready)


def _announce_demo(app: ServingApp, name: str) -> None:
    curl = example_request(app, name)
    if curl:
        app.announce(f"[server] model {name!r} ready; try:\n  {curl}")


if __name__ == "__main__":
    sys.exit(main())
