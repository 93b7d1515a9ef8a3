"""SessionGroup.memory on real models: each part against the bytes computed here independently.

* ONNX Runtime (the DLRM-like ``.onnx`` model): ``weights`` are its initializers' bytes (within
  10%: the few constants under 4 KiB stay in the graph, uncounted); with workers the same bytes
  count in ``shared`` instead (the segment: ``weights.bin`` plus one state page);
* TensorFlow (the toy and the small CTR model): ``weights`` are the variables' bytes as plain
  TensorFlow restores them;
* the CTR model's tables in the DRAM store: ``tables`` is rows x dim x 4 of its embedding tables
  (row-id tables: an identity index, 0 bytes of overhead), ``weights`` the dense variables only;
* Redis (where ``redis-server`` exists): ``caches`` is the hot-row cache's index plus the rows it
  took from the requests, ``tables`` 0.

Every part absent from a model is 0.
"""

from __future__ import annotations

import shutil

import pytest

from conftest import LoadedModel, model_config
from processor.config import ModelConfig
from processor.engine.open_group import open_session_group
from processor.features.feature_store import open_feature_store
from processor.features.row_cache import index_bytes
from processor.memory import PARTS
from processor.store.checkpoint_layout import latest_version
from processor.store.model_store import ModelStore
from processor.store.model_version import ModelVersion


def near(got: int, want: int, share: float = 0.10) -> bool:
    return abs(got - want) <= share * want


def only(counted: dict[str, int], **parts: int) -> None:
    """Every part present; those not named are 0."""
    assert list(counted) == list(PARTS)
    assert {p: v for p, v in counted.items() if p not in parts} == dict.fromkeys(set(PARTS) - set(parts), 0)


@pytest.fixture(scope="module")
def dlrm(tmp_path_factory):
    """The DLRM-like model and its initializers' bytes, read from the file with onnx."""
    import onnx
    from onnx import numpy_helper

    from demo import dlrm_onnx

    directory = tmp_path_factory.mktemp("dlrm_memory")
    dlrm_onnx.build(directory / "model.onnx", rows=2000, dim=8, seed=1)
    model = onnx.load(str(directory / "model.onnx"))
    return directory, sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer)


def _onnx_group(directory):
    config = ModelConfig.from_dict({"savedmodel_dir": str(directory), "backend": "onnxruntime", "session_num": 2,
                                    "use_per_session_threads": True, "intra_op_parallelism_threads": 1})
    return open_session_group(config, ModelVersion(-1, -1, savedmodel_dir=str(directory)))


def test_onnx_weights_are_its_parameters(dlrm):
    directory, true_bytes = dlrm
    group = _onnx_group(directory)
    try:
        counted = group.memory()
        only(counted, weights=counted["weights"])
        assert near(counted["weights"], true_bytes), (counted, true_bytes)
    finally:
        group.close()
    assert group.memory() == dict.fromkeys(PARTS, 0)


def test_onnx_weights_in_a_workers_segment_count_as_shared(dlrm, shm_worker):
    directory, true_bytes = dlrm
    groups = [_onnx_group(directory), _onnx_group(directory)]  # two workers, one segment
    try:
        for group in groups:
            counted = group.memory()
            only(counted, shared=counted["shared"])
            assert near(counted["shared"], true_bytes), (counted, true_bytes)
    finally:
        for group in groups:
            group.close()


def _variable_bytes(paths, prefix) -> dict[str, int]:
    """Every variable's bytes as plain TensorFlow restores it, by name."""
    model = LoadedModel(paths.savedmodel_dir)
    try:
        model.restore(prefix)
        return {name: value.nbytes for name, value in model.variable_values().items()}
    finally:
        model.close()


def _tf_group(paths, **overrides):
    config = ModelConfig.from_dict(model_config(paths, **overrides))
    version = latest_version(ModelStore(), str(paths.savedmodel_dir), str(paths.checkpoint_dir))
    features = open_feature_store(config, "memory_test")
    return open_session_group(config, version, features=features), features


@pytest.mark.parametrize("name", ["toy_model", "ctr_model_small"])
def test_tensorflow_weights_are_its_variables(name, request):
    paths = request.getfixturevalue(name)
    true_bytes = sum(_variable_bytes(paths, paths.latest_checkpoint_prefix).values())
    group, features = _tf_group(paths)
    assert features is None
    try:
        counted = group.memory()
        only(counted, weights=counted["weights"])
        assert near(counted["weights"], true_bytes), (counted, true_bytes)
    finally:
        group.close()


def test_dram_store_counts_its_tables_and_tensorflow_the_dense_rest(ctr_model_small):
    paths = ctr_model_small
    variables = _variable_bytes(paths, paths.latest_checkpoint_prefix)
    group, features = _tf_group(paths, ev_storage_type=1)
    try:
        tables = group.backend._embedding.tables
        specs = tables.specs
        assert len(specs) == 26
        # rows x dim x 4 of each table; row-id keyed tables keep an identity index (0 bytes)
        table_bytes = sum(s.rows * s.dim * 4 for s in specs.values())
        assert all(t.index.identity for t in tables.tables.values())
        dense = sum(v for n, v in variables.items() if n not in specs)
        counted = group.memory()
        only(counted, weights=counted["weights"], tables=counted["tables"])
        assert near(counted["tables"], table_bytes), (counted, table_bytes)
        assert near(counted["weights"], dense), (counted, dense)
    finally:
        group.close()
        features.close()


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server on this machine")
def test_redis_counts_the_hot_row_cache_in_use(ctr_model_small, redis):
    from demo.synthetic_data import synthetic_batch

    paths = ctr_model_small
    group, features = _tf_group(paths, feature_store_type="redis", redis_url=f"redis://{redis.url}/0")
    try:
        cache = group.backend._embedding.tables.cache
        if cache is None:
            pytest.skip("the hot-row cache is native (scripts/build_native.sh)")
        empty = group.memory()
        indexes = sum(index_bytes(cache.capacity_rows(n)) for n in group.backend._embedding.tables.specs)
        only(empty, weights=empty["weights"], caches=indexes)
        feeds = synthetic_batch(64, 5)
        group.run(feeds, tuple(group.signature.outputs))
        rows = sum(c["cached_rows"] * 4 * group.backend._embedding.tables.specs[n].dim
                   for n, c in cache.describe()["tables"].items())
        assert rows > 0
        counted = group.memory()
        assert counted["caches"] == indexes + rows and counted["tables"] == 0
        assert counted["weights"] == empty["weights"]
    finally:
        group.close()
        features.close()
