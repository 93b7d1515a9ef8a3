"""The trainer-side writer's removals (issue 45): its deltas, read back as the processor reads
them and applied in order (chain) or alone onto any earlier version (cumulative), give exactly
the trainer's tables, after inserts, updates, removals and re-inserts in either order."""

from __future__ import annotations

import numpy as np
import pytest

from demo.trainer.writer import CheckpointWriter
from processor.checkpoint.delta import PARENT_TENSOR, WRITTEN_AT_TENSOR, VariableInfo, read_delta
from processor.checkpoint.tensor_file import read_tensors
from processor.features.ev_checkpoint import TableSource, read_store_delta

DIM = 4


class Trainer:
    """A graph with a 2-D variable table ``emb`` (20 rows, looked up by a gather) and a dense
    ``w``; a keyed table ``kt`` the test edits as a dict."""

    def __init__(self, run_dir, delta_mode: str) -> None:
        import tensorflow as tf

        self.graph = tf.Graph()
        with self.graph.as_default():
            self.emb = tf.compat.v1.get_variable("emb", [20, DIM], use_resource=True)
            self.w = tf.compat.v1.get_variable("w", [DIM, 1], use_resource=True)
            stand_in = tf.compat.v1.get_variable("kt", [1, DIM], use_resource=True)  # left out: keyed
            ids = tf.compat.v1.placeholder(tf.int64, [None])
            tf.matmul(tf.nn.embedding_lookup(self.emb, ids) + tf.nn.embedding_lookup(stand_in, ids * 0), self.w)
            self.rows = tf.compat.v1.placeholder(tf.int64, [None])
            self.values = tf.compat.v1.placeholder(tf.float32, [None, DIM])
            self.scatter = tf.raw_ops.ResourceScatterUpdate(resource=self.emb.handle, indices=self.rows,
                                                            updates=self.values)
            init = tf.compat.v1.global_variables_initializer()
        self.session = tf.compat.v1.Session(graph=self.graph)
        self.session.run(init)
        self.rng = np.random.default_rng(1)
        self.kt = {int(i): self.rng.standard_normal(DIM).astype(np.float32) for i in range(100, 130)}
        self.writer = CheckpointWriter(self.session, run_dir, [self.emb, self.w, stand_in], delta_mode=delta_mode,
                                       keyed_tables={"kt": self.keyed})

    def keyed(self):
        keys = np.array(sorted(self.kt), np.int64)
        return keys, np.array([self.kt[k] for k in keys.tolist()], np.float32).reshape(-1, DIM)

    def set_rows(self, rows, values=None) -> None:
        rows = np.asarray(rows, np.int64)
        if values is None:
            values = self.rng.standard_normal((len(rows), DIM)).astype(np.float32)
        self.session.run(self.scatter, {self.rows: rows, self.values: values})

    def emb_value(self) -> np.ndarray:
        return self.session.run(self.emb)

    def put(self, ids) -> None:
        for i in ids:
            self.kt[int(i)] = self.rng.standard_normal(DIM).astype(np.float32)

    def drop(self, ids) -> None:
        for i in ids:
            self.kt.pop(int(i))


def served_state(full: str, deltas: list[str]) -> tuple[dict[int, np.ndarray], np.ndarray]:
    """(``kt`` as a feature store serves it, ``emb`` as an engine-resident variable: removed rows
    reset to zeros, see test_read_delta_resets_removed_rows) after the full and ``deltas`` in
    order, read the processor's way."""
    kt = {}
    for _, chunk in TableSource(full).rows({"kt": None}):
        kt.update(zip(chunk.keys.tolist(), chunk.values))
    emb = read_tensors(full)["emb"].copy()
    for prefix in deltas:
        delta = read_store_delta(prefix, 0, {"kt": DIM, "emb": DIM}, {"w": VariableInfo((DIM, 1), np.dtype(np.float32))})
        for i in delta.removed.get("kt", ()):
            kt.pop(int(i), None)
        emb[delta.removed.get("emb", np.empty(0, np.int64))] = 0
        for table, chunk in delta.chunks.items():
            if table == "kt":
                kt.update(zip(chunk.keys.tolist(), chunk.values))
            else:
                emb[chunk.keys] = chunk.values
    return kt, emb


