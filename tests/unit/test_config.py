import pytest

from processor.config import ModelConfig, parse_cpusets
from processor.errors import ConfigError, StatusCode

BASE = {"savedmodel_dir": "/models/sm"}


def cfg(**kw):
    return ModelConfig.from_dict({**BASE, **kw})


def test_defaults_follow_deeprec():
    c = cfg()
    assert c.session_num == 1
    assert c.select_session_policy == "MOD"
    assert c.use_per_session_threads is False
    assert c.signature_name == "serving_default"
    assert c.feature_store_type == "memory"
    assert c.read_thread_num == 4 and c.update_thread_num == 2
    assert c.lock_timeout == 900
    assert c.model_update_inter_threads == 0
    assert c.inter_op_parallelism_threads >= 1
    assert c.checkpoint_dir is None
    assert c.not_yet_active() == {}


def test_full_deeprec_demo_config_is_accepted():
    c = ModelConfig.from_json("""{
        "omp_num_threads": 4, "kmp_blocktime": 0, "feature_store_type": "memory",
        "serialize_protocol": "protobuf", "inter_op_parallelism_threads": 10,
        "intra_op_parallelism_threads": 10, "init_timeout_minutes": 1,
        "signature_name": "serving_default", "read_thread_num": 4, "update_thread_num": 1,
        "model_store_type": "local", "checkpoint_dir": "/tmp/checkpoint/",
        "savedmodel_dir": "/tmp/saved_model/"}""")
    assert c.inter_op_parallelism_threads == 10
    assert c.omp_num_threads == 4 and c.kmp_blocktime == 0


@pytest.mark.parametrize("text,groups", [
    ("0-3;4-7", ((0, 1, 2, 3), (4, 5, 6, 7))),
    ("0,1;2,3", ((0, 1), (2, 3))),
    ("3;4-6", ((3,), (4, 5, 6))),
    ("1-3,5;0", ((1, 2, 3, 5), (0,))),
])
def test_cpusets_forms(text, groups):
    assert parse_cpusets(text) == groups
    assert cfg(cpusets=text, session_num=len(groups), use_per_session_threads=True).cpusets == groups


@pytest.mark.parametrize("overrides,key", [
    ({"session_num": "abc"}, "session_num"),
    ({"session_num": 0}, "session_num"),
    ({"session_num": 2.5}, "session_num"),
    ({"select_session_policy": "RANDOM"}, "select_session_policy"),
    ({"use_per_session_threads": "maybe"}, "use_per_session_threads"),
    ({"cpusets": "0-a"}, "cpusets"),
    ({"cpusets": "3-1"}, "cpusets"),
    ({"cpusets": "0;;1", "session_num": 3}, "cpusets"),
    ({"cpusets": "0-1;2-3", "session_num": 1}, "cpusets"),
    ({"cpusets": 5}, "cpusets"),
    ({"gpu_ids_list": "0,x"}, "gpu_ids_list"),
    ({"gpu_ids_list": "0,0"}, "gpu_ids_list"),
    ({"use_multi_stream": []}, "use_multi_stream"),
    ({"enable_device_placement_optimization": "sometimes"}, "enable_device_placement_optimization"),
    ({"enable_inline_execute": {}}, "enable_inline_execute"),
    ({"omp_num_threads": "many"}, "omp_num_threads"),
    ({"kmp_blocktime": -3}, "kmp_blocktime"),
    ({"feature_store_type": "dynamo"}, "feature_store_type"),
    ({"feature_store_type": "redis"}, "redis_url"),
    ({"read_thread_num": 0}, "read_thread_num"),
    ({"read_thread_num": 97}, "read_thread_num"),
    ({"update_thread_num": 17}, "update_thread_num"),
    ({"serialize_protocol": "flatbuffer"}, "serialize_protocol"),
    ({"inter_op_parallelism_threads": -1}, "inter_op_parallelism_threads"),
    ({"intra_op_parallelism_threads": "x"}, "intra_op_parallelism_threads"),
    ({"model_update_inter_threads": -2}, "model_update_inter_threads"),
    ({"model_update_intra_threads": "two"}, "model_update_intra_threads"),
    ({"init_timeout_minutes": "soon"}, "init_timeout_minutes"),
    ({"signature_name": ""}, "signature_name"),
    ({"warmup_file_name": 3}, "warmup_file_name"),
    ({"model_store_type": "oss"}, "savedmodel_dir"),
    ({"model_store_type": "oss", "savedmodel_dir": "oss://b/sm"}, "oss_endpoint"),
    ({"checkpoint_dir": 7}, "checkpoint_dir"),
    ({"savedmodel_dir": ""}, "savedmodel_dir"),
    ({"timeline_start_step": 1}, "timeline_interval_step"),
    ({"timeline_start_step": 0, "timeline_interval_step": 1, "timeline_trace_count": 1,
      "timeline_path": "relative/dir"}, "timeline_path"),
    ({"timeline_interval_step": 0}, "timeline_interval_step"),
    ({"ev_storage_type": 14}, "ev_storage_type"),
    ({"ev_storage_type": 12}, "ev_storage_path"),
    ({"ev_storage_size": "1,-5"}, "ev_storage_size"),
    ({"shard_embedding": True}, "embedding_names"),
    ({"lock_timeout": 0}, "lock_timeout"),
    ({"backend": "pytorch"}, "backend"),
    ({"restore_model_version": -4}, "restore_model_version"),
    ({"file_system_poll_wait_seconds": "often"}, "file_system_poll_wait_seconds"),
    ({"redis_url": 6379}, "redis_url"),
    ({"sesion_num": 2}, "sesion_num"),
])
def test_bad_value_names_the_key(overrides, key):
    with pytest.raises(ConfigError) as err:
        cfg(**overrides)
    assert err.value.message.startswith(key), err.value.message
    assert err.value.code == StatusCode.INVALID_ARGUMENT


