"""``tensorflow_model_server`` (server/tfserving/cli.py, server/tfserving/flags.py): TF Serving's flags parsed
as TF Serving parses them, each served one mapped onto our deployment, the others refused by name;
the text-format model config file (server/tfserving/model_config.py, also ``python -m server --config``)
and the flag files (server/tfserving/text_protos.py); the console script, the image variant's entry
script and Dockerfile. The servers themselves run in tests/e2e/test_tfserving_cli.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

pytest.importorskip("tensorflow_serving", reason="tensorflow-serving-api (server extra) is not installed")

from processor.errors import ConfigError  # noqa: E402
from server.tfserving import cli as tfs_cli  # noqa: E402
from server.tfserving import flags as tfs_flags  # noqa: E402
from server.tfserving.model_config import model_entries, new_config, read_model_entries  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]

# every flag of TF Serving's tensorflow_serving/model_servers/main.cc
TF_SERVING_FLAGS = """port grpc_socket_path rest_api_port rest_api_num_threads rest_api_timeout_in_ms
rest_api_enable_cors_support enable_batching allow_version_labels_for_unavailable_models batching_parameters_file
enable_per_model_batching_parameters model_config_file model_config_file_poll_wait_seconds model_name
model_base_path num_load_threads num_unload_threads max_num_load_retries load_retry_interval_micros
file_system_poll_wait_seconds flush_filesystem_caches tensorflow_session_parallelism
tensorflow_session_config_file tensorflow_intra_op_parallelism tensorflow_inter_op_parallelism
use_alts_credentials ssl_config_file platform_config_file per_process_gpu_memory_fraction saved_model_tags
grpc_channel_arguments grpc_max_threads enable_model_warmup num_request_iterations_for_warmup version
monitoring_config_file remove_unused_fields_from_bundle_metagraph prefer_tflite_model num_tflite_pools
num_tflite_interpreters_per_pool enable_signature_method_name_check xla_cpu_compilation_enabled
xla_gpu_compilation_enabled enable_profiler thread_pool_factory_config_file mixed_precision skip_initialize_tpu
enable_grpc_healthcheck_service enable_serialization_as_tensor_content""".split()

# the flags issue 48 asks to be served, at any value TF Serving takes (some at the values that are ours)
SERVED = """port rest_api_port model_name model_base_path model_config_file model_config_file_poll_wait_seconds
file_system_poll_wait_seconds enable_batching batching_parameters_file monitoring_config_file ssl_config_file
grpc_socket_path grpc_channel_arguments tensorflow_intra_op_parallelism tensorflow_inter_op_parallelism
tensorflow_session_parallelism rest_api_num_threads rest_api_timeout_in_ms max_num_load_retries
load_retry_interval_micros allow_version_labels_for_unavailable_models enable_profiler""".split()


def compose(argv, tmp_path=None):
    """The deployment ``argv`` makes (and the translation)."""
    flags = tfs_flags.parse(argv)
    tr = tfs_cli.translate(flags, tfs_cli.Translation())
    deployment, data = tfs_cli.compose(flags, tr)
    return deployment, data, tr


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# --- the flags ----------------------------------------------------------------------------------


def test_every_tf_serving_flag_is_known_and_the_issues_are_served():
    assert set(TF_SERVING_FLAGS) <= set(tfs_flags.FLAGS)
    assert set(tfs_flags.FLAGS) - set(TF_SERVING_FLAGS) == {"sp_config_file"}
    for name in SERVED:  # any value (but the negative poll periods TF Serving keeps for its tests)
        flag = tfs_flags.FLAGS[name]
        assert flag.accepts is None or (flag.accepts(flag.default) and flag.accepts(60) and "testing" in flag.reason)


def test_flags_are_parsed_as_tensorflow_flags_parses_them():
    flags = tfs_flags.parse(["--port=9000", "--enable_batching", "--model_name=a", "--model_name=b",
                             "--enable_model_warmup=1", "--load_retry_interval_micros=-1"])
    assert (flags.port, flags.enable_batching, flags.model_name, flags.enable_model_warmup) == (9000, True, "b", True)
    assert flags.load_retry_interval_micros == -1 and flags.rest_api_port == 0 and flags.model_name == "b"
    assert flags.given == {"port", "enable_batching", "model_name", "enable_model_warmup", "load_retry_interval_micros"}


@pytest.mark.parametrize("argv, message", [
    (["--port=x"], "--port: expected an int32 integer"),
    (["--port=3000000000"], "--port: expected an int32 integer"),
    (["--enable_batching=yes"], "--enable_batching: expected true or false"),
    (["--model_name"], "--model_name: a value is required"),
    (["--per_process_gpu_memory_fraction=lots"], "--per_process_gpu_memory_fraction: expected a number"),
    (["--no_such_flag=1"], "--no_such_flag: unknown flag"),
    (["model"], "unknown argument: model"),
    (["--port", "9000"], "--port: a value is required"),
])
def test_malformed_flags_are_errors_naming_them(argv, message):
    with pytest.raises(ConfigError) as info:
        tfs_flags.parse(argv)
    assert info.value.message.startswith(message)


@pytest.mark.parametrize("arg, reason", [
    ("--prefer_tflite_model=true", "TF Lite models are not served"),
    ("--num_tflite_pools=4", "TF Lite models are not served"),
    ("--enable_model_warmup=false", "cannot be turned off"),
    ("--saved_model_tags=serve,tpu", "only the 'serve' meta graph"),
    ("--platform_config_file=/p.txt", "platforms are not configurable"),
    ("--tensorflow_session_config_file=/s.txt", "model_config keys"),
    ("--use_alts_credentials", "ALTS is not served"),
    ("--rest_api_enable_cors_support", "CORS"),
    ("--num_load_threads=4", "each model loads on a thread of its own"),
    ("--model_config_file_poll_wait_seconds=-1", "testing mode"),
    ("--file_system_poll_wait_seconds=-1", "testing mode"),
    ("--xla_cpu_compilation_enabled", "XLA"),
    ("--mixed_precision=bfloat16", "mixed precision"),
])
def test_a_flag_we_do_not_serve_is_refused_by_name_with_the_reason(arg, reason):
    with pytest.raises(ConfigError) as info:
        tfs_flags.parse(["--model_base_path=/m", arg])
    message = info.value.message
    assert message.startswith(arg.split("=")[0]) and "not served" in message and reason in message


@pytest.mark.parametrize("arg", ["--enable_model_warmup=true", "--saved_model_tags=serve", "--enable_profiler=false",
                                 "--prefer_tflite_model=false", "--flush_filesystem_caches=false",
                                 "--enable_grpc_healthcheck_service", "--num_load_threads=0"])
def test_values_that_are_ours_are_accepted(arg):
    tfs_flags.parse(["--model_base_path=/m", arg])


def test_main_refuses_with_tf_servings_words_and_exit_2(capsys):
    assert tfs_cli.main(["--model_base_path=/m", "--prefer_tflite_model=true"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tensorflow_model_server: Failed to start server. Error: --prefer_tflite_model=true: "
                          "not served: TF Lite")
    assert tfs_cli.main([]) == 2
    assert "Both server_options.model_base_path and server_options.model_config_file are empty!" in \
        capsys.readouterr().err


def test_version_and_help(capsys):
    assert tfs_cli.main(["--version"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("TensorFlow ModelServer: serving-processor ") and "TensorFlow Library: " in out
    assert tfs_cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"--{name}=" in out for name in TF_SERVING_FLAGS)


# --- what the flags become -----------------------------------------------------------------------


def test_a_single_model_with_tf_servings_defaults():
    dep, data, _ = compose(["--model_base_path=/models/m"])
    assert (dep.grpc_port, dep.http_port, dep.host) == (8500, None, "0.0.0.0")  # REST off, TF Serving's default
    assert dep.http_request_timeout_ms == 30000 and dep.model_config_file_poll_wait_seconds == 0
    assert not dep.allow_version_labels_for_unavailable_models
    assert dep.enable_profiler  # TF Serving's --enable_profiler default (ours: off, server/tfserving/profiler.py)
    (entry,) = dep.models
    assert entry.name == "default" and entry.config.savedmodel_dir == "/models/m"
    assert entry.config.model_version_policy.describe() == {"latest": {"num_versions": 1}}
    config = data["models"][0]["model_config"]
    assert (config["max_num_load_retries"], config["load_retry_interval_micros"],
            config["file_system_poll_wait_seconds"]) == (5, 60_000_000, 1)
    assert "batching" not in config and "intra_op_parallelism_threads" not in config


def test_server_flags_map_onto_deployment_keys():
    dep, data, tr = compose([
        "--model_name=m", "--model_base_path=s3://bucket/m", "--port=9000", "--rest_api_port=9001",
        "--rest_api_timeout_in_ms=0", "--grpc_socket_path=/tmp/x.sock", "--rest_api_num_threads=12",
        "--grpc_channel_arguments=grpc.max_connection_age_ms=2000,grpc.lb_policy_name=grpclb,grpc.so_reuseaddr=1",
        "--grpc_max_threads=64", "--allow_version_labels_for_unavailable_models",
        "--tensorflow_session_parallelism=3", "--file_system_poll_wait_seconds=0", "--max_num_load_retries=0",
        "--load_retry_interval_micros=-5", "--enable_serialization_as_tensor_content", "--enable_profiler=false"])
    assert (dep.grpc_port, dep.http_port, dep.grpc_socket_path, dep.http_request_timeout_ms) == (
        9000, 9001, "/tmp/x.sock", None)
    assert dep.grpc_channel_arguments == {"grpc.max_connection_age_ms": 2000, "grpc.lb_policy_name": "grpclb",
                                          "grpc.so_reuseaddr": 1}
    assert dep.grpc_max_concurrent_rpcs == 64 and dep.allow_version_labels_for_unavailable_models
    assert not dep.enable_profiler
    (entry,) = dep.models
    c = entry.config
    assert (c.model_store_type, c.intra_op_parallelism_threads, c.inter_op_parallelism_threads) == ("s3", 3, 3)
    assert (c.file_system_poll_wait_seconds, c.max_num_load_retries, c.load_retry_interval_micros) == (0, 0, 0)
    assert c.enable_serialization_as_tensor_content and entry.inference_threads == 12


def test_grpc_options_take_the_channel_arguments_over_ours():
    from server.settings import DeploymentConfig
    from server.grpc.server import grpc_options

    dep = DeploymentConfig.from_dict({"models": [{"name": "m", "model_config": {"savedmodel_dir": "/m"}}],
                                      "grpc_channel_arguments": {"grpc.max_connection_age_ms": 2000,
                                                                 "grpc.max_concurrent_streams": 7}})
    options = grpc_options(dep)
    assert len(options) == len(dict(options))  # each key once: ours replaced, not repeated
    assert dict(options)["grpc.max_connection_age_ms"] == 2000 and dict(options)["grpc.max_concurrent_streams"] == 7


@pytest.mark.parametrize("argv, message", [
    (["--port=0"], "At least one of server_options.grpc_port or server_options.grpc_socket_path must be set"),
    (["--tensorflow_session_parallelism=1", "--tensorflow_intra_op_parallelism=1",
      "--tensorflow_inter_op_parallelism=1"], "You cannot configure all."),
    (["--batching_parameters_file=/b.txt"], "batching_parameters_file is set without setting "
                                             "server_options.enable_batching to true."),
    (["--grpc_channel_arguments=grpc.x"], "--grpc_channel_arguments: 'grpc.x' is not key=value"),
])
def test_tf_servings_own_refusals(argv, message):
    with pytest.raises(ConfigError) as info:
        compose(["--model_base_path=/m", *argv])
    assert message in info.value.message


def test_intra_and_inter_op_flags_set_their_keys_only():
    dep, _, _ = compose(["--model_base_path=/m", "--tensorflow_intra_op_parallelism=2"])
    assert dep.models[0].config.intra_op_parallelism_threads == 2
    assert "inter_op_parallelism_threads" not in dep.models[0].raw_config


def test_rest_port_equal_to_grpc_port_is_skipped_as_tf_serving_skips_it():
    dep, _, tr = compose(["--model_base_path=/m", "--port=9000", "--rest_api_port=9000"])
    assert dep.http_port is None and dep.grpc_port == 9000
    assert any("http_port cannot be same as grpc_port" in note for note in tr.notes)


def test_batching_parameters_file_with_tf_servings_defaults(tmp_path):
    dep, _, _ = compose(["--model_base_path=/m", "--enable_batching"])
    b = dep.models[0].config.batching
    assert (b.max_batch_size, b.batch_timeout_micros, b.max_enqueued_batches) == (1000, 0, 10)
    assert b.num_batch_threads == min(256, os.cpu_count())
    path = write(tmp_path / "batching.txt", "max_batch_size { value: 64 }\nbatch_timeout_micros { value: 500 }\n"
                                           "num_batch_threads { value: 3 }\nallowed_batch_sizes: 8\n"
                                           "allowed_batch_sizes: 64\npad_variable_length_inputs: true\n"
                                           "thread_pool_name { value: \"shared\" }\n"
                                           "enable_large_batch_splitting { value: true }\n"
                                           "max_execution_batch_size { value: 32 }\n")
    dep, _, _ = compose(["--model_base_path=/m", "--enable_batching", f"--batching_parameters_file={path}"])
    c = dep.models[0].config
    assert (c.batching.max_batch_size, c.batching.batch_timeout_micros, c.batching.num_batch_threads,
            c.batching.allowed_batch_sizes, c.batching.pad_variable_length_inputs,
            c.batching.max_enqueued_batches, c.max_execution_batch_size) == (64, 500, 3, (8, 64), True, 10, 32)
    bad = write(tmp_path / "bad.txt", "max_batch_size { value: 64 }\nallowed_batch_sizes: 8\n")
    with pytest.raises(ConfigError, match=r"--batching_parameters_file: allowed_batch_sizes: the last entry"):
        compose(["--model_base_path=/m", "--enable_batching", f"--batching_parameters_file={bad}"])
    broken = write(tmp_path / "broken.txt", "max_batch_size: 64\n")
    with pytest.raises(ConfigError) as info:
        compose(["--model_base_path=/m", "--enable_batching", f"--batching_parameters_file={broken}"])
    assert info.value.message.startswith("Error parsing text-format tensorflow.serving.BatchingParameters: 1:")
    assert f"Invalid protobuf file: '{broken}'" in info.value.message


def test_monitoring_config_file_sets_the_prometheus_path(tmp_path):
    path = write(tmp_path / "m.txt", 'prometheus_config: {\n  enable: true,\n  path: "/my/metrics"\n}\n')
    dep, _, _ = compose(["--model_base_path=/m", f"--monitoring_config_file={path}"])
    assert dep.prometheus_path == "/my/metrics"
    path = write(tmp_path / "d.txt", 'prometheus_config: {\n  enable: true,\n  path: "/monitoring/prometheus/metrics"\n}')
    assert compose(["--model_base_path=/m", f"--monitoring_config_file={path}"])[0].prometheus_path is None
    path = write(tmp_path / "off.txt", "prometheus_config { enable: false }")
    _, _, tr = compose(["--model_base_path=/m", f"--monitoring_config_file={path}"])
    assert any("/metrics serves anyway" in note for note in tr.notes)


def test_ssl_config_file_is_grpc_tls_with_the_key_kept_off_disk(tmp_path, monkeypatch):
    pytest.importorskip("cryptography")
    from tools.dev_certs import issue, make_ca

    monkeypatch.delenv(tfs_cli.SSL_KEY_ENV, raising=False)
    ca = make_ca()
    leaf = issue(ca, "localhost", hosts=("localhost",))
    path = write(tmp_path / "ssl.txt", f"server_key: {json.dumps(leaf.key_pem.decode())}\n"
                                       f"server_cert: {json.dumps(leaf.cert_pem.decode())}\n"
                                       f"custom_ca: {json.dumps(ca.cert_pem.decode())}\nclient_verify: true\n")
    dep, _, tr = compose(["--model_base_path=/m", "--rest_api_port=8501", f"--ssl_config_file={path}"])
    assert dep.grpc_tls_on and not dep.http_tls_on and dep.tls_require_client_cert
    assert Path(dep.tls_cert_file).read_bytes() == leaf.cert_pem
    assert Path(dep.tls_client_ca_file).read_bytes() == ca.cert_pem
    assert os.stat(dep.tls_cert_file).st_mode & 0o077 == 0
    assert dep.tls_key_env == tfs_cli.SSL_KEY_ENV and os.environ[tfs_cli.SSL_KEY_ENV] == leaf.key_pem.decode()
    assert not any(p.read_bytes() == leaf.key_pem for p in Path(dep.tls_cert_file).parent.iterdir())
    from server.tls import load_material

    load_material(dep)  # the files and the key are what the server loads
    for step in tr.cleanup:
        step()
    assert not Path(dep.tls_cert_file).parent.exists()
    no_ca = write(tmp_path / "no_ca.txt", f"server_key: {json.dumps(leaf.key_pem.decode())}\n"
                                          f"server_cert: {json.dumps(leaf.cert_pem.decode())}\nclient_verify: true\n")
    with pytest.raises(ConfigError, match="client_verify needs custom_ca"):
        compose(["--model_base_path=/m", f"--ssl_config_file={no_ca}"])


# --- the model config file -------------------------------------------------------------------------


def test_model_config_file_entries(tmp_path):
    path = write(tmp_path / "models.config", """
    # TF Serving's text format, comments included
    model_config_list {
      config {
        name: "a" base_path: "/models/a" model_platform: "tensorflow"
        model_version_policy { specific { versions: 1 versions: 3 } }
        version_labels { key: "stable" value: 1 }
        version_labels { key: "canary" value: 3 }
        logging_config {
          log_collector_config { type: "jsonl" filename_prefix: "/var/log/sp/a_logs" }
          sampling_config { sampling_rate: 0.25 }
        }
      }
      config { name: "b" base_path: "oss://bucket/b" model_version_policy { all {} } }
    }""")
    a, b = read_model_entries(path)
    assert a == {"name": "a", "version_labels": {"stable": 1, "canary": 3}, "model_config": {
        "savedmodel_dir": "/models/a", "model_version_policy": {"specific": {"versions": [1, 3]}},
        "logging_config": {"sampling_rate": 0.25, "path": "/var/log/sp", "format": "jsonl",
                           "filename_prefix": "a_logs"}}}
    assert b["model_config"] == {"savedmodel_dir": "oss://bucket/b", "model_version_policy": {"all": {}},
                                 "model_store_type": "oss"}


@pytest.mark.parametrize("model, message", [
    ('name: "a" base_path: "/a" model_platform: "tflite"', "config[0].model_platform: 'tflite' is not served"),
    ('name: "a" base_path: "gs://b/a"', "config[0].base_path: 'gs':// is not a model store served here"),
    ('name: "a" base_path: "/a" model_type: OTHER', "config[0].model_type: only TENSORFLOW"),
    ('name: "a" base_path: "/a" logging_config { sampling_config { sampling_rate: 1 } }',
     "log_collector_config.filename_prefix: required"),
    ('name: "a" base_path: "/a" logging_config { log_collector_config { type: "bigquery" filename_prefix: "/l/a" } }',
     "log_collector_config.type: 'bigquery' is not a log format here"),
    ('name: "a" base_path: "/a" logging_config { sampling_config { per_task_sampling_configs { dc: "x" } } }',
     "per_task_sampling_configs: per-task sampling rates have no equivalent here"),
])
def test_model_config_fields_we_cannot_serve_are_refused_naming_the_field(tmp_path, model, message):
    path = write(tmp_path / "models.config", f"model_config_list {{ config {{ {model} }} }}")
    with pytest.raises(ConfigError) as info:
        read_model_entries(path)
    assert info.value.message.startswith("config.model_config_list.config[0].") and message in info.value.message


def test_a_custom_model_config_is_refused():
    config = new_config()
    config.custom_model_config.type_url = "type.googleapis.com/x.Y"
    with pytest.raises(ConfigError, match="Only ModelConfigList is currently supported"):
        model_entries(config)


def test_a_malformed_model_config_file_fails_with_tf_servings_message(tmp_path, capsys):
    path = write(tmp_path / "bad_model_config.txt", "improperly formatted file")
    assert tfs_cli.main([f"--model_config_file={path}"]) == 2
    err = capsys.readouterr().err
    assert "Error parsing text-format tensorflow.serving.ModelServerConfig: 1:1 : " in err
    assert f"Invalid protobuf file: '{path}'" in err
    empty = write(tmp_path / "empty.txt", "model_config_list {}")
    assert tfs_cli.main([f"--model_config_file={empty}"]) == 2
    assert "serves no model" in capsys.readouterr().err


def test_our_deployment_file_beside_the_flags(tmp_path):
    models = write(tmp_path / "models.config", 'model_config_list { config { name: "a" base_path: "/models/a" } '
                                               'config { name: "b" base_path: "/models/b" } }')
    ours = write(tmp_path / "ours.json", json.dumps({
        "grpc_port": 7000, "http_port": 7001, "admin_token_env": "SP_ADMIN", "max_request_bytes": 1 << 20,
        "models": [{"name": "a", "model_config": {"session_num": 2, "file_system_poll_wait_seconds": 9,
                                                  "savedmodel_dir": "/elsewhere/a"},
                    "version_labels": {"stable": 1}, "max_queued_requests": 5},
                   {"name": "c", "model_config": {"savedmodel_dir": "/models/c"}}]}))
    dep, _, _ = compose([f"--model_config_file={models}", f"--sp_config_file={ours}", "--rest_api_port=8501"])
    # server keys: an explicit flag over the file, the file over the flags' defaults
    assert (dep.grpc_port, dep.http_port, dep.admin_token_env, dep.max_request_bytes) == (7000, 8501, "SP_ADMIN",
                                                                                          1 << 20)
    a, b, c = dep.models
    assert (a.name, a.config.session_num, a.config.file_system_poll_wait_seconds, a.config.savedmodel_dir,
            a.config.max_num_load_retries, a.version_labels, a.max_queued_requests) == (
        "a", 2, 9, "/elsewhere/a", 5, {"stable": 1}, 5)
    assert (b.name, b.config.session_num, b.config.file_system_poll_wait_seconds) == ("b", 1, 1)
    assert c.name == "c" and c.config.savedmodel_dir == "/models/c"


def test_python_m_server_takes_a_text_format_model_config_too(tmp_path, capsys):
    from server import __main__ as cli

    path = write(tmp_path / "models.config", 'model_config_list { config { name: "a" base_path: "/models/a" } }')
    assert cli.main(["--check", "--config", str(path), "--grpc-port", "9100"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["grpc_port"] == 9100 and [m["name"] for m in shown["models"]] == ["a"]
    assert shown["models"][0]["model_config"]["savedmodel_dir"] == "/models/a"
    bad = write(tmp_path / "bad.config", "model_config_list { config { nme: \"a\" } }")
    assert cli.main(["--check", "--config", str(bad)]) == 2
    assert "bad config: Error parsing text-format tensorflow.serving.ModelServerConfig: 1:" in capsys.readouterr().err


def test_a_polled_text_file_that_is_malformed_leaves_the_running_set(tmp_path):
    """The live model set reads the file through the reader it is given: a malformed file is a
    refused reload (reported), nothing applied."""
    from types import SimpleNamespace

    from server.model_set import ModelSet, read_deployment

    path = write(tmp_path / "models.config", 'model_config_list { config { name: "a" base_path: "/models/a" } }')
    running, _ = read_deployment(path)
    applied = []
    rt = SimpleNamespace(deployment=running)
    model_set = ModelSet(rt, lambda: read_deployment(path)[0], path, 0.0)
    model_set.apply = lambda new, trigger: applied.append(new) or {}
    path.write_text("improperly formatted file")
    report = model_set.reload("file changed")
    assert report["error"].startswith("Error parsing text-format tensorflow.serving.ModelServerConfig") and not applied


# --- the deployment keys the flags use ----------------------------------------------------------------


def test_new_deployment_keys_are_validated():
    from server.settings import DeploymentConfig

    base = {"models": [{"name": "m", "model_config": {"savedmodel_dir": "/m"}}]}
    for extra, message in [({"grpc_socket_path": "/x.sock", "workers": 2}, "grpc_socket_path: a Unix socket"),
                           ({"grpc_channel_arguments": {"Bad Key": 1}}, "grpc_channel_arguments:"),
                           ({"prometheus_path": "/v1/models/x"}, "prometheus_path:"),
                           ({"http_request_timeout_ms": 0}, "http_request_timeout_ms")]:
        with pytest.raises(ConfigError) as info:
            DeploymentConfig.from_dict({**base, **extra})
        assert message in info.value.message
    only_socket = DeploymentConfig.from_dict({**base, "http_port": None, "grpc_port": None,
                                              "grpc_socket_path": "/x.sock"})
    assert only_socket.grpc_socket_path == "/x.sock"


def test_http_requests_get_the_default_deadline():
    import time

    from server.deadline import from_http_headers

    assert from_http_headers([]) is None
    now = time.monotonic()
    assert now + 29 < from_http_headers([], 30000) <= time.monotonic() + 30
    assert from_http_headers([(b"x-request-timeout-ms", b"1000")], 30000) <= time.monotonic() + 1


# --- packaging, the image -----------------------------------------------------------------------------


def test_console_script_and_its_install():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["tensorflow_model_server"] == "server.tfserving.cli:main"
    assert callable(tfs_cli.main)
    assert "pip install --quiet --disable-pip-version-check -e" in (ROOT / "scripts/setup.sh").read_text()


def test_entry_script_passes_tf_servings_command_line(tmp_path):
    """The script's command line, read back from a stand-in ``tensorflow_model_server``."""
    fake = tmp_path / "bin" / "tensorflow_model_server"
    fake.parent.mkdir()
    fake.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n')
    fake.chmod(0o755)
    script = ROOT / "docker" / "tfserving-entrypoint.sh"

    def args(env, *extra):
        out = subprocess.run(["bash", str(script), *extra], capture_output=True, text=True, timeout=30,
                             env={"PATH": f"{fake.parent}:/usr/bin:/bin", **env})
        assert out.returncode == 0, out.stderr
        return out.stdout.splitlines()

    assert args({}) == ["--port=8500", "--rest_api_port=8501", "--model_name=model", "--model_base_path=/models/model"]
    assert args({"MODEL_NAME": "half_plus_two"})[3] == "--model_base_path=/models/half_plus_two"
    assert args({"MODEL_NAME": "m", "MODEL_BASE_PATH": "/data"}, "--port=9000", "--enable_batching") == [
        "--port=8500", "--rest_api_port=8501", "--model_name=m", "--model_base_path=/data/m", "--port=9000",
        "--enable_batching"]
    # a later flag wins, so the arguments move the ports
    assert tfs_flags.parse(args({}, "--port=9000", "--rest_api_port=9001")).port == 9000


def test_tfserving_dockerfile_variant():
    text = (ROOT / "docker" / "Dockerfile.tfserving").read_text()
    assert re.search(r"^ARG BASE=serving-processor:cpu$", text, re.M) and re.search(r"^FROM \$\{BASE\}$", text, re.M)
    assert re.search(r"^ENV MODEL_BASE_PATH=/models \\\n\s+MODEL_NAME=model$", text, re.M)
    assert "COPY docker/tfserving-entrypoint.sh /usr/bin/tf_serving_entrypoint.sh" in text
    assert re.search(r"^EXPOSE 8500 8501$", text, re.M)
    assert re.search(r'^ENTRYPOINT \["/usr/bin/tf_serving_entrypoint.sh"\]$', text, re.M)
    assert re.search(r"^CMD \[\]$", text, re.M)  # the base image's --host 0.0.0.0 is no TF Serving flag
    user = re.findall(r"^USER (\S+)$", text, re.M)
    assert user[-1].split(":")[0] not in ("0", "root")
