"""``tensorflow_model_server``: TF Serving's command line over this server (issue 48).

Installed as a console script beside ``serving-processor`` (``pyproject.toml``); the image
variant's entry point (``docker/tfserving-entrypoint.sh``) runs it as TF Serving's image runs its
binary. TF Serving's flags (:mod:`server.tfserving.flags`: parsed as TF Serving parses them, the ones
we serve no equivalent of refused by name) and its model config file become a
:class:`~server.settings.DeploymentConfig`, served by the run path of ``python -m server``
(:mod:`server.launch`). What each flag becomes:

=============================================  ==================================================
``--port``                                     ``grpc_port`` (0: no TCP port, TF Serving's)
``--grpc_socket_path``                         ``grpc_socket_path`` (gRPC on a Unix socket too)
``--rest_api_port``                            ``http_port`` (0, the default: no HTTP server; the
                                               same as ``--port``: none, TF Serving's error logged)
``--rest_api_timeout_in_ms``                   ``http_request_timeout_ms`` (30000; <= 0: none)
``--rest_api_num_threads``                     each model's ``inference_threads`` (the threads
                                               that run its requests, REST and gRPC alike)
``--grpc_channel_arguments``                   ``grpc_channel_arguments`` (``k=v,k=v``; an integer
                                               value is passed as one, TF Serving's rule)
``--grpc_max_threads``                         ``grpc_max_concurrent_rpcs``
``--model_name``, ``--model_base_path``        one model (``base_path`` as in a config file)
``--model_config_file``                        the models: :mod:`server.tfserving.model_config`; the
                                               two flags above are then ignored (TF Serving's)
``--model_config_file_poll_wait_seconds``      the file is followed live (the live model set,
                                               :mod:`server.model_set`: models added, removed,
                                               reloaded; a malformed file leaves them serving)
``--file_system_poll_wait_seconds``            every model's ``file_system_poll_wait_seconds``
``--max_num_load_retries``,                    every model's ``max_num_load_retries``,
``--load_retry_interval_micros``               ``load_retry_interval_micros`` (negative: 0)
``--enable_batching``,                         every model's ``batching`` (TF Serving's defaults
``--batching_parameters_file``                 where the file is silent: 1000 rows, no timeout,
                                               10 batches queued, a thread per CPU);
                                               ``enable_large_batch_splitting`` with
                                               ``max_execution_batch_size``: the model's
                                               ``max_execution_batch_size``; ``thread_pool_name``
                                               names nothing here (each model has its threads)
``--tensorflow_intra_op_parallelism``,         every model's ``intra_op_parallelism_threads`` /
``--tensorflow_inter_op_parallelism``,         ``inter_op_parallelism_threads`` (0: ours, CPUs/2;
``--tensorflow_session_parallelism``           all three set: TF Serving's error)
``--monitoring_config_file``                   ``prometheus_path`` (``/metrics`` and TF Serving's
                                               ``/monitoring/prometheus/metrics`` always serve)
``--ssl_config_file``                          gRPC over TLS: ``tls_cert_file`` (the PEM written
                                               to a private directory, removed at exit),
                                               the key in an environment variable of this process
                                               (``tls_key_env``), ``custom_ca`` with
                                               ``client_verify``: ``tls_client_ca_file`` and
                                               ``tls_require_client_cert``; REST stays plaintext
``--allow_version_labels_for_unavailable_``     the deployment key of that name
``models``
``--enable_serialization_as_tensor_content``   every model's key of that name
``--enable_profiler``                          ``enable_profiler`` (true by default, TF Serving's:
                                               ``tensorflow.ProfilerService`` on the gRPC port,
                                               :mod:`server.tfserving.profiler`)
``--enable_model_warmup``,                     served at the values that are ours (true,
``--saved_model_tags``,                        ``serve``; the health service always serves; no
``--enable_grpc_healthcheck_service``,         file system cache is kept)
``--flush_filesystem_caches``
=============================================  ==================================================

TF Serving's other flags are accepted at the values that are ours (TF Lite off, ...) and
refused at any other by name, with the reason (:mod:`server.tfserving.flags`).

Both servers bind every interface (0.0.0.0), as TF Serving's do, once the models have loaded
(or failed to: TF Serving's order, so a client that reaches the port finds them). Ours beside
them, ``--sp_config_file``: a deployment JSON of our keys (admin token, limits, TLS, workers...);
its ``models``, by name, are merged over the models of the flags and the config file (their
``model_config`` keys over those, the entry's other keys replaced; a name not there is served
too). Precedence for the server's keys: an explicit flag, then that file, then the flags'
defaults. The model config file (and that file) are read again at every reload.

Exit status: that of the run path; 2 for a flag or config refused (the message on stderr).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..settings import DeploymentConfig
from processor.errors import ConfigError

from .. import launch
from .flags import Flags, parse, usage

PROG = "tensorflow_model_server"
SSL_KEY_ENV = "SP_TFS_SSL_SERVER_KEY"  # where --ssl_config_file's server_key is handed to the server
# TF Serving's batching defaults where a BatchingParameters is silent (BasicBatchScheduler's)
_BATCHING_DEFAULTS = {"max_batch_size": 1000, "batch_timeout_micros": 0, "max_enqueued_batches": 10}


@dataclass
class Translation:
    """What the flags make of a deployment, read once at start (files included): the server's
    keys (``explicit``: those set by a flag given), every model's ``model_config`` keys
    (``model``) and entry keys (``entry``), notes to print, steps to run at exit."""

    server: dict[str, Any] = field(default_factory=dict)
    explicit: set[str] = field(default_factory=set)
    model: dict[str, Any] = field(default_factory=dict)
    entry: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    cleanup: list[Callable[[], None]] = field(default_factory=list)

    def set(self, flags: Flags, key: str, value: Any, *names: str) -> None:
        """Server key ``key`` is ``value``, which the flags ``names`` gave."""
        self.server[key] = value
        if flags.given.intersection(names):
            self.explicit.add(key)


def main(argv: list[str] | None = None) -> int:
    """Run the server as ``tensorflow_model_server``; returns (bad flags or config) or ends the
    process with the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a in ("--help", "-help", "-h") for a in argv):
        print(usage(PROG))
        return 0
    launch.hold_sighup()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    tr = Translation()
    try:
        flags = parse(argv)
        if flags.version:
            print(version())
            return 0
        translate(flags, tr)
        deployment, data = compose(flags, tr)
    except ConfigError as exc:
        for step in tr.cleanup:
            step()
        print(f"{PROG}: Failed to start server. Error: {exc.message}", file=sys.stderr)
        return 2
    for note in tr.notes:
        print(f"{PROG}: {note}", file=sys.stderr)
    source = None
    if flags.model_config_file:
        source = launch.Source(flags.model_config_file, lambda: compose(flags, tr))
    return launch.run(deployment, data, prog=PROG, source=source, load_first=True, cleanup=tr.cleanup)


