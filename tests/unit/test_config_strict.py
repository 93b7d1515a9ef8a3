"""Strict config types, cpusets without per-session threads, non-UTF-8 configs and bounded echoes
(issue 16): every case is a ConfigError (400) whose message starts with the key it concerns."""

import json

import pytest

from processor.config import ModelConfig, shorten
from processor.config_text import decode_utf8, parse_json
from server.settings import DeploymentConfig
from processor.errors import ConfigError, StatusCode

BASE = {"savedmodel_dir": "/models/sm"}
ECHO_BOUND = 1024  # an error message about a huge value stays below this many characters


def cfg(**kw):
    return ModelConfig.from_dict({**BASE, **kw})


def refused(key, **kw) -> str:
    with pytest.raises(ConfigError) as err:
        cfg(**kw)
    assert err.value.message.startswith(key), err.value.message
    assert err.value.code == StatusCode.INVALID_ARGUMENT
    return err.value.message


@pytest.mark.parametrize("key,value", [
    # the cases
    ("session_num", "2"), ("session_num", True), ("use_per_session_threads", "yes"),
    # strings and booleans are not numbers
    ("session_num", 2.0), ("read_thread_num", "4"), ("update_thread_num", False),
    ("inter_op_parallelism_threads", "8"), ("intra_op_parallelism_threads", True),
    ("model_update_inter_threads", "1"), ("lock_timeout", 1.5), ("lock_timeout", "900"),
    ("init_timeout_minutes", "1"), ("init_timeout_minutes", True),
    ("file_system_poll_wait_seconds", "2"), ("file_system_poll_wait_seconds", False),
    ("restore_model_version", "3"), ("restore_model_version", True),
    ("shard_instance_count", "2"), ("timeline_start_step", "0"),
    ("ev_storage_type", True), ("ev_storage_type", 1.0), ("ev_storage_type", "1"),
    ("redis_connect_timeout_seconds", "1"), ("redis_connect_timeout_seconds", True),
    ("redis_connect_timeout_seconds", 0), ("omp_num_threads", True), ("omp_num_threads", 4.0),
    ("kmp_blocktime", False),
    # numbers and strings are not booleans
    ("use_per_session_threads", 1), ("use_per_session_threads", "true"),
    ("enable_inline_execute", 0), ("use_multi_stream", "false"), ("gpu_fallback_to_cpu", 1),
    ("enable_device_placement_optimization", "no"), ("shard_embedding", 1),
    # numbers are not strings
    ("signature_name", 5), ("savedmodel_dir", 1), ("redis_password", 123), ("timeline_path", 1),
    ("select_session_policy", 0), ("delta_mode", True), ("embedding_names", 3),
    # NaN / infinity are not numbers a config can mean
    ("init_timeout_minutes", float("nan")), ("file_system_poll_wait_seconds", float("inf")),
])
def test_wrong_types_are_refused_not_coerced(key, value):
    message = refused(key, **{key: value})
    assert shorten(value) in message  # says what it got


def test_batching_keys_stay_strict_inside_the_strict_config():
    with pytest.raises(ConfigError, match="^batching.max_batch_size"):
        cfg(batching={"max_batch_size": "32"})
    with pytest.raises(ConfigError, match="^batching"):
        cfg(batching="on")
    assert cfg(batching={"max_batch_size": 8}).batching.max_batch_size == 8


def test_integers_are_fine_where_numbers_are_expected():
    c = cfg(init_timeout_minutes=1, file_system_poll_wait_seconds=0, redis_connect_timeout_seconds=2)
    assert c.init_timeout_minutes == 1.0 and c.redis_connect_timeout_seconds == 2.0


def test_deeprec_string_forms_are_kept_on_purpose():
    # DeepRec reads omp_num_threads / kmp_blocktime "as string"; cpusets and gpu_ids_list are strings
    c = cfg(omp_num_threads="4", kmp_blocktime="0", session_num=2, use_per_session_threads=True,
            cpusets="0;1", gpu_ids_list="0", gpu_fallback_to_cpu=True, ev_storage_size="1024,2048")
    assert (c.omp_num_threads, c.kmp_blocktime) == (4, 0)
    assert c.cpusets == ((0,), (1,)) and c.gpu_ids_list == (0,) and c.ev_storage_size == (1024, 2048)
    assert cfg(gpu_ids_list=[0, 1]).gpu_ids_list == (0, 1)
    refused("omp_num_threads", omp_num_threads="4.5")
    refused("gpu_ids_list", gpu_ids_list=[True])


