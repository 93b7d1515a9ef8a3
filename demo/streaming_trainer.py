"""Streaming training of the demo CTR model: keeps training on fresh synthetic data and writes
a full checkpoint every F seconds and a delta every D seconds (processor.checkpoint layout).

    python -m demo.streaming_trainer --model-dir artifacts/demo --full-every 20 --delta-every 2 \
        --duration 60

The trainer resumes from the newest full checkpoint of the model's run directory and continues
the step count from there. It is what a user's training job does; the processor picks up each
checkpoint while serving. Not thread-safe: one trainer per run directory.
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
from processor.checkpoint.writer import CheckpointWriter

_STREAM = 3  # seed stream of streaming batches; differs from the build's train/eval streams


class StreamingTrainer:
    """Continues training a built CTR model and publishes full and delta checkpoints."""

    def __init__(self, model_dir: Path, seed: int = 0, delta_mode: str = "cumulative") -> None:
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

    def save_full(self) -> Path:
        return self.writer.save_full(self.step)

    def save_delta(self) -> Path:
        return self.writer.save_delta(self.step)

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
    parser.add_argument("--delta-mode", choices=("cumulative", "chain"), default="cumulative",
                        help="deltas hold every change since the full, or since the previous delta "
                             "(serve with the model_config key delta_mode)")
    args = parser.parse_args()
    trainer = StreamingTrainer(args.model_dir, args.seed, args.delta_mode)
    started = last_full = last_delta = time.monotonic()
    while args.duration <= 0 or time.monotonic() - started < args.duration:
        trainer.train(args.steps_per_tick)
        now = time.monotonic()
        if now - last_full >= args.full_every:
            print(json.dumps({"full": str(trainer.save_full()), "step": trainer.step}), flush=True)
            last_full = last_delta = now
        elif now - last_delta >= args.delta_every:
            print(json.dumps({"delta": str(trainer.save_delta()), "step": trainer.step}), flush=True)
            last_delta = now
    trainer.close()


if __name__ == "__main__":
    main()