def version() -> str:
    """``--version``'s lines, TF Serving's form."""
    from importlib import metadata

    def of(*packages: str) -> str:
        for package in packages:
            try:
                return metadata.version(package)
            except metadata.PackageNotFoundError:
                continue
        return "not installed"
    return (f"TensorFlow ModelServer: serving-processor {of('serving-processor')} (tensorflow_model_server "
            f"drop-in)\nTensorFlow Library: {of('tensorflow-cpu', 'tensorflow')}")


# --- the flags, once -------------------------------------------------------------------------


def translate(flags: Flags, tr: Translation) -> Translation:
    """Fill ``tr`` from ``flags`` (see the module doc); ConfigError naming the flag."""
    if not flags.model_base_path and not flags.model_config_file:
        raise ConfigError("Both server_options.model_base_path and server_options.model_config_file are empty! "
                          "(--model_base_path or --model_config_file)")
    if flags.model_config_file and flags.given & {"model_name", "model_base_path"}:
        tr.notes.append("--model_config_file is set: --model_name and --model_base_path are ignored")
    _ports(flags, tr)
    tr.set(flags, "host", "0.0.0.0")
    timeout = flags.rest_api_timeout_in_ms
    tr.set(flags, "http_request_timeout_ms", timeout if timeout > 0 else None, "rest_api_timeout_in_ms")
    tr.set(flags, "model_config_file_poll_wait_seconds", flags.model_config_file_poll_wait_seconds,
           "model_config_file_poll_wait_seconds")
    tr.set(flags, "allow_version_labels_for_unavailable_models", flags.allow_version_labels_for_unavailable_models,
           "allow_version_labels_for_unavailable_models")
    tr.set(flags, "enable_profiler", flags.enable_profiler, "enable_profiler")
    if flags.grpc_channel_arguments:
        tr.set(flags, "grpc_channel_arguments", channel_arguments(flags.grpc_channel_arguments),
               "grpc_channel_arguments")
    if flags.grpc_max_threads > 0:
        tr.set(flags, "grpc_max_concurrent_rpcs", flags.grpc_max_threads, "grpc_max_threads")
    if flags.rest_api_num_threads > 0:
        tr.entry["inference_threads"] = flags.rest_api_num_threads
    _models(flags, tr)
    _batching(flags, tr)
    _monitoring(flags, tr)
    _ssl(flags, tr)
    return tr


