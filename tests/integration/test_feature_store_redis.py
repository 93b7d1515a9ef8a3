"""The CTR model with its embeddings in a real redis-server on 127.0.0.1: equal to plain
TensorFlow, deltas written into Redis, a new full version loaded beside the served one."""

import numpy as np
import pytest

from conftest import model_config, plain_tf_predict
from tools.local_redis import redis_server_binary
from sp_checks import assert_outputs_close
from unit.features.helpers import copy_model, label, publish_delta, publish_full, read_all, row_delta, served, \
    store_tables, wait_for

pytestmark = pytest.mark.skipif(redis_server_binary() is None,
                                reason="redis-server is not installed (scripts/setup.sh installs it)")


def test_redis_store_serves_updates_and_swaps_versions(ctr_model_small, redis, tmp_path, make_processor):
    from demo.synthetic_data import synthetic_batch

    model = copy_model(ctr_model_small, tmp_path / "m")
    feeds = synthetic_batch(64, 31)
    p = make_processor(model_config(model, feature_store_type="redis", redis_url=f"redis://{redis.url}/0",
                                    read_thread_num=2, update_thread_num=2, file_system_poll_wait_seconds=0.2))
    assert_outputs_close(served(p, feeds), plain_tf_predict(model.savedmodel_dir, model.latest_checkpoint_prefix, feeds))
    info = p.model_info()
    assert info["feature_store"]["type"] == "redis" and info["feature_store"]["loads_written"] == 1
    assert info["session_group"]["embedding"]["store"]["loaded_by"] == "this replica"
    assert int(redis.cli("dbsize")) >= 32 + 1  # 32 partition hashes + meta
    # Delta: rows upserted into Redis (and dense values into TF).
    full = read_all(model.latest_checkpoint_prefix)
    step = model.steps[-1] + 5
    delta, after = row_delta(full, step)
    publish_delta(model.run_dir, step, delta)
    assert wait_for(lambda: label(p) == f"{model.steps[-1]}+{step}")
    assert_outputs_close(served(p, feeds), plain_tf_predict(model.savedmodel_dir, publish_full(tmp_path / "r1", 1, after), feeds))
    assert p.model_info()["feature_store"]["deltas_written"] == 1
    # A new full version: loaded beside the served one (new keys), then swapped in.
    newer = {k: (v * 1.5 if k.startswith("embeddings/") else v) for k, v in full.items()}
    new_prefix = publish_full(model.run_dir, step + 10, newer)
    assert wait_for(lambda: label(p) == str(step + 10))
    assert_outputs_close(served(p, feeds), plain_tf_predict(model.savedmodel_dir, new_prefix, feeds))
    versions = redis.cli("hkeys", "sp1:{default}:meta").split()
    assert f"v:run_1-{step + 10}" in versions and f"v:run_1-{model.steps[-1]}" in versions
    tables = store_tables(p)
    assert tables.version == f"run_1-{step + 10}" and tables.stats.lookups >= 1
