"""Freshness on every worker (issue 45): a real ``python -m server`` with two workers while a
trainer publishes deltas. Every scrape of /metrics (a new connection each: the kernel spreads
them over both workers, and each worker reports its own) shows the newest delta's step and its
written time once the workers have polled, and after the deltas stop the same step and time
while ``sp_model_data_age_seconds`` grows."""

from __future__ import annotations

import time
import urllib.request

import pytest

from conftest import model_config
from processor.checkpoint.delta import WRITTEN_AT_TENSOR
from processor.checkpoint.tensor_file import read_tensors
from unit.features.helpers import copy_model

POLL = 0.2
SCRAPES = 16  # fresh connections per check: both workers answer some of them


def scrape(server) -> dict[str, float]:
    """This scrape's freshness samples of model ``m`` (one worker's), and when it was asked."""
    from prometheus_client.parser import text_string_to_metric_families

    asked = time.time()
    with urllib.request.urlopen(server.http + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    out = {"asked": asked}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("model") != "m":
                continue
            if sample.name in ("sp_model_served_step", "sp_model_data_age_seconds"):
                out[sample.name] = sample.value
            elif sample.name == "sp_model_delta_publish_to_serve_seconds_count":
                out["published"] = sample.value
    return out


def every_scrape(server, predicate, timeout: float = 60) -> list[dict]:
    """SCRAPES scrapes in a row that all satisfy ``predicate`` (retried until ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        seen = [scrape(server) for _ in range(SCRAPES)]
        if all(predicate(s) for s in seen):
            return seen
        assert time.monotonic() < deadline, seen
        time.sleep(POLL)


@pytest.mark.timeout(240)
def test_freshness_moves_with_the_deltas_and_stops_with_them_on_every_worker(ctr_model_small, tmp_path):
    from demo.streaming_trainer import StreamingTrainer
    from tools.server_process import ServerProcess

    model = copy_model(ctr_model_small, tmp_path / "m")
    trainer = StreamingTrainer(model.out_dir, evict_per_delta=4)
    deployment = {"models": [{"name": "m", "model_config": model_config(model, file_system_poll_wait_seconds=POLL)}],
                  "workers": 2, "access_log": False, "drain_timeout_seconds": 10}
    try:
        with ServerProcess(deployment, tmp_path / "server") as server:
            every_scrape(server, lambda s: s.get("sp_model_served_step") == model.steps[-1])
            for k in range(3):
                trainer.train(2)
                written = float(read_tensors(str(trainer.save_delta()))[WRITTEN_AT_TENSOR])
                seen = every_scrape(server, lambda s: s.get("sp_model_served_step") == trainer.step)
                for s in seen:  # the age is the scrape's time minus the delta's written time
                    assert 0 <= s["sp_model_data_age_seconds"] <= time.time() - written
                    assert s["sp_model_data_age_seconds"] >= s["asked"] - written - 1e-3
                    assert s["published"] == k + 1  # each worker applied every delta in place
            # the deltas stop: several polls later every worker still serves that step, older now
            time.sleep(3 * POLL)
            later = every_scrape(server, lambda s: s.get("sp_model_served_step") == trainer.step)
            for s in later:
                assert s["sp_model_data_age_seconds"] >= s["asked"] - written - 1e-3
                assert s["sp_model_data_age_seconds"] >= max(x["sp_model_data_age_seconds"] for x in seen) - 1e-3
            assert server.stop() == 0, server.log()[-3000:]
    finally:
        trainer.close()
