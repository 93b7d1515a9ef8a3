"""Freshness (issue 45): the served step and when it was written follow the deltas as they land,
and stop with them, while the data age keeps growing; the deltas' publication-to-serving time
is counted. In one process here; tests/e2e/test_server_freshness_workers.py reads the same from
/metrics of a server with two workers."""

from __future__ import annotations

import time

import pytest

from conftest import model_config
from processor.checkpoint.delta import WRITTEN_AT_TENSOR
from processor.checkpoint.tensor_file import read_tensors
from unit.features.helpers import copy_model, label, wait_for

POLL = 0.1


def freshness(processor) -> dict:
    """The served version's freshness, and the wall-clock interval the answer was made in."""
    before = time.time()
    info = processor.model_info()["freshness"]
    return {**info["versions"][-1], "histogram": info["delta_publish_to_serve_seconds"],
            "asked": (before, time.time())}


def assert_age(seen: dict) -> None:
    """The data age is now minus the written time, now being when model info was asked."""
    low, high = seen["asked"]
    assert low - seen["written_at"] <= seen["data_age_seconds"] <= high - seen["written_at"]


@pytest.mark.timeout(300)
def test_freshness_follows_the_deltas_and_stops_with_them(ctr_model_small, tmp_path, make_processor):
    from demo.streaming_trainer import StreamingTrainer

    model = copy_model(ctr_model_small, tmp_path / "m")
    trainer = StreamingTrainer(model.out_dir, evict_per_delta=4)
    try:
        p = make_processor(model_config(model, file_system_poll_wait_seconds=POLL))
        seen = freshness(p)  # the demo's own full: written by its build's Saver, so by its mtime
        assert seen["served_step"] == model.steps[-1] and seen["written_at_source"] == "mtime"
        assert_age(seen)
        for k in range(3):
            trainer.train(2)
            stamp = float(read_tensors(str(trainer.save_delta()))[WRITTEN_AT_TENSOR])
            assert wait_for(lambda: label(p) == f"{model.steps[-1]}+{trainer.step}", 30)
            seen = freshness(p)
            assert (seen["served_step"], seen["written_at"], seen["written_at_source"]) == \
                (trainer.step, stamp, "writer")
            assert_age(seen)
            assert seen["histogram"]["count"] == k + 1 and seen["histogram"]["last"] >= 0
        # the deltas stop: polls go on, the served step and its time stay, the age grows
        polls = p.model_info()["watcher"]["polls"]
        assert wait_for(lambda: p.model_info()["watcher"]["polls"] >= polls + 3, 30)
        later = freshness(p)
        assert (later["served_step"], later["written_at"]) == (seen["served_step"], seen["written_at"])
        assert later["data_age_seconds"] >= seen["data_age_seconds"] and later["histogram"]["count"] == 3
        assert_age(later)
        trainer.train(2)  # a full written by our writer carries its time too
        stamp = float(read_tensors(str(trainer.save_full()))[WRITTEN_AT_TENSOR])
        assert wait_for(lambda: label(p) == str(trainer.step), 60)
        seen = freshness(p)
        assert (seen["served_step"], seen["written_at"], seen["written_at_source"]) == (trainer.step, stamp, "writer")
    finally:
        trainer.close()