def test_redis_connect_timeout_default_and_range():
    assert cfg().redis_connect_timeout_seconds == 1.0  # fail fast by default (<= 2 s)
    assert cfg(redis_connect_timeout_seconds=0.25).redis_connect_timeout_seconds == 0.25
    refused("redis_connect_timeout_seconds", redis_connect_timeout_seconds=-1)
    refused("redis_connect_timeout_seconds", redis_connect_timeout_seconds=61)


def test_cpusets_without_per_session_threads_is_refused_with_the_reason():
    message = refused("cpusets", session_num=2, cpusets="0;1")
    assert "use_per_session_threads" in message and "nothing would be pinned" in message
    message = refused("cpusets", session_num=2, cpusets="0;1", use_per_session_threads=False)
    assert "use_per_session_threads" in message
    assert cfg(session_num=2, cpusets="0;1", use_per_session_threads=True).cpusets == ((0,), (1,))
    assert cfg(cpusets="").cpusets == ()  # empty: nothing to pin, nothing to refuse


def test_json_nan_and_infinity_tokens_are_refused():
    for token in ("NaN", "Infinity", "-Infinity"):
        with pytest.raises(ConfigError, match=f"^model_config: not valid JSON .*{token.lstrip('-')}"):
            ModelConfig.from_json('{"savedmodel_dir": "/m", "init_timeout_minutes": %s}' % token)


def test_a_deeply_nested_config_is_a_config_error():
    with pytest.raises(ConfigError, match="^model_config: not valid JSON"):
        ModelConfig.from_json("[" * 100_000 + "]" * 100_000)


# --- not UTF-8 ---------------------------------------------------------------------------------

LATIN1 = '{"savedmodel_dir": "/m/caf\xe9"}'.encode("latin-1")


def test_non_utf8_config_bytes_are_named_as_such():
    with pytest.raises(ConfigError) as err:
        ModelConfig.from_json(LATIN1)
    assert err.value.message.startswith("model_config: not UTF-8"), err.value.message
    assert "0xe9" in err.value.message and "offset 26" in err.value.message


def test_non_utf8_through_the_c_abi_form_is_named_as_such():
    # the C shim hands undecodable bytes over as lone surrogates (surrogateescape)
    text = LATIN1.decode("utf-8", "surrogateescape")
    with pytest.raises(ConfigError, match=r"^model_config: not UTF-8 \(byte 0xe9"):
        ModelConfig.from_json(text)
    with pytest.raises(ConfigError, match="^x: not UTF-8"):
        decode_utf8("\ud800", "x")


def test_utf8_with_or_without_a_bom_is_fine():
    good = '{"savedmodel_dir": "/m/café"}'
    assert ModelConfig.from_json(good.encode()).savedmodel_dir == "/m/café"
    assert ModelConfig.from_json(b"\xef\xbb\xbf" + good.encode()).savedmodel_dir == "/m/café"
    assert ModelConfig.from_json("\ufeff" + good).savedmodel_dir == "/m/café"
    assert parse_json(bytearray(b'{"a": 1}'), "x") == {"a": 1}


def test_non_utf8_deployment_file_is_named_as_such(tmp_path):
    path = tmp_path / "deployment.json"
    path.write_bytes(b'{"models": [{"name": "m", "model_config": {"savedmodel_dir": "/\xff"}}]}')
    with pytest.raises(ConfigError, match=r"^deployment config .*: not UTF-8 \(byte 0xff at offset 63\)"):
        DeploymentConfig.from_file(path)
    with pytest.raises(ConfigError, match="^deployment config .*: cannot read"):
        DeploymentConfig.from_file(tmp_path / "missing.json")
    with pytest.raises(ConfigError, match="^deployment config: not UTF-8"):
        DeploymentConfig.from_json(b"\x80{}")


# --- the deployment file is strict too ---------------------------------------------------------

def deployment(**kw):
    doc = {"models": [{"name": "m", "model_config": dict(BASE)}], **kw}
    return DeploymentConfig.from_dict(doc)


@pytest.mark.parametrize("key,value", [
    ("http_port", "8080"), ("grpc_port", True), ("max_request_bytes", 1048576.0),
    ("drain_timeout_seconds", "30"), ("drain_timeout_seconds", float("inf")), ("access_log", "yes"),
    ("enable_docs", 1), ("grpc_max_concurrent_rpcs", "4"), ("host", 0),
])
def test_deployment_wrong_types_are_refused(key, value):
    with pytest.raises(ConfigError) as err:
        deployment(**{key: value})
    assert err.value.message.startswith(key), err.value.message