def test_unknown_key_suggests_the_close_one():
    with pytest.raises(ConfigError, match="did you mean 'session_num'"):
        cfg(sesion_num=2)


def test_missing_savedmodel_dir():
    with pytest.raises(ConfigError, match="^savedmodel_dir"):
        ModelConfig.from_dict({"session_num": 1})


@pytest.mark.parametrize("text", ["", "   ", "{not json", "[1, 2]", "3"])
def test_not_a_json_object(text):
    with pytest.raises(ConfigError, match="model_config"):
        ModelConfig.from_json(text)


def test_foreign_deeprec_keys_are_accepted_and_reported():
    raw = {**BASE, "processor": "tensorflow_cpu_1.15", "warm_up_data_path": "/w"}
    c = ModelConfig.from_dict(raw)
    assert c.foreign_keys(raw) == ["processor", "warm_up_data_path"]


def test_deeprec_keys_with_nothing_to_apply_are_validated_and_reported():
    # DeepRec's separate intra-op pool for updates needs its TensorFlow fork: the key is checked
    # with DeepRec's type (test_bad_value_names_the_key) and listed with the foreign keys.
    raw = {**BASE, "model_update_intra_threads": 2, "model_update_inter_threads": 2}
    c = ModelConfig.from_dict(raw)
    assert c.foreign_keys(raw) == ["model_update_intra_threads"]
    assert c.foreign_keys(BASE) == []


def test_later_features_are_reported_not_active():
    inactive = cfg(shard_embedding=True, embedding_names="C1", shard_instance_count=2, id_type="int64",
                   session_num=2).not_yet_active()
    assert inactive == {"shard_embedding": "embedding sharding"}
    assert cfg(ev_storage_type=12, ev_storage_path="/ssd").not_yet_active() == {}


def test_local_and_memory_feature_store():
    assert cfg(feature_store_type="local").feature_store_type == "local"
    assert cfg(feature_store_type="memory").feature_store_type == "memory"


def test_redacted_hides_secrets():
    c = cfg(model_store_type="oss", savedmodel_dir="oss://bucket/sm", oss_endpoint="e",
            oss_access_id="id", oss_access_key="secret")
    red = c.redacted()
    assert red["oss_access_key"] == "***" and "secret" not in str(red)


def test_config_is_immutable():
    c = cfg()
    with pytest.raises(Exception):
        c.session_num = 3


def test_batching_settings_are_typed_and_checked():
    config = ModelConfig.from_dict({"savedmodel_dir": "/m", "batching": {
        "max_batch_size": 32, "batch_timeout_micros": 500, "allowed_batch_sizes": [8, 16, 32]}})
    assert config.batching.allowed_batch_sizes == (8, 16, 32) and config.batching.padded_rows(9) == 16
    assert ModelConfig.from_dict({"savedmodel_dir": "/m"}).batching is None  # off by default
    for bad, key in (({"max_batch_size": "32"}, "batching.max_batch_size"),
                     ({"num_batch_threads": True}, "batching.num_batch_threads"),
                     ({"pad_variable_length_inputs": 1}, "batching.pad_variable_length_inputs"),
                     ({"max_batch_size": 0}, "batching.max_batch_size"),
                     ({"batch_timout_micros": 5}, "batching.batch_timout_micros"),
                     ({"allowed_batch_sizes": [8, 4, 32], "max_batch_size": 32}, "allowed_batch_sizes"),
                     ({"allowed_batch_sizes": [8, 16]}, "must equal max_batch_size")):
        with pytest.raises(ConfigError, match=key):
            ModelConfig.from_dict({"savedmodel_dir": "/m", "batching": bad})
