"""Two processors share one 3-node Redis Cluster: one loads a version, both serve it; a delta is
written into the cluster once and seen by both."""

import threading

import numpy as np
import pytest

from conftest import model_config, plain_tf_predict
from sp_checks import FLOAT_ATOL, FLOAT_RTOL, assert_outputs_close
from tools.local_redis import LocalRedisCluster, redis_server_binary
from unit.features.helpers import copy_model, label, publish_delta, publish_full, read_all, row_delta, served, \
    store_tables, wait_for

pytestmark = pytest.mark.skipif(redis_server_binary() is None,
                                reason="redis-server is not installed (scripts/setup.sh installs it)")


@pytest.fixture
def cluster():
    made = LocalRedisCluster(3)
    yield made
    made.close()


def test_two_processors_share_one_cluster(ctr_model_small, cluster, tmp_path, make_processor):
    from demo.synthetic_data import synthetic_batch

    model = copy_model(ctr_model_small, tmp_path / "m")
    config = model_config(model, feature_store_type="cluster_redis", redis_url=cluster.url,
                          file_system_poll_wait_seconds=0.2, lock_timeout=30)
    first = make_processor(config)
    second = make_processor(config)
    feeds = synthetic_batch(32, 41)
    want = plain_tf_predict(model.savedmodel_dir, model.latest_checkpoint_prefix, feeds)
    for p in (first, second):
        got = served(p, feeds)
        assert_outputs_close({k: got[k] for k in want}, want, "store-served vs plain TensorFlow")
    loaded_by = sorted(p.model_info()["session_group"]["embedding"]["store"]["loaded_by"] for p in (first, second))
    assert loaded_by == ["another replica", "this replica"]
    version = f"run_1-{model.steps[-1]}"
    store = first.manager.features
    assert store.writes_of(version) == 1
    # The partitions spread over the three nodes.
    keys_per_node = [int(s.cli("dbsize")) for s in cluster.servers]
    assert all(k >= 8 for k in keys_per_node), keys_per_node
    # One delta: both processors pick it up; its rows are written once.
    step = model.steps[-1] + 3
    delta, after = row_delta(read_all(model.latest_checkpoint_prefix), step, seed=3)
    publish_delta(model.run_dir, step, delta)
    assert wait_for(lambda: all(label(p) == f"{model.steps[-1]}+{step}" for p in (first, second)), 15)
    assert store.writes_of(version, str(step)) == 1
    assert first.manager.features.counters["deltas_written"] + second.manager.features.counters["deltas_written"] == 1
    want = plain_tf_predict(model.savedmodel_dir, publish_full(tmp_path / "ref", 1, after), feeds)
    errors = []

    def check(p):
        try:
            for _ in range(20):
                got = served(p, feeds)
                np.testing.assert_allclose(got["logits"], want["logits"], rtol=FLOAT_RTOL, atol=FLOAT_ATOL)
        except AssertionError as exc:
            errors.append(str(exc))

    threads = [threading.Thread(target=check, args=(p,)) for p in (first, second, first)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert store_tables(second).stats.lookups > 20