@pytest.mark.parametrize("entry,key", [
    ({"inference_threads": "2"}, "models[0] 'm'.inference_threads"),
    ({"inference_threads": True}, "models[0] 'm'.inference_threads"),
    ({"max_queued_requests": "2"}, "models[0] 'm'.max_queued_requests"),
    ({"max_queued_requests": -1}, "models[0] 'm'.max_queued_requests"),
    ({"version_labels": {"stable": "1"}}, "models[0] 'm'.version_labels.stable"),
    ({"version_labels": {"stable": True}}, "models[0] 'm'.version_labels.stable"),
    ({"model_config": {**BASE, "session_num": "2"}}, "models[0] 'm'.model_config.session_num"),
])
def test_deployment_model_entries_are_strict(entry, key):
    with pytest.raises(ConfigError) as err:
        DeploymentConfig.from_dict({"models": [{"name": "m", "model_config": dict(BASE), **entry}]})
    assert err.value.message.startswith(key), err.value.message


def test_deployment_good_types_still_pass():
    d = deployment(http_port=0, grpc_port=None, drain_timeout_seconds=5, access_log=False)
    assert d.http_port == 0 and d.drain_timeout_seconds == 5.0


# --- echoes are bounded ------------------------------------------------------------------------

HUGE = "x" * 1_000_000


@pytest.mark.parametrize("overrides,key", [
    ({"session_num": HUGE}, "session_num"),
    ({"signature_name": 7, "select_session_policy": HUGE}, "signature_name"),
    ({"select_session_policy": HUGE}, "select_session_policy"),
    ({"cpusets": HUGE, "use_per_session_threads": True}, "cpusets"),
    ({"cpusets": "0;" + HUGE, "use_per_session_threads": True}, "cpusets"),
    ({"gpu_ids_list": HUGE}, "gpu_ids_list"),
    ({"feature_store_type": "redis", "redis_url": HUGE}, "redis_url"),
    ({"feature_store_type": "redis", "redis_url": "redis://user:secret@" + HUGE + ":x"}, "redis_url"),
    ({"timeline_start_step": 0, "timeline_interval_step": 1, "timeline_trace_count": 1,
      "timeline_path": HUGE}, "timeline_path"),
    ({"model_store_type": "s3", "savedmodel_dir": HUGE}, "savedmodel_dir"),
    ({HUGE: 1}, "xxxx"),
    ({"batching": {"max_batch_size": HUGE}}, "batching.max_batch_size"),
    ({"batching": {HUGE: 1}}, "batching.xxxx"),
])
def test_huge_values_are_echoed_shortened(overrides, key):
    with pytest.raises(ConfigError) as err:
        cfg(**overrides)
    message = err.value.message
    assert message.startswith(key), message[:200]
    assert len(message) <= ECHO_BOUND, len(message)
    assert "secret" not in message


def test_huge_deployment_values_are_echoed_shortened():
    for doc in ({"models": [{"name": HUGE, "model_config": dict(BASE)}]},
                {"models": [{"name": "m", "model_config": dict(BASE)}, {"name": "m", "model_config": HUGE}]},
                {"models": [{"name": "m", "model_config": dict(BASE), "version_labels": {HUGE + "-": 1}}]},
                {"models": [{"name": "m", "model_config": dict(BASE)}], HUGE: 1},
                {"models": [{"name": "m", "model_config": dict(BASE)}], "host": ["x"] * 100_000}):
        with pytest.raises(ConfigError) as err:
            DeploymentConfig.from_dict(doc)
        assert len(err.value.message) <= ECHO_BOUND, err.value.message[:300]


def test_many_problems_are_listed_briefly():
    bad = {key: "x" * 5000 for key in ("session_num", "read_thread_num", "update_thread_num", "lock_timeout",
                                      "inter_op_parallelism_threads", "intra_op_parallelism_threads",
                                      "model_update_inter_threads", "model_update_intra_threads")}
    with pytest.raises(ConfigError) as err:
        cfg(**bad)
    assert len(err.value.message) <= 3 * ECHO_BOUND and "more problem(s)" in err.value.message


def test_shorten_keeps_small_values_whole():
    assert shorten("abc") == "'abc'" and shorten(3) == "3"
    assert shorten("y" * 10_000).endswith("... (10000 characters)")


def test_the_configs_in_the_repository_are_still_accepted():
    # (also covered by test_server_deployment; here to show strictness broke none of them)
    from pathlib import Path

    for path in sorted(Path(__file__).resolve().parents[2].joinpath("configs").glob("*.json")):
        DeploymentConfig.from_dict(json.loads(path.read_text()))


def test_a_removed_deployment_key_says_what_replaced_it():
    with pytest.raises(ConfigError) as err:
        deployment(grpc_max_workers=8)
    assert err.value.message.startswith("grpc_max_workers: removed") and "inference_threads" in err.value.message