def channel_arguments(text: str) -> dict[str, int | str]:
    """``--grpc_channel_arguments``: ``k=v,k=v``; a value that is an int32 is passed as an
    integer, else as a string (TF Serving's rule); later keys win."""
    out: dict[str, int | str] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--grpc_channel_arguments: {item!r} is not key=value")
        try:
            number = int(value)
        except ValueError:
            number = None
        out[key] = number if number is not None and -2**31 <= number < 2**31 else value
    return out


def _ports(flags: Flags, tr: Translation) -> None:
    grpc = flags.port or None
    if grpc is None and not flags.grpc_socket_path:
        raise ConfigError("At least one of server_options.grpc_port or server_options.grpc_socket_path must be "
                          "set. (--port=0 needs --grpc_socket_path)")
    http = flags.rest_api_port or None
    if http is not None and http == grpc:
        tr.notes.append("server_options.http_port cannot be same as grpc_port. Please use a different port for "
                        "HTTP/REST API. Skipped exporting HTTP/REST API.")
        http = None
    tr.set(flags, "grpc_port", grpc, "port")
    tr.set(flags, "http_port", http, "rest_api_port")
    if flags.grpc_socket_path:
        tr.set(flags, "grpc_socket_path", flags.grpc_socket_path, "grpc_socket_path")


def _models(flags: Flags, tr: Translation) -> None:
    """Every model's keys of the flags: load retries, version polling, threads, tensor_content."""
    tr.model["max_num_load_retries"] = max(0, flags.max_num_load_retries)
    tr.model["load_retry_interval_micros"] = max(0, flags.load_retry_interval_micros)
    tr.model["file_system_poll_wait_seconds"] = flags.file_system_poll_wait_seconds
    session, intra, inter = (flags.tensorflow_session_parallelism, flags.tensorflow_intra_op_parallelism,
                             flags.tensorflow_inter_op_parallelism)
    if intra > 0 and inter > 0 and session > 0:
        raise ConfigError("Either configure server_options.tensorflow_session_parallelism or "
                          "(server_options.tensorflow_intra_op_parallelism, "
                          "server_options.tensorflow_inter_op_parallelism) separately. You cannot configure all.")
    if intra <= 0 and inter <= 0:  # --tensorflow_session_parallelism sets both
        intra = inter = session
    for key, value in (("intra_op_parallelism_threads", intra), ("inter_op_parallelism_threads", inter)):
        if value > 0:
            tr.model[key] = value
    if flags.enable_serialization_as_tensor_content:
        tr.model["enable_serialization_as_tensor_content"] = True


def _batching(flags: Flags, tr: Translation) -> None:
    """``--enable_batching`` and its ``BatchingParameters`` as every model's ``batching``."""
    if not flags.enable_batching:
        if flags.batching_parameters_file:
            raise ConfigError("server_options.batching_parameters_file is set without setting "
                              "server_options.enable_batching to true.")
        return
    from pydantic import ValidationError

    from processor.batching.settings import BatchingConfig
    from processor.config_text import describe_validation_error

    from .text_protos import flag_message, read_file

    params = flag_message("BatchingParameters")
    if flags.batching_parameters_file:
        read_file(params, flags.batching_parameters_file, "--batching_parameters_file")
    batching: dict[str, Any] = {key: getattr(params, key).value if params.HasField(key) else default
                                for key, default in _BATCHING_DEFAULTS.items()}
    batching["num_batch_threads"] = (params.num_batch_threads.value if params.HasField("num_batch_threads")
                                     else min(256, os.cpu_count() or 1))
    batching["allowed_batch_sizes"] = list(params.allowed_batch_sizes)
    batching["pad_variable_length_inputs"] = params.pad_variable_length_inputs
    try:
        BatchingConfig(**batching)
    except ValidationError as exc:
        raise ConfigError(f"--batching_parameters_file: {describe_validation_error(exc)}") from None
    tr.model["batching"] = batching
    if params.enable_large_batch_splitting.value:
        tr.model["max_execution_batch_size"] = (params.max_execution_batch_size.value
                                                if params.HasField("max_execution_batch_size")
                                                else batching["max_batch_size"])


def _monitoring(flags: Flags, tr: Translation) -> None:
    """``--monitoring_config_file``'s Prometheus path (the usual paths serve anyway)."""
    if not flags.monitoring_config_file:
        return
    from .text_protos import flag_message, read_file

    config = read_file(flag_message("MonitoringConfig"), flags.monitoring_config_file, "--monitoring_config_file")
    prometheus = config.prometheus_config
    if not prometheus.enable:
        tr.notes.append("--monitoring_config_file: Prometheus is not enabled there; /metrics serves anyway "
                        "(the probes and the autoscaler read it)")
    elif prometheus.path and prometheus.path not in ("/metrics", "/monitoring/prometheus/metrics"):
        tr.set(flags, "prometheus_path", prometheus.path, "monitoring_config_file")


