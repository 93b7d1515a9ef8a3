"""The hot-row cache in front of a real redis-server, the feature store metrics and float16 tables,
with the demo CTR model against plain TensorFlow.

* a delta published under load with the cache on: every response equals one published version
  (the old or the new, never a mix, never a stale cached row once the new one serves);
* the store's counters move with the requests and reach ``/metrics``;
* ``embedding_dtype: float16`` in the DRAM, DRAM+SSD and Redis stores: half the bytes a row,
  predictions within ``F16_TOL`` of float32 TensorFlow.
"""

import threading
import time

import numpy as np
import pytest

from conftest import model_config, plain_tf_predict
from processor import codec
from tools.local_redis import LocalRedis, redis_server_binary
from sp_checks import assert_outputs_close
from processor.features.native_rows import AVAILABLE
from unit.features.helpers import copy_model, label, publish_delta, publish_full, read_all, served, store_tables, \
    wait_for

needs_redis = pytest.mark.skipif(redis_server_binary() is None,
                                 reason="redis-server is not installed (scripts/setup.sh installs it)")
# Served logits with float16 tables against float32 TensorFlow: the rows differ by at most
# 2**-11 of their magnitude (measured and reported in model info), the logits by far less.
F16_TOL = dict(rtol=1e-2, atol=2e-3)


def _whole_table_delta(full: dict[str, np.ndarray], step: int, tables=("embeddings/C1", "embeddings/C2")):
    """A delta that changes every row of ``tables`` (so any request reads changed rows) and a
    dense bias; returns (delta tensors, full tensors with the delta applied)."""
    after = {k: v.copy() for k, v in full.items()}
    delta: dict[str, np.ndarray] = {}
    for table in tables:
        rows = np.arange(full[table].shape[0], dtype=np.int64)
        after[table] = -full[table] + 0.125
        delta.update({f"{table}-keys": rows, f"{table}-values": after[table],
                      f"{table}-freqs": np.ones(len(rows), np.int64),
                      f"{table}-versions": np.full(len(rows), step, np.int64)})
    after["mlp/output/bias"] = full["mlp/output/bias"] + 0.25
    for name, value in after.items():
        if not name.startswith("embeddings/"):
            delta[name] = value
    return delta, after


@needs_redis
@pytest.mark.skipif(not AVAILABLE, reason="processor._native is not built (the cache is native)")
def test_delta_under_load_with_the_cache_serves_one_version_per_response(ctr_model_small, redis, tmp_path,
                                                                         make_processor):
    from demo.synthetic_data import synthetic_batch
    from server.metrics import ServerMetrics

    model = copy_model(ctr_model_small, tmp_path / "m")
    feeds = synthetic_batch(32, 31)
    request = codec.encode_request(feeds)
    p = make_processor(model_config(model, feature_store_type="redis", redis_url=redis.url,
                                    file_system_poll_wait_seconds=0.1))
    full = read_all(model.latest_checkpoint_prefix)
    step = model.steps[-1] + 5
    delta, after = _whole_table_delta(full, step)
    old = plain_tf_predict(model.savedmodel_dir, model.latest_checkpoint_prefix, feeds)["logits"]
    new = plain_tf_predict(model.savedmodel_dir, publish_full(tmp_path / "r1", 1, after), feeds)["logits"]
    assert np.abs(old - new).max() > 1e-2  # the versions are told apart
    assert_outputs_close({"logits": served(p, feeds)["logits"]}, {"logits": old})
    results: list[tuple[str, np.ndarray]] = []
    stop = threading.Event()

    def traffic():
        deadline = time.monotonic() + 60
        while not stop.is_set() and time.monotonic() < deadline:
            status, body = p.process(request)
            assert status == 200, body[:300]
            results.append((label(p), codec.decode_response(body)["logits"]))

    senders = [threading.Thread(target=traffic) for _ in range(2)]
    for t in senders:
        t.start()
    try:
        assert wait_for(lambda: len(results) > 20)  # the cache is warm: these rows are cached
        publish_delta(model.run_dir, step, delta)
        assert wait_for(lambda: label(p) == f"{model.steps[-1]}+{step}")
        seen = len(results)
        assert wait_for(lambda: len(results) > seen + 20)
    finally:
        stop.set()
        for t in senders:
            t.join()
    olds = news = 0
    for i, (_, logits) in enumerate(results):
        is_old = np.allclose(logits, old, rtol=1e-5, atol=1e-6)
        is_new = np.allclose(logits, new, rtol=1e-5, atol=1e-6)
        assert is_old or is_new, f"response {i} of {len(results)} is of no published version"
        olds, news = olds + is_old, news + is_new
    assert olds and news
    for _, logits in results[seen:]:  # requests that began after the switch: the new version only
        assert_outputs_close({"logits": logits}, {"logits": new})
    info = store_tables(p).describe()
    assert info["lookups"]["cache_hit_rate"] > 0.5 and info["cache"]["policy"].startswith("CLOCK")
    # The store metrics moved with the requests and reach /metrics.
    text = ServerMetrics(lambda: [p.model]).render().decode()
    hits = [line for line in text.splitlines()
            if line.startswith('sp_feature_store_cache_hits_total{model="default",table="embeddings/C1"')]
    assert hits and float(hits[0].split()[-1]) > 0, hits
    assert 'sp_feature_store_ids_total{model="default",table="embeddings/C1"}' in text
    count = [line for line in text.splitlines() if line.startswith("sp_feature_store_latency_seconds_count")]
    assert count and float(count[0].split()[-1]) >= len(results), count
    assert 'sp_feature_store_redis_errors_total{model="default"} 0.0' in text


