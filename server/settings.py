"""The server's settings: the deployment file's typed config (:class:`DeploymentConfig`), one
server process, many models (:class:`ModelEntry`), plus the server's own settings (ports, TLS,
workers, limits, the JSON decode budget, TF Serving's flags, tracing).

The EAS-style shape, validated once at start::

    {
      "models": [
        {"name": "ctr", "model_config": {...DeepRec model_config...}},
        {"name": "toy", "model_config": "{\\"savedmodel_dir\\": ...}",     # a JSON string works too
         "version_labels": {"stable": 1}, "inference_threads": 4},
        {"name": "ab", "model_config": {..., "model_version_policy": {"latest": {"num_versions": 2}}},
         "version_labels": {"stable": 1, "canary": 2}, "traffic": {"stable": 95, "canary": 5},
         "shadow": {"label": "canary", "fraction": 0.1}}
      ],
      "http_port": 8080, "grpc_port": 8500, "host": "0.0.0.0",
      "max_request_bytes": 67108864, "admin_token_env": "SP_ADMIN_TOKEN",
      "drain_timeout_seconds": 30
    }

Every problem is a :class:`~processor.errors.ConfigError` whose message starts with the key path
(``models[1] 'toy'.model_config.session_num: ...``); an unknown key is an error with the closest
known key suggested. Each ``model_config`` is validated by :class:`~processor.config.ModelConfig`,
so its rules live in one place. Objects are immutable and safe to share between threads.

This module is transport-neutral: it never imports fastapi or grpc. The processor (the core)
never imports it: a model is composed from an entry's name, config, routing and threads
(:func:`processor.served_model.compose_entry`, which takes any object that has them).
"""

from __future__ import annotations

import os
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from processor.config import ModelConfig, shorten
from processor.config_text import (describe_validation_error, expect_object, parse_json, read_json_file,
                                   unknown_key_message)
from processor.errors import ConfigError
from processor.routing import LABEL_PATTERN, RoutingSettings, ShadowSettings

from .otel_settings import TracingSettings

MODEL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$"
DEFAULT_HTTP_PORT = 8080
DEFAULT_GRPC_PORT = 8500
DEFAULT_MAX_REQUEST_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_HEADER_BYTES = 16 * 1024  # issue 16 server limits
# HTTP paths the server routes itself (prometheus_path may not be under them)
_ROUTED_PREFIXES = ("/v1/", "/v2/", "/api/", "/admin/", "/docs", "/openapi.json")


class ModelEntry(BaseModel):
    """One served model: a URL-safe name, its ``model_config`` and serving options."""

    # strict types, as in ModelConfig: "2" or true is not a number (a nested model needs strict=False)
    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=(), strict=True,
                              allow_inf_nan=False)

    name: str = Field(pattern=MODEL_NAME_PATTERN)
    config: ModelConfig = Field(alias="model_config")
    # the model_config as given (DeepRec/EAS keys accepted and unused are reported from it)
    raw_config: dict[str, Any] = Field(default_factory=dict, exclude=True)
    # TF Serving version labels -> version number ("stable": 12)
    version_labels: dict[str, int] = Field(default_factory=dict)
    # calls naming no version split by a routing key's hash: arm (label or version number) ->
    # weight; {}: the newest version answers them (processor/routing.py)
    traffic: dict[str, float] = Field(default_factory=dict)
    # a copy of a share of those calls run on another version, off the response path
    shadow: ShadowSettings | None = Field(None, strict=False)
    # worker threads that run this model's requests; default: two per session, and with batching
    # enough to fill a batch (a request waiting for its batch holds a thread)
    inference_threads: int | None = Field(None, ge=1, le=1024)
    # requests that may wait for those threads, from every edge together; one more is refused
    # at once with 503 / UNAVAILABLE (server/model_pool.py); None: no bound
    max_queued_requests: int | None = Field(None, ge=0, le=1_000_000)

    @model_validator(mode="after")
    def _routing(self) -> ModelEntry:
        RoutingSettings(version_labels=self.version_labels, traffic=self.traffic, shadow=self.shadow)
        return self

    @property
    def routing(self) -> RoutingSettings:
        """Labels, traffic and shadow as the model's router takes them."""
        return RoutingSettings(version_labels=self.version_labels, traffic=self.traffic, shadow=self.shadow)

    @property
    def lanes(self) -> int:
        return self.config.session_num * max(1, len(self.config.gpu_ids_list))

    @property
    def threads(self) -> int:
        if self.inference_threads:
            return self.inference_threads
        batching = self.config.batching
        fill = min(256, batching.max_batch_size) if batching is not None else 0
        return max(2, 2 * self.lanes, fill)