def _ssl(flags: Flags, tr: Translation) -> None:
    """``--ssl_config_file``: gRPC over TLS (see the module doc)."""
    if not flags.ssl_config_file:
        return
    from .text_protos import flag_message, read_file

    ssl = read_file(flag_message("SSLConfig"), flags.ssl_config_file, "--ssl_config_file")
    if not ssl.server_cert or not ssl.server_key:
        raise ConfigError("--ssl_config_file: server_cert and server_key are required")
    if ssl.client_verify and not ssl.custom_ca:
        raise ConfigError("--ssl_config_file: client_verify needs custom_ca here (the CA client certificates "
                          "are verified against)")
    directory = tempfile.mkdtemp(prefix="sp-tfs-ssl-")
    tr.cleanup.append(lambda: shutil.rmtree(directory, ignore_errors=True))
    cert = _private_file(directory, "server_cert.pem", ssl.server_cert)
    os.environ[SSL_KEY_ENV] = ssl.server_key
    for key, value in (("tls_cert_file", cert), ("tls_key_env", SSL_KEY_ENV), ("http_tls", False),
                       ("tls_reload_interval_seconds", 0)):
        tr.set(flags, key, value, "ssl_config_file")
    if ssl.client_verify:
        tr.set(flags, "tls_client_ca_file", _private_file(directory, "custom_ca.pem", ssl.custom_ca), "ssl_config_file")
        tr.set(flags, "tls_require_client_cert", True, "ssl_config_file")


def _private_file(directory: str, name: str, text: str) -> str:
    path = os.path.join(directory, name)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as file:
        file.write(text)
    return path


# --- the deployment, at start and at every reload ---------------------------------------------


def compose(flags: Flags, tr: Translation) -> tuple[DeploymentConfig, dict]:
    """The deployment now: the models of the config file (read again) or of the flags, with the
    flags' keys, ``--sp_config_file``'s over them (see the module doc); ConfigError."""
    from .model_config import model_entries, read_model_entries

    if flags.model_config_file:
        entries = read_model_entries(flags.model_config_file)
    else:
        entries = model_entries(_single_model(flags.model_name, flags.model_base_path))
    ours = _our_file(flags.sp_config_file) if flags.sp_config_file else {}
    by_name = {m["name"]: m for m in ours.pop("models", [])}
    models = []
    for entry in entries:
        entry = {**tr.entry, **entry, "model_config": {**tr.model, **entry["model_config"]}}
        models.append(_over(entry, by_name.pop(entry["name"], None)))
    models += by_name.values()
    if not models:
        raise ConfigError("the model config file serves no model (its model_config_list is empty); "
                          "at least one is needed")
    data = {k: v for k, v in tr.server.items() if k not in tr.explicit}
    data.update(ours)
    data.update({k: tr.server[k] for k in tr.explicit})
    data["models"] = models
    return DeploymentConfig.from_dict(data), data


def _single_model(name: str, base_path: str) -> Any:
    """TF Serving's ``BuildSingleModelConfig``: a ModelServerConfig of the one model."""
    from .model_config import new_config

    config = new_config()
    config.model_config_list.config.add(name=name, base_path=base_path, model_platform="tensorflow")
    return config


def _our_file(path: str) -> dict[str, Any]:
    """``--sp_config_file``: a deployment JSON object whose ``models`` (optional) name theirs."""
    from processor.config_text import expect_object, read_json_file

    data = read_json_file(path, "--sp_config_file")
    expect_object(data, "--sp_config_file")
    models = data.get("models", [])
    if not isinstance(models, list) or not all(isinstance(m, dict) and isinstance(m.get("name"), str)
                                               for m in models):
        raise ConfigError("--sp_config_file: models: a list of {\"name\", ...} objects")
    return data


def _over(entry: dict[str, Any], ours: dict[str, Any] | None) -> dict[str, Any]:
    """``entry`` with our entry of its name over it: its ``model_config`` keys over the entry's
    ``model_config``, its other keys replacing the entry's."""
    if ours is None:
        return entry
    out = {**entry, **{k: v for k, v in ours.items() if k != "model_config"}}
    config = ours.get("model_config", {})
    if isinstance(config, str):  # EAS files carry model_config as a JSON string
        from processor.config_text import parse_json

        config = parse_json(config, f"--sp_config_file: model {entry['name']}.model_config")
    if not isinstance(config, dict):
        raise ConfigError(f"--sp_config_file: model {entry['name']}.model_config: expected an object")
    out["model_config"] = {**entry["model_config"], **config}
    return out


if __name__ == "__main__":
    sys.exit(main())
