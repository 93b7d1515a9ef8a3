"""Deltas that remove ids (issue 45): on every store the served ids are the trainer's, exactly.

A trainer keeps two of the CTR model's id tables as hash tables of its own (raw ids, the
EmbeddingVariable export format: :class:`~demo.trainer.writer.CheckpointWriter`'s keyed
tables) and, delta after delta, adds ids, updates rows and removes ids, including a removal and a
re-insert in either order, across deltas and within one. After each delta a real processor
(memory: the EmbeddingVariable tables go to a DRAM store; DRAM; DRAM+SSD; Redis; Redis Cluster;
two workers over one shared segment; two replicas over one Redis) serves exactly the trainer's
ids with the trainer's rows, and each removed id gets the default vector, as an id never seen.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from conftest import LoadedModel, model_config
from tools.local_redis import LocalRedis, LocalRedisCluster, redis_server_binary
from unit.features.helpers import copy_model, label, store_tables, wait_for

KEYED = ("embeddings/C1", "embeddings/C2")
POLL = 0.1


class KeyedTrainer:
    """The CTR model's parameters in a session, C1 and C2 as dicts id -> row that the test
    changes; publishes fulls and deltas with the real writer into the model's run."""

    def __init__(self, model, delta_mode: str, seed: int = 0) -> None:
        from demo.trainer.writer import CheckpointWriter

        self.loaded = LoadedModel(model.savedmodel_dir)
        self.loaded.restore(model.latest_checkpoint_prefix)
        variables = self.loaded.graph.get_collection("variables")
        self.dims = {v.op.name: int(v.shape[1]) for v in variables if v.op.name in KEYED}
        self.rng = np.random.default_rng(seed)
        self.tables: dict[str, dict[int, np.ndarray]] = {name: {} for name in KEYED}
        self.removed: dict[str, set[int]] = {name: set() for name in KEYED}  # ever removed
        for name in KEYED:
            self.add(name, 120)
        self.writer = CheckpointWriter(self.loaded.session, model.run_dir, variables, delta_mode=delta_mode,
                                       keyed_tables={name: partial(self.rows, name) for name in KEYED})
        self.step = model.steps[-1] + 100

    def rows(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """The table now: sorted ids, their rows."""
        keys = np.array(sorted(self.tables[name]), np.int64)
        values = np.array([self.tables[name][k] for k in keys.tolist()], np.float32).reshape(-1, self.dims[name])
        return keys, values

    def _row(self, name: str) -> np.ndarray:
        return self.rng.standard_normal(self.dims[name]).astype(np.float32)

    def add(self, name: str, n: int) -> list[int]:
        ids = [int(i) for i in self.rng.integers(1, 2**62, n)]
        for i in ids:
            self.tables[name][i] = self._row(name)
        return ids

    def put(self, name: str, ids) -> None:
        for i in ids:
            self.tables[name][int(i)] = self._row(name)

    def remove(self, name: str, ids) -> None:
        for i in ids:
            self.tables[name].pop(int(i), None)
            self.removed[name].add(int(i))

    def pick(self, name: str, n: int) -> list[int]:
        held = sorted(self.tables[name])
        return [held[i] for i in self.rng.choice(len(held), n, replace=False)]

    def full(self) -> str:
        self.step += 10
        self.writer.save_full(self.step)
        return str(self.step)

    def delta(self) -> int:
        self.step += 10
        self.writer.save_delta(self.step)
        return self.step

    def close(self) -> None:
        self.loaded.close()


def changes(trainer: KeyedTrainer) -> list:
    """Per delta, what the trainer does to each keyed table before it (each a function of the
    table's name): inserts, updates and removals; re-inserts of removed ids and removals of
    added ones across deltas; a removal and a re-insert, and an insert and a removal, within one
    interval. Inserts never outnumber removals (two workers keep one copy: see the test)."""
    state: dict[str, dict[str, list[int]]] = {name: {} for name in KEYED}

    def first(name):
        s = state[name]
        s["removed"] = trainer.pick(name, 30)
        trainer.remove(name, s["removed"])
        trainer.put(name, trainer.pick(name, 20))  # updates
        s["added"] = trainer.add(name, 25)

    def second(name):
        s = state[name]
        trainer.put(name, s["removed"][:10])  # removed, then inserted again
        trainer.remove(name, s["added"][:12])  # inserted, then removed
        trainer.put(name, trainer.pick(name, 15))

    def third(name):
        s = state[name]
        again = trainer.pick(name, 5)
        trainer.remove(name, again)  # removed and inserted again within one interval
        trainer.put(name, again)
        brief = trainer.add(name, 4)  # inserted and removed within one interval
        trainer.remove(name, brief)
        trainer.remove(name, s["removed"][:5])  # re-inserted at the second delta, removed again
        trainer.put(name, s["added"][:3])  # removed at the second delta, inserted again

    def fourth(name):
        trainer.remove(name, trainer.pick(name, 40))
        trainer.add(name, 10)

    return [first, second, third, fourth]


def check_serves_the_trainers_ids(processor, trainer: KeyedTrainer) -> None:
    tables = store_tables(processor)
    for name in KEYED:
        keys, values = trainer.rows(name)
        np.testing.assert_array_equal(tables.held_ids(name), keys, err_msg=name)
        np.testing.assert_array_equal(tables.lookup([(name, keys)])[0], values, err_msg=name)
        gone = np.array(sorted(trainer.removed[name] - set(trainer.tables[name])), np.int64)
        np.testing.assert_array_equal(tables.lookup([(name, gone)])[0], np.zeros((len(gone), trainer.dims[name])))


def run_chain(trainer: KeyedTrainer, processors: list, full: str) -> None:
    """Apply every change, publish a delta after each, and check every processor serves it."""
    for processor in processors:
        assert wait_for(lambda p=processor: label(p) == full, 60), label(processor)
        check_serves_the_trainers_ids(processor, trainer)
    for change in changes(trainer):
        for name in KEYED:
            change(name)
        step = trainer.delta()
        for processor in processors:
            assert wait_for(lambda p=processor: label(p) == f"{full}+{step}", 60), \
                processor.model_info()["failed_versions"]
            check_serves_the_trainers_ids(processor, trainer)


@pytest.fixture
def trainer_for(ctr_model_small, tmp_path):
    made = []

    def make(delta_mode: str):
        model = copy_model(ctr_model_small, tmp_path / "m")
        trainer = KeyedTrainer(model, delta_mode)
        made.append(trainer)
        return model, trainer

    yield make
    for trainer in made:
        trainer.close()


STORES = {
    "memory": {},  # the EmbeddingVariable-format tables go to a DRAM store of their own
    "dram": {"ev_storage_type": 1},
    "dram_ssd": {"ev_storage_type": 12, "ev_storage_size": "20000"},  # a DRAM cache of ~100 rows
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("delta_mode", ["chain", "cumulative"])
@pytest.mark.parametrize("store", sorted(STORES))
def test_local_stores_serve_the_trainers_ids(trainer_for, tmp_path, make_processor, store, delta_mode):
    model, trainer = trainer_for(delta_mode)
    full = trainer.full()
    keys = {**STORES[store], **({"ev_storage_path": str(tmp_path / "ssd")} if store == "dram_ssd" else {})}
    p = make_processor(model_config(model, file_system_poll_wait_seconds=POLL, delta_mode=delta_mode, **keys))
    run_chain(trainer, [p], full)
    counted = p.model_info()["session_group"]["embedding"]["store"]["tables"]["embeddings/C1"]
    assert counted["rows"] == len(trainer.tables["embeddings/C1"])


@pytest.fixture(params=[False, True], ids=["redis", "cluster_redis"])
def redis_server(request):
    """One redis-server, or a 3-node Redis Cluster (request before make_processor: it stops
    after the processors)."""
    if redis_server_binary() is None:
        pytest.skip("redis-server is not installed (scripts/setup.sh installs it)")
    server = LocalRedisCluster(3) if request.param else LocalRedis()
    server.kind = "cluster_redis" if request.param else "redis"
    yield server
    server.close()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("delta_mode", ["chain", "cumulative"])
def test_two_replicas_over_redis_serve_the_trainers_ids(trainer_for, redis_server, make_processor, delta_mode):
    """Two replicas share one Redis (or a 3-node cluster): one writes each delta, both serve it,
    and the hot-row cache of each (filled with every id before each delta) forgets the removed ids."""
    model, trainer = trainer_for(delta_mode)
    full = trainer.full()
    config = model_config(model, file_system_poll_wait_seconds=POLL, delta_mode=delta_mode, lock_timeout=30,
                          feature_store_type=redis_server.kind, redis_url=redis_server.url)
    replicas = [make_processor(config), make_processor(config)]
    run_chain(trainer, replicas, full)
    assert sum(p.manager.features.counters["deltas_written"] for p in replicas) == len(changes(trainer))
    assert sum(p.manager.features.counters["rows_deleted"] for p in replicas) > 0
    for p in replicas:  # each replica counts the ids the deltas it applied removed
        assert p.manager.features.metrics.snapshot()["tables"]["embeddings/C1"]["removed"] > 0


@pytest.mark.timeout(300)
def test_two_workers_serve_the_trainers_ids_from_one_copy(trainer_for, shm_worker, make_processor):
    """Two workers of one server (this process made a worker twice over: the second maps the
    segment the first published) apply each delta themselves; deltas that remove as many ids as
    they add reuse the freed rows, so the tables stay in the one shared segment."""
    model, trainer = trainer_for("chain")
    full = trainer.full()
    config = model_config(model, file_system_poll_wait_seconds=POLL, delta_mode="chain", ev_storage_type=1)
    workers = [make_processor(config), make_processor(config)]
    infos = [store_tables(w).describe()["shared_memory"] for w in workers]
    assert infos[0]["path"] == infos[1]["path"] and {i["created_here"] for i in infos} == {True, False}
    run_chain(trainer, workers, full)
    for worker in workers:
        tables = store_tables(worker)
        for name in KEYED:
            table = tables.tables[name]
            assert tables.shared.holds(table.values) and tables.shared.holds(table.index.buffers()[0]), name


def _hitting(feeds: dict[str, np.ndarray], evicted: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``feeds`` whose id columns look up the evicted rows (column i feeds table C<i+1>, row
    floormod(id, rows): an id below the table's rows is its row)."""
    from unit.features.helpers import ID_TABLES

    out = {k: v.copy() for k, v in feeds.items()}
    n = len(out["sparse_ids"])
    for i, table in enumerate(ID_TABLES):
        rows = evicted.get(table)
        if rows is not None and len(rows):
            out["sparse_ids"][:, i] = rows[np.arange(n) % len(rows)]
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("delta_mode", ["chain", "cumulative"])
@pytest.mark.parametrize("backend", ["tensorflow", "onnxruntime"])
def test_engine_resident_tables_reset_the_removed_rows(ctr_model_small, tmp_path, make_processor, backend,
                                                       delta_mode):
    """TensorFlow variables and ONNX initializers have no absent row: a delta's removed rows are
    reset to zeros (the trainer resets the rows it evicts too), so the processor keeps answering
    as the trainer does, on requests that look the evicted rows up."""
    from demo.streaming_trainer import StreamingTrainer
    from demo.synthetic_data import synthetic_batch
    from unit.features.helpers import served

    model = copy_model(ctr_model_small, tmp_path / "m")
    trainer = StreamingTrainer(model.out_dir, delta_mode=delta_mode, evict_per_delta=6)
    try:
        p = make_processor(model_config(model, backend=backend, delta_mode=delta_mode, use_per_session_threads=True,
                                        file_system_poll_wait_seconds=POLL))
        for k in range(3):
            trainer.train(3)
            trainer.save_delta()
            assert trainer.evicted and all(len(r) for r in trainer.evicted.values())
            assert wait_for(lambda: label(p) == f"{model.steps[-1]}+{trainer.step}", 60), \
                p.model_info()["failed_versions"]
            feeds = _hitting(synthetic_batch(12, 60 + k), trainer.evicted)
            np.testing.assert_allclose(served(p, feeds)["logits"], trainer.predict(feeds)["logits"],
                                       rtol=1e-5, atol=1e-5)
            if backend == "onnxruntime":  # the initializers themselves: the evicted rows are zeros
                backend_of = p.manager._current.group.backend
                for table, rows in trainer.evicted.items():
                    np.testing.assert_array_equal(backend_of.read_parameter(table)[rows], 0)
    finally:
        trainer.close()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("store", ["memory", "dram_ssd"])
def test_rows_not_updated_for_row_ttl_steps_are_dropped_at_the_next_delta(trainer_for, tmp_path, make_processor,
                                                                          store):
    """``row_ttl_steps``: at a delta of step S the rows last updated before S - ttl go, as if the
    delta removed them (served the default vector, counted as expired); the trainer's other rows
    stay. Steps are 10 apart here, the ttl 25: a row lives two deltas past its last update."""
    model, trainer = trainer_for("chain")
    full = trainer.full()
    last = {name: dict.fromkeys(trainer.tables[name], trainer.step) for name in KEYED}  # id -> last update
    keys = {**STORES[store], **({"ev_storage_path": str(tmp_path / "ssd")} if store == "dram_ssd" else {})}
    p = make_processor(model_config(model, file_system_poll_wait_seconds=POLL, delta_mode="chain",
                                    row_ttl_steps=25, **keys))
    assert wait_for(lambda: label(p) == full, 60)
    held, expired = set(last["embeddings/C1"]), 0
    for _ in range(4):
        updated = {name: trainer.pick(name, 20) for name in KEYED}
        for name in KEYED:
            trainer.put(name, updated[name])
        step = trainer.delta()
        for name in KEYED:
            last[name].update(dict.fromkeys(updated[name], step))
        assert wait_for(lambda: label(p) == f"{full}+{step}", 60), p.model_info()["failed_versions"]
        tables = store_tables(p)
        for name in KEYED:
            live = sorted(i for i, at in last[name].items() if at >= step - 25)
            np.testing.assert_array_equal(tables.held_ids(name), live, err_msg=name)
            dropped = np.array(sorted(set(last[name]) - set(live)), np.int64)
            np.testing.assert_array_equal(tables.lookup([(name, dropped)])[0], np.zeros((len(dropped), trainer.dims[name])))
        live = set(tables.held_ids("embeddings/C1").tolist())  # held, or written by the delta, and gone now
        expired, held = expired + len((held | set(updated["embeddings/C1"])) - live), live
    described = p.model_info()["session_group"]["embedding"]["store"]["tables"]["embeddings/C1"]
    assert described["expired_rows"] == expired > 0


def test_row_ttl_steps_needs_a_store_that_keeps_each_rows_step(ctr_model_small, make_processor):
    from processor.errors import ConfigError

    with pytest.raises(Exception, match="row_ttl_steps"):  # refused by the config check
        make_processor(model_config(ctr_model_small, row_ttl_steps=5, feature_store_type="redis",
                                    redis_url="redis://127.0.0.1:1"))
    with pytest.raises(ConfigError, match="row_ttl_steps"):  # plain variables stay TensorFlow's
        make_processor(model_config(ctr_model_small, row_ttl_steps=5))
