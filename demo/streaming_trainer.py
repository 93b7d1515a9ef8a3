"""Streaming training of the demo CTR model: keeps training on fresh synthetic data and writes
a full checkpoint every F seconds and a delta every D seconds (processor.checkpoint layout).

    python -m demo.streaming_trainer --model-dir artifacts/demo --full-every 20 --delta-every 2 \
        --duration 60 [--evict-per-delta 32]

The trainer resumes from the newest full checkpoint of the model's run directory and continues
the step count from there. It is what a user's training job does; the processor picks up each
checkpoint while serving. Not thread-safe: one trainer per run directory.

**Evictions** (``evict_per_delta``, DeepRec's feature eviction in miniature): before each delta
the trainer evicts, in every embedding table, up to that many rows that no training step changed
since the previous checkpoint (cold ids): it resets them to zeros and names them to the writer,
whose delta then removes them (``<table>-removed_keys``). The processor resets them too (or drops
them from a feature store), so it keeps answering as the trainer does; a row trained again later
comes back in a later delta. Each checkpoint also carries the time it was written, which the
processor's freshness metrics (``sp_model_data_age_seconds``) read.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import tensorflow as tf

from demo.ctr_network import build_ctr_network
from demo.ctr_spec import get_preset
from demo.layout import read_model_card, read_model_paths
from demo.synthetic_data import synthetic_labeled_batch
from demo.trainer.writer import CheckpointWriter, embedding_tables

_STREAM = 3  # seed stream of streaming batches; differs from the build's train/eval streams


class StreamingTrainer:
    """Continues training a built CTR model and publishes full and delta checkpoints."""

    def __init__(self, model_dir: Path, seed: int = 0, delta_mode: str = "cumulative",
                 evict_per_delta: int = 0) -> None:
        card = read_model_card(Path(model_dir))
        if card is None:
            raise FileNotFoundError(f"{model_dir} holds no built demo model (model_card.json)")
        self.spec = get_preset(card["preset"])
        self.paths = read_model_paths(Path(model_dir))
        self.seed = seed
        self.graph = tf.Graph()
        with self.graph.as_default():
            self.network = build_ctr_network(self.spec)
            self.labels = tf.compat.v1.placeholder(tf.float32, [None, 1])
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
                labels=self.labels, logits=self.network.outputs["logits"]))
            self.train_op = tf.compat.v1.train.AdagradOptimizer(self.spec.learning_rate).minimize(loss)
            init = tf.compat.v1.global_variables_initializer()
            restore = tf.compat.v1.train.Saver(self.network.model_variables)
            self._evict_rows = tf.compat.v1.placeholder(tf.int64, [None])
            self._table_vars = {v.op.name: v for v in embedding_tables(self.network.model_variables)}
            self._evict = {name: tf.raw_ops.ResourceScatterUpdate(  # the rows set to zeros
                resource=table.handle, indices=self._evict_rows,
                updates=tf.zeros(tf.stack([tf.size(self._evict_rows), int(table.shape[1])])))
                for name, table in self._table_vars.items()}
        self.session = tf.compat.v1.Session(graph=self.graph)
        self.session.run(init)
        with self.graph.as_default():  # Saver.restore needs graph mode
            restore.restore(self.session, str(self.paths.latest_checkpoint_prefix))
        self.step = self.paths.steps[-1]
        self.writer = CheckpointWriter(self.session, self.paths.run_dir, self.network.model_variables,
                                       delta_mode=delta_mode)
        # Deltas are relative to the full the trainer started from: its values are the baseline.
        self.writer.full_step = self.step
        self.writer.rebaseline()
        self.evict_per_delta = evict_per_delta
        self.evicted: dict[str, np.ndarray] = {}  # the rows the last delta removed, by table
        self._rng = np.random.default_rng([seed, _STREAM])
        self._last_saved = self._tables()  # to find the rows no step changed since

    def train(self, steps: int = 1) -> None:
        for _ in range(steps):
            batch = synthetic_labeled_batch(self.spec.batch_size, [self.seed, _STREAM, self.step])
            feed = {self.network.inputs[a]: v for a, v in batch.feeds.items()}
            feed[self.labels] = batch.labels
            self.session.run(self.train_op, feed)
            self.step += 1

    def predict(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The trainer's own prediction: plain TensorFlow on the parameters as they are now."""
        outputs = self.network.outputs
        values = self.session.run(list(outputs.values()), {self.network.inputs[a]: v for a, v in feeds.items()})
        return dict(zip(outputs, values))

    def _tables(self) -> dict[str, np.ndarray]:
        return dict(zip(self._table_vars, self.session.run(list(self._table_vars.values()))))

    def save_full(self) -> Path:
        prefix = self.writer.save_full(self.step)
        self._last_saved = self._tables()
        return prefix

    def save_delta(self) -> Path:
        """Evict cold rows (``evict_per_delta``, see the module doc), then publish a delta."""
        self.evicted = self._pick_cold_rows() if self.evict_per_delta else {}
        for name, rows in self.evicted.items():
            self.session.run(self._evict[name], {self._evict_rows: rows})
        prefix = self.writer.save_delta(self.step, removed=self.evicted)
        self._last_saved = self._tables()
        return prefix

    def _pick_cold_rows(self) -> dict[str, np.ndarray]:
        """Per table, up to ``evict_per_delta`` rows no step changed since the last checkpoint and
        not zero already."""
        out = {}
        for name, now in self._tables().items():
            cold = np.flatnonzero(np.all(now == self._last_saved[name], axis=1) & np.any(now != 0, axis=1))
            if len(cold):
                out[name] = np.sort(self._rng.choice(cold, min(self.evict_per_delta, len(cold)), replace=False))
        return out

    def close(self) -> None:
        self.session.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=Path("artifacts/demo"))
    parser.add_argument("--full-every", type=float, default=20.0, help="seconds between full checkpoints")
    parser.add_argument("--delta-every", type=float, default=2.0, help="seconds between deltas")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds to run (0: forever)")
    parser.add_argument("--steps-per-tick", type=int, default=5, help="training steps between checks")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--evict-per-delta", type=int, default=32,
                        help="rows per table evicted (reset, and removed in the delta) before each delta")
    parser.add_argument("--delta-mode", choices=("cumulative", "chain"), default="cumulative",
                        help="deltas hold every change since the full, or since the previous delta "
                             "(serve with the model_config key delta_mode)")
    args = parser.parse_args()
    trainer = StreamingTrainer(args.model_dir, args.seed, args.delta_mode, args.evict_per_delta)
    started = last_full = last_delta = time.monotonic()
    while args.duration <= 0 or time.monotonic() - started < args.duration:
        trainer.train(args.steps_per_tick)
        now = time.monotonic()
        if now - last_full >= args.full_every:
            print(json.dumps({"full": str(trainer.save_full()), "step": trainer.step}), flush=True)
            last_full = last_delta = now
        elif now - last_delta >= args.delta_every:
            delta = trainer.save_delta()
            print(json.dumps({"delta": str(delta), "step": trainer.step,
                              "evicted": sum(len(r) for r in trainer.evicted.values())}), flush=True)
            last_delta = now
    trainer.close()


if __name__ == "__main__":
    main()