class DeploymentConfig(BaseModel):
    """The whole deployment. See the module doc for the shape."""

    # strict types, as in ModelConfig: "2" or true is not a number (a nested model needs strict=False)
    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=(), strict=True,
                              allow_inf_nan=False)

    models: tuple[ModelEntry, ...] = Field(min_length=1)
    host: str = Field("127.0.0.1", min_length=1)  # loopback by default; "0.0.0.0" (or --host) to widen
    # None disables a transport; 0 picks a free port (reported at start)
    http_port: int | None = Field(DEFAULT_HTTP_PORT, ge=0, le=65535)
    grpc_port: int | None = Field(DEFAULT_GRPC_PORT, ge=0, le=65535)
    # what serves the gRPC port: "native" (gRPC's C++ library: the Predicts on batching models
    # without Python, the rest bridged to the same handlers; needs server/grpc/_native_grpc, built
    # with libgrpc++-dev; server/grpc/native_server.py), "python" (grpcio's grpc.aio server), or
    # "auto": native where it is built, else python
    grpc_server: Literal["auto", "python", "native"] = "auto"
    # largest request body (HTTP) / message (gRPC) accepted: 413 / RESOURCE_EXHAUSTED above it
    max_request_bytes: int = Field(DEFAULT_MAX_REQUEST_BYTES, ge=1024, le=2**31 - 1)
    # admin endpoints need this token when one is set; prefer admin_token_env (the name of an
    # environment variable holding it) to keep secrets out of files
    admin_token: str | None = Field(None, min_length=8)
    admin_token_env: str | None = Field(None, min_length=1)
    # the deployment file is re-read this often and its models applied live (server/model_set.py;
    # also on SIGHUP); 0: only on SIGHUP. TF Serving's --model_config_file_poll_wait_seconds
    model_config_file_poll_wait_seconds: float = Field(0.0, ge=0, le=86400)
    # the fit check before every load (processor/memory_budget.py): a load whose estimate
    # plus the process's resident memory exceeds this is refused. None: 0.9 of the cgroup's
    # memory.max, else of the machine's memory; a number in (0, 1]: that share of it; a larger
    # one: bytes; 0: no check
    memory_limit: float | int | None = Field(None, ge=0)
    # SIGTERM: refuse new requests, wait this long for in-flight ones, then exit
    drain_timeout_seconds: float = Field(30.0, ge=0, le=3600)
    # server processes on the same ports (SO_REUSEPORT), watched by one supervisor (issue 24,
    # server/supervisor.py); 1: today's single process
    workers: int = Field(1, ge=1, le=256)
    # Linux's scheduling policy of the server's threads (and its workers'), server/cpu_policy.py:
    # "other" the normal one everywhere; "io_batch" SCHED_BATCH for the native gRPC server's own
    # threads (a network read that wakes one does not preempt a batch running), the rest normal;
    # "batch" SCHED_BATCH for every thread
    cpu_scheduling: Literal["other", "io_batch", "batch"] = "io_batch"
    # one access-log line per successful request (failed ones are always logged), written off the
    # request's thread; access_log_sample_rate: the share of successful requests logged
    access_log: bool = True
    access_log_sample_rate: float = Field(1.0, ge=0, le=1)
    # requests up to this many bytes that the engine serves natively without the GIL (the ONNX
    # Runtime native engine, no batching, tracing or prediction logging) run on the edge's own
    # thread, not the model's pool: the hop costs more than such a request; 0: always the pool
    inline_max_request_bytes: int = Field(8192, ge=0, le=1 << 20)
    # OpenTelemetry traces of requests, loads and deltas, exported over OTLP (issue 46,
    # server/otel.py); absent: off. Not the timelines (a model_config's timeline_* keys)
    tracing: TracingSettings | None = Field(None, strict=False)
    log_format: Literal["json", "text"] = "json"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    enable_docs: bool = True

    # --- server limits and admin exposure (issue 16; enforced in server/http/protocol.py and
    # server/grpc/server.py; README "Server limits") -------------------------------------------
    # no token configured: the admin endpoints answer 403, unless this is true AND host is loopback
    admin_allow_without_token: bool = False
    # request line + headers (HTTP) / request metadata (gRPC), bytes; 431 above it
    max_header_bytes: int = Field(DEFAULT_MAX_HEADER_BYTES, ge=1024, le=1024 * 1024)
    # header fields per HTTP request; 431 above it
    max_header_count: int = Field(100, ge=1, le=10_000)
    # a request's headers must arrive within this many seconds of its first byte, its body
    # within this many seconds of the headers; 408 (and the connection closed) otherwise
    header_read_timeout_seconds: float = Field(10.0, gt=0, le=3600)
    body_read_timeout_seconds: float = Field(60.0, gt=0, le=3600)
    # an idle HTTP connection (no request in progress) is closed after this many seconds
    keep_alive_timeout_seconds: float = Field(30.0, gt=0, le=3600)
    # open connections, HTTP and gRPC each; HTTP answers 503 (and closes) beyond it, gRPC refuses
    max_connections: int = Field(1000, ge=1, le=1_000_000)
    # gRPC: streams per HTTP/2 connection; RPCs in progress or queued (RESOURCE_EXHAUSTED above)
    grpc_max_concurrent_streams: int = Field(256, ge=1, le=100_000)
    grpc_max_concurrent_rpcs: int = Field(1000, ge=1, le=1_000_000)

    @model_validator(mode="after")
    def _admin_exposure(self) -> DeploymentConfig:
        if self.admin_allow_without_token and not is_loopback(self.host):
            raise ValueError(f"admin_allow_without_token: only allowed when the server binds a loopback "
                             f"address (host is {self.host!r}); configure admin_token_env instead")
        return self
    # --- end of server limits and admin exposure ---------------------------------------------

    # --- TF Serving REST JSON decoding (issue 16; enforced in server/tfserving/rest_json.py and
    # server/http/ body.py, json_stream.py, memory_budget.py; README "JSON request limits") -----
    # largest TF Serving JSON body, bytes (413 above it); null: max_request_bytes
    json_max_request_bytes: int | None = Field(None, ge=1024, le=2**31 - 1)
    # tensor elements (numbers, strings) per JSON request, all inputs together; 413 above it
    json_max_elements: int = Field(1 << 25, ge=1, le=2**40)
    # memory for decoding JSON requests at once, bytes: each holds 2x its body plus its decoded
    # arrays while it runs; one that does not fit now gets 503 + Retry-After, one that never fits
    # 413; a body over 256 KiB is parsed whole (faster) only while this holds 24x it, else a run
    # at a time (server/http/json_stream.py parse_whole); 0: no budget (such bodies always stream)
    json_decode_memory_bytes: int = Field(1 << 30, ge=0, le=2**50)
    # --- end of TF Serving REST JSON decoding --------------------------------------------------

    # --- TF Serving's server flags (issue 48: what ``tensorflow_model_server``'s flags become,
    # server/tfserving/cli.py; usable from any deployment file) -----------------------------------------
    # gRPC also listens on this Unix domain socket (--grpc_socket_path), plaintext unless the
    # gRPC port speaks TLS (then with the same credentials); one listener, so not with workers > 1
    grpc_socket_path: str | None = Field(None, min_length=1, max_length=100)
    # channel arguments of the gRPC server (--grpc_channel_arguments), set over ours (a key given
    # here replaces ours): "grpc.max_connection_age_ms": 2000, "grpc.lb_policy_name": "grpclb"
    grpc_channel_arguments: dict[str, int | str] = Field(default_factory=dict)
    # the deadline of an HTTP request that sets no X-Request-Timeout-Ms header, milliseconds
    # from its arrival (--rest_api_timeout_in_ms); null: none
    http_request_timeout_ms: int | None = Field(None, ge=1, le=86_400_000)
    # Prometheus is also served at this HTTP path (a MonitoringConfig's prometheus_config.path)
    prometheus_path: str | None = Field(None, pattern=r"^/[A-Za-z0-9_.\-/]{1,200}$")
    # false: a version label may only name a version that serves; a label naming another is not
    # applied (refused on a reload, dropped from a model that loads) and the error logged
    # (--allow_version_labels_for_unavailable_models; true, ours: such a label waits for it)
    allow_version_labels_for_unavailable_models: bool = True
    # tensorflow.ProfilerService on the gRPC port, for the TensorFlow models (--enable_profiler,
    # server/tfserving/profiler.py). False here (TF Serving's flag: true): TensorFlow's profiler server
    # behind it listens on every interface, plaintext, whatever host and TLS say
    enable_profiler: bool = False

    @model_validator(mode="after")
    def _tfs_flags(self) -> DeploymentConfig:
        if self.grpc_socket_path is not None and self.workers > 1:
            raise ValueError("grpc_socket_path: a Unix socket has one listener; not with workers > 1")
        for key in self.grpc_channel_arguments:
            if not re.match(r"^[a-z][a-z0-9_.]{0,127}$", key):
                raise ValueError(f"grpc_channel_arguments: {shorten(key, 80)} is not a gRPC channel argument "
                                 f"name (like grpc.max_connection_age_ms)")
        if self.prometheus_path is not None and self.prometheus_path.startswith(_ROUTED_PREFIXES):
            raise ValueError(f"prometheus_path: {self.prometheus_path} is under a path the server routes "
                             f"({', '.join(_ROUTED_PREFIXES)})")
        return self
    # --- end of TF Serving's server flags --------------------------------------------------------

    # --- TLS (issue 31; loaded and checked by server/tls.py, README "TLS") ----------------------
    # PEM certificate chain (leaf first) and its private key (a file, or the name of an
    # environment variable holding the PEM); with them the http_port and grpc_port speak TLS
    tls_cert_file: str | None = Field(None, min_length=1)
    tls_key_file: str | None = Field(None, min_length=1)
    tls_key_env: str | None = Field(None, min_length=1)
    # PEM CA bundle client certificates are verified against; with tls_require_client_cert a
    # client without a valid one is refused in the handshake (mutual TLS)
    tls_client_ca_file: str | None = Field(None, min_length=1)
    tls_require_client_cert: bool = False
    tls_min_version: Literal["1.2", "1.3"] = "1.2"
    # the files are re-read when they change on disk (new handshakes get the new certificate,
    # open connections stay); 0: never
    tls_reload_interval_seconds: float = Field(10.0, ge=0, le=86400)
    # per server: false keeps that server on plaintext while the other speaks TLS
    http_tls: bool = True
    grpc_tls: bool = True
    # extra plaintext listeners next to the TLS ones (a migration path), and a plaintext port
    # serving only the probes and /metrics (the kubelet, Prometheus); null: none, 0: a free port
    http_plaintext_port: int | None = Field(None, ge=0, le=65535)
    grpc_plaintext_port: int | None = Field(None, ge=0, le=65535)
    health_port: int | None = Field(None, ge=0, le=65535)
    # admin endpoints also accept an HTTPS client whose certificate verifies against
    # tls_client_ca_file (its subject CN or a DNS/URI SAN in admin_client_cert_names; empty: any)
    admin_client_cert: bool = False
    admin_client_cert_names: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _tls(self) -> DeploymentConfig:
        if self.tls_key_file and self.tls_key_env:
            raise ValueError("tls_key_file: give tls_key_file or tls_key_env, not both")
        has_key = bool(self.tls_key_file or self.tls_key_env)
        if bool(self.tls_cert_file) != has_key:
            missing = "tls_key_file" if self.tls_cert_file else "tls_cert_file"
            raise ValueError(f"{missing}: TLS needs both tls_cert_file and tls_key_file (or tls_key_env)")
        tls = self.tls_enabled
        for key in ("tls_client_ca_file", "http_plaintext_port", "grpc_plaintext_port"):
            if getattr(self, key) is not None and not tls:
                raise ValueError(f"{key}: set only with TLS (tls_cert_file and tls_key_file)")
        if self.tls_require_client_cert and not self.tls_client_ca_file:
            raise ValueError("tls_require_client_cert: needs tls_client_ca_file (the CA that signs "
                             "client certificates)")
        if self.http_plaintext_port is not None and not self.http_tls_on:
            raise ValueError("http_plaintext_port: the HTTP server is not on TLS (http_port null or "
                             "http_tls false); http_port is plaintext already")
        if self.grpc_plaintext_port is not None and not self.grpc_tls_on:
            raise ValueError("grpc_plaintext_port: the gRPC server is not on TLS (grpc_port null or "
                             "grpc_tls false); grpc_port is plaintext already")
        if self.tls_min_version == "1.3" and self.grpc_tls_on:
            raise ValueError("tls_min_version: 1.3 is enforced on HTTPS only; grpcio has no setting "
                             "for it (gRPC negotiates 1.2 or 1.3); set grpc_tls false or use 1.2")
        if self.admin_client_cert_names and not self.admin_client_cert:
            raise ValueError("admin_client_cert_names: set admin_client_cert true to use it")
        if self.admin_client_cert and not (self.http_tls_on and self.tls_client_ca_file):
            raise ValueError("admin_client_cert: needs HTTPS with client certificates (tls_cert_file, "
                             "tls_key_file, tls_client_ca_file, http_tls)")
        ports = [(k, getattr(self, k)) for k in ("http_port", "grpc_port", "http_plaintext_port",
                                                  "grpc_plaintext_port", "health_port")]
        used: dict[int, str] = {}
        for key, port in ports:
            if port:  # 0 picks a free port each
                if port in used:
                    raise ValueError(f"{key}: port {port} is also {used[port]}")
                used[port] = key
        return self

    @property
    def tls_enabled(self) -> bool:
        return self.tls_cert_file is not None

    @property
    def http_tls_on(self) -> bool:
        """The http_port speaks TLS."""
        return self.tls_enabled and self.http_tls and self.http_port is not None

    @property
    def grpc_tls_on(self) -> bool:
        """The grpc_port speaks TLS."""
        return self.tls_enabled and self.grpc_tls and self.grpc_port is not None
    # --- end of TLS ------------------------------------------------------------------------------

    @model_validator(mode="after")
    def _checks(self) -> DeploymentConfig:
        seen: set[str] = set()
        for i, entry in enumerate(self.models):
            if entry.name in seen:
                raise ValueError(f"models[{i}].name: model name {shorten(entry.name)} is used twice")
            seen.add(entry.name)
        if self.http_port is None and self.grpc_port is None and self.grpc_socket_path is None:
            raise ValueError("http_port: both http_port and grpc_port are null; enable at least one")
        if self.admin_token and self.admin_token_env:
            raise ValueError("admin_token: give admin_token or admin_token_env, not both")
        return self

    # --- construction -----------------------------------------------------------------------

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> DeploymentConfig:
        return cls.from_dict(read_json_file(path, "deployment config"))

    @classmethod
    def from_json(cls, text: str | bytes) -> DeploymentConfig:
        return cls.from_dict(parse_json(text, "deployment config"))

    @classmethod
    def from_dict(cls, data: Any) -> DeploymentConfig:
        """Validate a mapping; raise ConfigError naming the first bad key."""
        expect_object(data, "deployment config")
        _reject_unknown(data, set(cls.model_fields), "")
        models = data.get("models")
        if not isinstance(models, list) or not models:
            raise ConfigError("models: required, a non-empty list of {\"name\", \"model_config\"} objects")
        entries = [_model_entry(i, m) for i, m in enumerate(models)]
        fields = {k: v for k, v in data.items() if k != "models"}
        try:
            return cls(models=tuple(entries), **fields)
        except ValidationError as exc:
            raise ConfigError(describe_validation_error(exc)) from None

    # --- use --------------------------------------------------------------------------------

    def model(self, name: str) -> ModelEntry:
        for entry in self.models:
            if entry.name == name:
                return entry
        raise KeyError(name)

    def resolved_admin_token(self) -> str | None:
        """The admin token (from the file or the named environment variable); None: no token."""
        if self.admin_token_env:
            value = os.environ.get(self.admin_token_env, "")
            if not value:
                raise ConfigError(f"admin_token_env: environment variable {self.admin_token_env!r} "
                                  f"is not set or empty")
            return value
        return self.admin_token

    def redacted(self) -> dict[str, Any]:
        """For logs: secrets masked, each model_config redacted by ModelConfig."""
        out = self.model_dump(mode="json", exclude={"models"}, by_alias=True)
        if out.get("admin_token"):
            out["admin_token"] = "***"
        if self.tracing is not None:
            out["tracing"] = self.tracing.redacted()
        out["models"] = [{"name": m.name, "model_config": m.config.redacted(),
                          "version_labels": m.version_labels, "traffic": m.traffic,
                          "shadow": m.shadow.model_dump() if m.shadow is not None else None,
                          "inference_threads": m.threads,
                          "max_queued_requests": m.max_queued_requests}
                         for m in self.models]
        return out


