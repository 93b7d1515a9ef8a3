"""``python -m server [--config deployment.json] [--http-port N] [--grpc-port N]``.

Also installed as the ``serving-processor`` console script. Without ``--config`` it serves the
demo CTR model (built on first use by ``demo.paths.ensure_demo_model()``) as model ``demo`` on
the default ports (HTTP 8080, gRPC 8500) of 127.0.0.1 (``--host 0.0.0.0`` to widen) and prints
the URLs and an example request.

Exit status: 0 after a clean shutdown, 1 when the drain timeout cut requests off, 2 for a bad
config or command line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys

from processor.errors import ConfigError

from .app import ServingApp, configure
from .logs import JsonFormatter
from .runtime import tune_gc

log = logging.getLogger("server")

DEMO_MODEL = "demo"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="serving-processor",
        description="Serve TensorFlow recommendation models over HTTP (our wire format and TF Serving "
                    "REST) and gRPC (ours and TF Serving's).")
    parser.add_argument("--config", help="deployment JSON ({\"models\": [{\"name\", \"model_config\"}], ...}); "
                        "omitted: serve the demo model")
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
    from processor.deployment import DeploymentConfig

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
    # SIGHUP re-reads the deployment file once the server handles it (server/model_set.py); until
    # then (imports, a worker's first loads) it must not end the process, its default action
    with contextlib.suppress(ValueError):  # not the main thread (a test calling main): no signals
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        deployment, data = load_deployment(args)
        if args.check:
            if deployment.tls_enabled:  # the files too: unreadable, key mismatch, expired
                from .tls import load_material

                load_material(deployment)
            print(json.dumps(deployment.redacted(), indent=2))
            return 0
        deployment.resolved_admin_token()  # a named variable that is unset fails here
    except ConfigError as exc:
        print(f"serving-processor: bad config: {exc.message}", file=sys.stderr)
        return 2
    configure(deployment)
    if deployment.admin_token is None and deployment.admin_token_env is None:
        if deployment.admin_allow_without_token:
            log.warning("admin endpoints open without a token to clients of this loopback host %s "
                        "(admin_allow_without_token)", deployment.host)
        else:
            log.info("admin endpoints disabled: no admin token configured (admin_token_env)")
    if deployment.workers > 1 and not args.worker_of:
        return _supervise(deployment, data, args.ports_file, args)
    if args.worker_of:  # the parameters of ONNX models go to the server's shared memory
        from processor import shared_segments

        shared_segments.enable(args.worker_of, args.shm_dir)
        _tag_log_lines()
    try:
        app = ServingApp(deployment, ports_file=args.ports_file, worker=bool(args.worker_of),
                         announce=log.debug if args.worker_of else None)  # the supervisor announces
    except ConfigError as exc:
        print(f"serving-processor: bad config: {exc.message}", file=sys.stderr)
        return 2
    if args.admin_journal:  # admin actions reach every worker
        from .admin_journal import AdminJournal

        app.runtime.admin_journal = AdminJournal(args.admin_journal, app.runtime)
    if args.config:  # the live model set: the file re-read when it changes (a worker's: on SIGHUP)
        from .model_set import ModelSet, read_deployment

        app.runtime.model_set = ModelSet(
            app.runtime, lambda: read_deployment(args.config, overrides(args))[0], args.config,
            0.0 if args.worker_of else deployment.model_config_file_poll_wait_seconds)
    app.runtime.on_model_ready.append(lambda name: tune_gc())
    if not args.config:
        def announce_demo(name: str) -> None:
            curl = example_request(app, name)
            if curl:
                app.announce(f"[server] model {name!r} ready; try:\n  {curl}")
        app.runtime.on_model_ready.append(announce_demo)
    return _run_and_exit(app.run)


def _tag_log_lines() -> None:
    """A worker's JSON log lines (the access log's included) say which worker wrote them. The
    formatter adds the pid, not a filter: a filter on the handler would send the access log's
    lines through ``logging`` one by one (server/access_log.py)."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler.formatter, JsonFormatter):
            handler.formatter.worker = os.getpid()


def _supervise(deployment, data: dict, ports_file: str | None, args: argparse.Namespace) -> int:
    """workers > 1: this process supervises the workers (server/supervisor.py)."""
    from .supervisor import Supervisor

    return _run_and_exit(Supervisor(deployment, data, ports_file, config_path=args.config,
                                    overrides=overrides(args)).run)


def _run_and_exit(run) -> int:
    """Run the server (``run()``: its exit status) and end the process with that status."""
    try:
        code = run()
    except OSError as exc:  # a port in use: exit without waiting for the threads already started
        log.error("cannot start: %s", exc)
        code = 2
    # Everything is closed. Skip the interpreter's teardown: TensorFlow's and gRPC's destructors
    # take seconds, and after a cut-off drain, worker threads may still be running requests.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
