"""``tensorflow_model_server``'s command line: every flag of TF Serving's ``main.cc``, parsed as
TF Serving parses them (``tensorflow::Flags``), and refused by name where we serve no equivalent.

:data:`FLAGS` holds each flag's type, TF Serving's default and help text, and for a flag we do
not serve (or serve at some values only) which values are accepted and why the others are not.
:func:`parse` turns ``argv`` into :class:`Flags`: every flag's value (TF Serving's default when
not given) and the names given. Its rules are ``tensorflow::Flags``':

* ``--name=value``; a bool flag also ``--name`` alone (true), its value ``true`` / ``false`` /
  ``1`` / ``0``; the last of a flag given twice wins (so an image's entry script can be
  overridden by its arguments);
* an integer must fit its type (int32, int64); a float is a decimal number;
* an argument that is not a flag, or an unknown flag, is an error here (TF Serving prints it and
  goes on: never ignored here), as is a refused value: ``--prefer_tflite_model=true: not
  served: TF Lite models are not served (TensorFlow SavedModels and ONNX)``.

Every problem is a :class:`~processor.errors.ConfigError` whose message starts with the flag.
What each served flag means here is :mod:`server.tfserving.cli`'s. Pure: nothing read at import.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from processor.echo import cut
from processor.errors import ConfigError

_RANGES = {"int32": (-2**31, 2**31 - 1), "int64": (-2**63, 2**63 - 1)}


@dataclass(frozen=True)
class Flag:
    """One flag: its type (``int32``, ``int64``, ``float``, ``bool``, ``string``), TF Serving's
    default and help; ``accepts(value)``: whether a value given is served (None: any), else
    refused with ``reason``."""

    kind: str
    default: Any
    help: str
    accepts: Callable[[Any], bool] | None = None
    reason: str = ""


def _only(*values: Any) -> Callable[[Any], bool]:
    return lambda value: value in values


def _off(kind: str, default: Any, help_: str, reason: str) -> Flag:
    """A flag served at its default (or off) only."""
    return Flag(kind, default, help_, _only(default, False, "", 0), reason)


FLAGS: dict[str, Flag] = {
    # --- served (server/tfserving/cli.py maps each) -----------------------------------------------------
    "port": Flag("int32", 8500, "gRPC port (0: no TCP port; then --grpc_socket_path)"),
    "grpc_socket_path": Flag("string", "", "gRPC also on this Unix socket"),
    "rest_api_port": Flag("int32", 0, "HTTP/REST port (0: no HTTP server); not --port's"),
    "rest_api_num_threads": Flag("int32", 0, "threads that run each model's requests (inference_threads)"),
    "rest_api_timeout_in_ms": Flag("int32", 30000, "deadline of REST calls (http_request_timeout_ms)"),
    "enable_batching": Flag("bool", False, "batch requests (every model's batching)"),
    "batching_parameters_file": Flag("string", "", "text-format BatchingParameters (needs --enable_batching)"),
    "allow_version_labels_for_unavailable_models": Flag(
        "bool", False, "version labels may name versions not served yet"),
    "model_config_file": Flag("string", "", "text-format ModelServerConfig (then --model_name and "
                                            "--model_base_path are ignored)"),
    "model_config_file_poll_wait_seconds": Flag(
        "int32", 0, "re-read --model_config_file this often, applying its models live (0: never)",
        lambda v: v >= 0, "negative values are TF Serving's testing mode"),
    "model_name": Flag("string", "default", "name of the model of --model_base_path"),
    "model_base_path": Flag("string", "", "the model's base directory (versions in numbered directories)"),
    "max_num_load_retries": Flag("int32", 5, "retries of a version that failed to load"),
    "load_retry_interval_micros": Flag("int64", 60_000_000, "between load retries (negative: no wait)"),
    "file_system_poll_wait_seconds": Flag(
        "int32", 1, "poll for new versions this often (0: once)",
        lambda v: v >= 0, "negative values are TF Serving's testing mode (never look for a version)"),
    "tensorflow_session_parallelism": Flag("int64", 0, "inter- and intra-op threads (0: auto)"),
    "tensorflow_intra_op_parallelism": Flag("int64", 0, "intra-op threads (0: auto)"),
    "tensorflow_inter_op_parallelism": Flag("int64", 0, "inter-op threads (0: auto)"),
    "ssl_config_file": Flag("string", "", "text-format SSLConfig: gRPC over TLS"),
    "saved_model_tags": Flag("string", "serve", "tags of the meta graph to load", _only("serve"),
                             "only the 'serve' meta graph is served (other tag sets are TF Serving's "
                             "TPU / GPU builds')"),
    "grpc_channel_arguments": Flag("string", "", "gRPC server channel arguments: k=v,k=v"),
    "grpc_max_threads": Flag("int32", 0, "gRPC calls handled at once (grpc_max_concurrent_rpcs)"),
    "enable_model_warmup": Flag("bool", True, "warm models up before they serve", _only(True),
                                "every version is warmed up before it serves here (assets.extra/"
                                "tf_serving_warmup_requests, else synthetic requests); it cannot be "
                                "turned off"),
    "monitoring_config_file": Flag("string", "", "text-format MonitoringConfig: Prometheus path"),
    "enable_serialization_as_tensor_content": Flag("bool", False, "Predict outputs as tensor_content"),
    "enable_grpc_healthcheck_service": Flag("bool", False, "the gRPC health service (always served here)"),
    "enable_profiler": Flag("bool", True, "tensorflow.ProfilerService on the gRPC port (enable_profiler)"),
    "flush_filesystem_caches": Flag("bool", True, "no file system cache is kept here: either value holds"),
    "version": Flag("bool", False, "print the version and exit"),
    # --- ours -------------------------------------------------------------------------------------
    "sp_config_file": Flag("string", "", "ours: a deployment JSON of serving-processor's keys, beside the "
                                         "flags (server keys; models by name: their keys over these)"),
    # --- refused (at other values than these) -------------------------------------------------------
    "rest_api_enable_cors_support": _off("bool", False, "CORS headers", "CORS headers are not served"),
    "enable_per_model_batching_parameters": _off(
        "bool", False, "batching_params.pbtxt per SavedModel",
        "per-model batching comes from each model's model_config batching (--sp_config_file)"),
    "num_load_threads": _off("int32", 0, "load thread pool",
                             "each model loads on a thread of its own at start, one at a time on a reload"),
    "num_unload_threads": _off("int32", 0, "unload thread pool",
                               "a model is freed when its last request ends, on no pool of its own"),
    "tensorflow_session_config_file": _off(
        "string", "", "text-format session ConfigProto",
        "session settings are model_config keys (--sp_config_file: intra_op_parallelism_threads, "
        "use_per_session_threads, cpusets, gpu_ids_list, ...)"),
    "use_alts_credentials": _off("bool", False, "ALTS credentials", "ALTS is not served; --ssl_config_file"),
    "platform_config_file": _off("string", "", "text-format PlatformConfigMap",
                                 "platforms are not configurable: TensorFlow SavedModels (and ONNX)"),
    "per_process_gpu_memory_fraction": _off(
        "float", 0.0, "GPU memory fraction", "TensorFlow's GPU memory is not capped per process here"),
    "num_request_iterations_for_warmup": _off(
        "int32", 0, "warmup iterations", "each warmup request runs once per lane and batch size "
                                          "(model_config warmup_batch_sizes)"),
    "remove_unused_fields_from_bundle_metagraph": Flag(
        "bool", True, "drop unused MetaGraphDef fields", _only(True),
        "only the signatures of the meta graph are kept here"),
    "prefer_tflite_model": _off("bool", False, "TF Lite", "TF Lite models are not served "
                                                          "(TensorFlow SavedModels and ONNX)"),
    "num_tflite_pools": _off("int32", 0, "TF Lite", "TF Lite models are not served"),
    "num_tflite_interpreters_per_pool": _off("int32", 1, "TF Lite", "TF Lite models are not served"),
    "enable_signature_method_name_check": _off(
        "bool", False, "SignatureDef method name check", "signature method names are not checked"),
    "xla_cpu_compilation_enabled": _off("bool", False, "XLA:CPU JIT", "XLA JIT compilation is not enabled"),
    "xla_gpu_compilation_enabled": _off("bool", False, "XLA:GPU JIT", "XLA JIT compilation is not enabled"),
    "thread_pool_factory_config_file": _off(
        "string", "", "ThreadPoolConfig", "custom thread pool factories are not served"),
    "mixed_precision": _off("string", "", "mixed precision", "mixed precision rewriting is not served"),
    "skip_initialize_tpu": _off("bool", False, "TPU", "TPUs are not served"),
}


@dataclass(frozen=True)
class Flags:
    """Every flag's value (TF Serving's default when not given) and the names given."""

    values: dict[str, Any]
    given: frozenset[str] = field(default_factory=frozenset)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None


def parse(argv: Sequence[str]) -> Flags:
    """``argv`` (without the program name) as :class:`Flags`; ConfigError naming the flag."""
    values = {name: flag.default for name, flag in FLAGS.items()}
    given: set[str] = set()
    for arg in argv:
        m = re.match(r"^--([A-Za-z0-9_]+)(?:=(.*))?$", arg, re.S)
        if m is None:
            raise ConfigError(f"unknown argument: {cut(arg)} (flags are --name=value)")
        name, text = m.group(1), m.group(2)
        flag = FLAGS.get(name)
        if flag is None:
            raise ConfigError(f"--{cut(name)}: unknown flag; TF Serving's flags are served (--help lists them)")
        values[name] = _value(name, flag, text)
        given.add(name)
    for name in sorted(given):
        flag = FLAGS[name]
        if flag.accepts is not None and not flag.accepts(values[name]):
            raise ConfigError(f"--{name}={_show(values[name])}: not served: {flag.reason}")
    return Flags(values, frozenset(given))


def usage(prog: str) -> str:
    """The flags, TF Serving's ``Flags::Usage`` style."""
    lines = [f"usage: {prog}", "Flags:"]
    for name, flag in FLAGS.items():
        refused = f" [values refused here: {flag.reason}]" if flag.reason else ""
        lines.append(f"\t--{name}={_show(flag.default)}\t{flag.kind}\t{flag.help}{refused}")
    return "\n".join(lines)


def _value(name: str, flag: Flag, text: str | None) -> Any:
    if flag.kind == "bool":
        if text is None or text in ("true", "1"):
            return True
        if text in ("false", "0"):
            return False
        raise ConfigError(f"--{name}: expected true or false, got {cut(text)}")
    if text is None:
        raise ConfigError(f"--{name}: a value is required (--{name}=...)")
    if flag.kind in _RANGES:
        lo, hi = _RANGES[flag.kind]
        if not re.match(r"^[+-]?\d{1,20}$", text) or not lo <= int(text) <= hi:
            raise ConfigError(f"--{name}: expected an {flag.kind} integer, got {cut(text)}")
        return int(text)
    if flag.kind == "float":
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise ConfigError(f"--{name}: expected a number, got {cut(text)}")
        return value
    return text


def _show(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else cut(str(value))
