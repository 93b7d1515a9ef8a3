"""The CTR model with its embeddings in the in-process stores: DRAM (ev_storage_type 1) and
DRAM+SSD (ev_storage_type 12) with a DRAM budget 4x smaller than the tables; and an
EmbeddingVariable-format checkpoint (raw-id keys, partitions, filtered ids)."""

import numpy as np
import pytest

from conftest import model_config, plain_tf_predict
from sp_checks import assert_outputs_close
from unit.features.helpers import (ID_TABLES, copy_model, label, publish_delta, publish_full, read_all,
                                   row_delta, served, store_tables, wait_for)


@pytest.fixture(scope="module")
def feeds():
    from demo.synthetic_data import synthetic_batch

    return synthetic_batch(64, 21)


@pytest.fixture(scope="module")
def want(ctr_model_small, feeds):
    return plain_tf_predict(ctr_model_small.savedmodel_dir, ctr_model_small.latest_checkpoint_prefix, feeds)


def _close(got, want):
    assert_outputs_close({k: got[k] for k in want}, want, "store-served vs plain TensorFlow")


def test_dram_store_equals_plain_tensorflow_and_takes_deltas(ctr_model_small, feeds, want, tmp_path,
                                                             make_processor):
    model = copy_model(ctr_model_small, tmp_path / "m")
    p = make_processor(model_config(model, ev_storage_type=1, file_system_poll_wait_seconds=0.2))
    _close(served(p, feeds), want)
    info = p.model_info()
    embedding = info["session_group"]["embedding"]
    assert embedding["served_from"] == "feature store" and len(embedding["lookups"]) == 26
    assert embedding["store"]["store"] == "dram" and info["accepted_not_active"] == {}
    # A delta updates rows in the store and dense values in TensorFlow.
    full = read_all(model.latest_checkpoint_prefix)
    delta, after = row_delta(full, model.steps[-1] + 5)
    publish_delta(model.run_dir, model.steps[-1] + 5, delta)
    assert wait_for(lambda: label(p) == f"{model.steps[-1]}+{model.steps[-1] + 5}")
    reference = publish_full(tmp_path / "ref", 1, after)
    _close(served(p, feeds), plain_tf_predict(model.savedmodel_dir, reference, feeds))


def test_dram_ssd_store_with_a_budget_4x_below_the_tables(ctr_model_small, feeds, want, tmp_path,
                                                          make_processor):
    full = read_all(ctr_model_small.latest_checkpoint_prefix)
    table_bytes = sum(v.nbytes for k, v in full.items() if k.startswith("embeddings/"))
    p = make_processor(model_config(ctr_model_small, ev_storage_type=12, ev_storage_path=str(tmp_path / "ssd"),
                                    ev_storage_size=str(table_bytes // 4)))
    for seed in range(3):  # several batches: rows go through the cache and the SSD files
        from demo.synthetic_data import synthetic_batch

        batch = synthetic_batch(256, 100 + seed)
        _close(served(p, batch), plain_tf_predict(ctr_model_small.savedmodel_dir,
                                                  ctr_model_small.latest_checkpoint_prefix, batch))
    _close(served(p, feeds), want)
    tables = store_tables(p).describe()["tables"]
    cache = sum(t["bytes"]["dram_cache"] for t in tables.values())
    assert cache <= table_bytes / 4 + 64 * 1024
    assert sum(t["ssd_reads"] for t in tables.values()) > 0
    assert list((tmp_path / "ssd").rglob("*.rows"))


def _ev_checkpoint(full: dict, feeds, filtered_id: int, partitioned: str) -> dict:
    """``full`` in the EmbeddingVariable export format: id tables keyed by the raw ids of ``feeds``
    (value = the row floormod(id, rows) of the plain table), token tables keyed by bucket."""
    out = {k: v for k, v in full.items() if not k.startswith("embeddings/")}
    ids = feeds["sparse_ids"]
    for i, table in enumerate(ID_TABLES):
        keys = np.unique(ids[:, i])
        values = full[table][np.mod(keys, full[table].shape[0])]
        if table == partitioned:
            half = len(keys) // 2
            for k, sl in enumerate((slice(0, half), slice(half, None))):
                out.update({f"{table}/part_{k}-keys": keys[sl], f"{table}/part_{k}-values": values[sl],
                            f"{table}/part_{k}-freqs": np.full(len(keys[sl]), 3, np.int64),
                            f"{table}/part_{k}-versions": np.full(len(keys[sl]), 7, np.int64)})
            out[f"{table}/part_1-keys_filtered"] = np.array([filtered_id], np.int64)
            out[f"{table}/part_1-freqs_filtered"] = np.array([1], np.int64)
            continue
        out.update({f"{table}-keys": keys, f"{table}-values": values,
                    f"{table}-freqs": np.full(len(keys), 2, np.int64),
                    f"{table}-versions": np.full(len(keys), 5, np.int64)})
    for i in range(21, 27):
        table = f"embeddings/C{i}"
        keys = np.arange(full[table].shape[0], dtype=np.int64)
        out.update({f"{table}-keys": keys, f"{table}-values": full[table]})
    return out


def test_embedding_variable_checkpoint_is_served_by_raw_ids(ctr_model_small, feeds, want, tmp_path,
                                                            make_processor):
    model = copy_model(ctr_model_small, tmp_path / "m")
    full = read_all(model.latest_checkpoint_prefix)
    filtered = 987654321012345
    publish_full(model.run_dir, model.steps[-1] + 100, _ev_checkpoint(full, feeds, filtered, "embeddings/C2"))
    p = make_processor(model_config(model))  # feature_store_type memory: the EV tables go to DRAM
    _close(served(p, feeds), want)
    embedding = p.model_info()["session_group"]["embedding"]
    lookups = {lk["table"]: lk for lk in embedding["lookups"]}
    assert lookups["embeddings/C1"]["keyed_by"] == "raw" and lookups["embeddings/C21"]["keyed_by"] == "raw"
    assert lookups["embeddings/C1"]["key_tensor"].startswith("processor_raw_ids/")
    tables = store_tables(p)
    c2 = tables.tables["embeddings/C2"]
    assert c2.size == len(np.unique(feeds["sparse_ids"][:, 1]))  # both parts merged
    assert tables.describe()["tables"]["embeddings/C2"]["filtered_ids"] == 1
    # A raw id the table does not hold, filtered ones included, gets the default vector; the
    # plain model would have used row floormod(id, rows) instead.
    np.testing.assert_array_equal(tables.lookup([("embeddings/C2", np.array([filtered]))])[0],
                                  np.zeros((1, c2.spec.dim)))
    freqs, versions = c2.metadata(feeds["sparse_ids"][:2, 1])
    assert freqs.tolist() == [3, 3] and versions.tolist() == [7, 7]
    unseen = {k: v[:1] for k, v in feeds.items()}
    unseen["sparse_ids"] = unseen["sparse_ids"] + 1
    rows = [np.mod(unseen["sparse_ids"][0, i], full[t].shape[0]) for i, t in enumerate(ID_TABLES)]
    zeroed = dict(full)
    for t, r in zip(ID_TABLES, rows):
        zeroed[t] = full[t].copy()
        zeroed[t][r] = 0
    reference = publish_full(tmp_path / "ref", 1, zeroed)
    _close(served(p, unseen), plain_tf_predict(model.savedmodel_dir, reference, unseen))