def test_store_metrics_move_with_requests_in_the_dram_store(ctr_model_small, make_processor):
    from demo.synthetic_data import synthetic_batch

    p = make_processor(model_config(ctr_model_small, ev_storage_type=1))
    before = p.model.feature_store_metrics()
    served(p, synthetic_batch(8, 3))
    after = p.model.feature_store_metrics()
    assert after["latency"]["count"] == before["latency"]["count"] + 1
    assert after["tables"]["embeddings/C1"]["ids"] == before["tables"].get("embeddings/C1", {"ids": 0})["ids"] + 8


@pytest.mark.parametrize("store", ["dram", "dram_ssd", "redis"])
def test_float16_tables_halve_the_bytes_and_serve_within_tolerance(store, ctr_model_small, tmp_path,
                                                                   make_processor):
    from demo.synthetic_data import synthetic_batch

    if store == "redis" and redis_server_binary() is None:
        pytest.skip("redis-server is not installed")
    feeds = synthetic_batch(64, 11)
    want = plain_tf_predict(ctr_model_small.savedmodel_dir, ctr_model_small.latest_checkpoint_prefix, feeds)
    server = LocalRedis() if store == "redis" else None
    try:
        keys = {"dram": {"ev_storage_type": 1},
                "dram_ssd": {"ev_storage_type": 12, "ev_storage_path": str(tmp_path / "ssd")},
                "redis": {"feature_store_type": "redis", "redis_url": server.url if server else ""}}[store]
        p = make_processor(model_config(ctr_model_small, embedding_dtype="float16", **keys))
        got = served(p, feeds)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], **F16_TOL)
        tables = store_tables(p)
        info = tables.describe()["tables"]["embeddings/C1"]
        rows, dim = info.get("rows") or info["checkpoint_rows"], info["dim"]
        assert info["dtype"] == "float16"
        assert info["float16"]["bytes_saved"] == rows * dim * 2
        assert 0 < info["float16"]["max_abs_diff_from_float32"] < 1e-3
        if store == "dram":
            assert tables.tables["embeddings/C1"].values.itemsize == 2
            assert info["bytes"]["values"] == tables.tables["embeddings/C1"].values.shape[0] * dim * 2
        elif store == "dram_ssd":
            assert info["bytes"]["ssd"] == rows * dim * 2
        else:
            keys_, slots = tables.keys, tables.slots
            field = tables.store.layout.fields(np.array([tables.tids["embeddings/C1"]]), np.array([0]))[0]
            value = next(v for k, s in zip(keys_, slots)
                         if (v := tables.store.nodes.execute([(int(s), ("HGET", k, field))], write=True)[0])
                         is not None)
            assert len(value) == dim * 2 and tables.version.endswith(".f16")
    finally:
        if server is not None:
            server.close()