def _model_entry(index: int, item: Any) -> ModelEntry:
    where = f"models[{index}]"
    if not isinstance(item, dict):
        raise ConfigError(f"{where}: expected an object with \"name\" and \"model_config\"")
    known = {"name", "model_config", "version_labels", "traffic", "shadow", "inference_threads",
             "max_queued_requests"}
    name = item.get("name")
    if isinstance(name, str):
        where = f"{where} {shorten(name, 80)}"
    _reject_unknown(item, known, f"{where}.")
    if "name" not in item:
        raise ConfigError(f"{where}.name: required")
    if "model_config" not in item:
        raise ConfigError(f"{where}.model_config: required")
    raw = item["model_config"]
    if isinstance(raw, str):  # EAS files often carry model_config as a JSON string
        raw = parse_json(raw, f"{where}.model_config")
    try:
        config = ModelConfig.from_dict(raw)
    except ConfigError as exc:
        raise ConfigError(f"{where}.model_config.{exc.message}") from None
    labels = item.get("version_labels", {})
    if isinstance(labels, dict):
        for label in labels:
            if not re.match(LABEL_PATTERN, str(label)):
                raise ConfigError(f"{where}.version_labels: label {shorten(label, 80)} must match {LABEL_PATTERN}")
    try:
        return ModelEntry(name=name, model_config=config, raw_config=raw,
                          version_labels=labels, traffic=item.get("traffic", {}), shadow=item.get("shadow"),
                          inference_threads=item.get("inference_threads"),
                          max_queued_requests=item.get("max_queued_requests"))
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, prefix=f"{where}.")) from None


def is_loopback(host: str) -> bool:
    """``host`` names a loopback address only (127.0.0.0/8, ::1, localhost): nothing else can
    reach a server bound there. Part of the issue 16 admin exposure rule."""
    import ipaddress

    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


# keys earlier versions took, and what replaced them
_REMOVED = {"grpc_max_workers": "removed: gRPC calls no longer share one thread pool; each model's work runs "
                                "on its own pool (its entry's inference_threads, max_queued_requests)"}


def _reject_unknown(data: dict, known: set[str], prefix: str) -> None:
    for key in data:
        if key not in known:
            if key in _REMOVED and not prefix:
                raise ConfigError(f"{key}: {_REMOVED[key]}")
            raise ConfigError(prefix + unknown_key_message(key, known, "deployment"))