def check(trainer: Trainer, kt: dict[int, np.ndarray], emb: np.ndarray, evicted: set[int]) -> None:
    assert sorted(kt) == sorted(trainer.kt)
    for k, v in trainer.kt.items():
        np.testing.assert_array_equal(kt[k], v)
    want = trainer.emb_value()
    want[sorted(evicted)] = 0  # removed rows of a fixed-size table are served as zeros
    np.testing.assert_array_equal(emb, want)


@pytest.mark.parametrize("delta_mode", ["chain", "cumulative"])
def test_deltas_bring_every_version_to_the_trainers_tables(tmp_path, delta_mode):
    trainer = Trainer(tmp_path / "run", delta_mode)
    full = str(trainer.writer.save_full(1))
    assert {"kt-keys", "kt-values", WRITTEN_AT_TENSOR} <= set(read_tensors(full)) and "kt" not in read_tensors(full)
    evicted: set[int] = set()
    steps = [
        # add 3, update 2, remove 4 keyed ids; evict emb rows 0-2 (reset to zeros by the trainer)
        lambda: (trainer.put([1, 2, 3]), trainer.put([100, 101]), trainer.drop([102, 103, 104, 105]),
                 trainer.set_rows([0, 1, 2], np.zeros((3, DIM), np.float32)), {"emb": [0, 1, 2]}),
        # re-insert two removed ids, remove one added: removal then insert, insert then removal
        lambda: (trainer.put([102, 103]), trainer.drop([1]), trainer.set_rows([1]), {}),  # emb row 1 trained again
        # within one interval: remove and re-insert 106; insert and remove 7
        lambda: (trainer.drop([106]), trainer.put([106]), trainer.put([7]), trainer.drop([7]), trainer.drop([2]),
                 trainer.set_rows([5], np.zeros((1, DIM), np.float32)), {"emb": [5]}),
        lambda: (trainer.put([1, 104]), trainer.drop([100]), {}),
    ]
    published: list[str] = []
    for k, change in enumerate(steps):
        removed = change()[-1]
        evicted |= set(removed.get("emb", ()))
        evicted -= {1} if k == 1 else set()
        published.append(str(trainer.writer.save_delta(10 + k, removed={t: np.array(r) for t, r in removed.items()})))
        tensors = read_tensors(published[-1])
        assert int(tensors[PARENT_TENSOR]) == (10 + k - 1 if delta_mode == "chain" and k else 1)
        assert float(tensors[WRITTEN_AT_TENSOR]) > 0
        if delta_mode == "chain":  # every link in order
            check(trainer, *served_state(full, published), evicted)
        else:  # the newest alone, onto the full or onto any earlier version
            for earlier in [[], *([p] for p in published[:-1])]:
                check(trainer, *served_state(full, earlier + published[-1:]), evicted)


def test_read_delta_resets_removed_rows(tmp_path):
    """An engine-resident table (fixed size) resets a removed row to zeros; an id the delta also
    writes keeps the delta's row (removals come first)."""
    from processor.checkpoint.tensor_file import write_tensors

    prefix = str(tmp_path / "d")
    write_tensors(prefix, {"emb-keys": np.array([3], np.int64), "emb-values": np.ones((1, DIM), np.float32),
                           "emb-removed_keys": np.array([7, 3, 7], np.int64), "w": np.zeros((DIM, 1), np.float32),
                           WRITTEN_AT_TENSOR: np.array(12.5)})
    delta = read_delta(prefix, 5, {"emb": VariableInfo((20, DIM), np.dtype(np.float32)),
                                   "w": VariableInfo((DIM, 1), np.dtype(np.float32))})
    keys, values = delta.rows["emb"]
    assert keys.tolist() == [7, 3] and delta.removed["emb"].tolist() == [3, 7] and delta.written_at == 12.5
    np.testing.assert_array_equal(values, [[0] * DIM, [1] * DIM])
    write_tensors(prefix + "x", {"emb-removed_keys": np.array([20], np.int64)})
    with pytest.raises(Exception, match="outside"):
        read_delta(prefix + "x", 5, {"emb": VariableInfo((20, DIM), np.dtype(np.float32))})


def test_a_keyed_table_named_removed_while_held_is_refused(tmp_path):
    trainer = Trainer(tmp_path / "run", "chain")
    trainer.writer.save_full(1)
    with pytest.raises(ValueError, match="still holds"):
        trainer.writer.save_delta(2, removed={"kt": np.array([100])})
    with pytest.raises(ValueError, match="no tables"):
        trainer.writer.save_delta(2, removed={"w": np.array([0])})
