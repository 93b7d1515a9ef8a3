"""The live model set (server/model_set.py) with real servers: models added to, changed in and
removed from the deployment file are applied without a restart, while another model answers
every request; a bad file changes nothing; SIGHUP re-reads the file; with 2 workers every worker
follows. The DLRM-like ``.onnx`` model on ONNX Runtime (two seeds: two models whose answers
differ).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from models.dlrm_models import build_models, predict
from sp_checks import wait_for

POLL = 0.3


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    return build_models(tmp_path_factory.mktemp("model_set"))


def entry(name: str, directory: Path, **config) -> dict:
    return {"name": name, "model_config": {"savedmodel_dir": str(directory), "backend": "onnxruntime",
                                           "session_num": 1, "file_system_poll_wait_seconds": 0, **config}}


def deployment(*entries: dict, poll: float = POLL, workers: int = 1) -> dict:
    return {"models": list(entries), "model_config_file_poll_wait_seconds": poll, "workers": workers,
            "access_log": False, "drain_timeout_seconds": 5}


def rewrite(server, data: dict) -> None:
    """Replace the server's deployment file as an operator would (a new file renamed over it)."""
    path = server.workdir / "deployment.json"
    staging = path.with_suffix(".tmp")
    staging.write_text(json.dumps(data))
    os.replace(staging, path)


class Load:
    """Requests to one model from a thread while the test changes the set: every answer kept."""

    def __init__(self, server, model: str) -> None:
        self.server, self.model = server, model
        self.statuses: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.statuses.append(predict(self.server, self.model)[0])

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(60)


@pytest.mark.timeout(300)
def test_models_added_changed_and_removed_while_another_serves(models, tmp_path):
    from tools.server_process import ServerProcess

    a = entry("a", models["a"])
    with ServerProcess(deployment(a), tmp_path / "server") as server:
        status, want_a = predict(server, "a")
        assert status == 200
        assert predict(server, "b")[0] == 404
        with Load(server, "a") as load:
            rewrite(server, deployment(a, entry("b", models["b"])))  # added
            assert wait_for(lambda: predict(server, "b")[0] == 200, 60), server.log()[-2000:]
            status, want_b = predict(server, "b")
            assert not np.allclose(want_a, want_b)

            rewrite(server, deployment(entry("a", models["a"], session_num=2), entry("b", models["b"])))  # changed
            sessions = lambda: server.get_json("/api/models/a")["session_group"]["lanes"]  # noqa: E731
            assert wait_for(lambda: sessions() == 2, 60), server.get_json("/api/models/a")["session_group"]

            rewrite(server, {"models": "not a list"})  # a bad file: nothing changes
            time.sleep(3 * POLL)
            assert predict(server, "b")[0] == 200 and sessions() == 2

            rewrite(server, deployment(entry("a", models["a"], session_num=2)))  # removed
            assert wait_for(lambda: predict(server, "b")[0] == 404, 60)
            answered = len(load.statuses)
            assert wait_for(lambda: len(load.statuses) > answered + 5, 30)
        assert set(load.statuses) == {200}, f"model a failed during the changes: {set(load.statuses)}"
        np.testing.assert_allclose(predict(server, "a")[1], want_a, rtol=1e-5, atol=1e-6)
        log = server.log()
        assert "refused, the running models keep serving: models: required" in log, log[-3000:]


@pytest.mark.timeout(300)
def test_sighup_rereads_the_file_and_two_workers_both_follow(models, tmp_path):
    from tools.server_process import ServerProcess

    a = entry("a", models["a"])
    with ServerProcess(deployment(a, poll=0, workers=2), tmp_path / "server") as server:
        rewrite(server, deployment(a, entry("b", models["b"]), poll=0, workers=2))
        time.sleep(1.0)
        assert predict(server, "b")[0] == 404  # not polled: nothing happens until SIGHUP
        os.kill(server.proc.pid, signal.SIGHUP)
        assert wait_for(lambda: all(predict(server, "b")[0] == 200 for _ in range(20)), 60), server.log()[-2000:]
        # fresh connections spread over both workers: each serves b
        assert all(predict(server, "b")[0] == 200 for _ in range(30))
        assert server.stop() == 0


@pytest.mark.timeout(300)
def test_a_removed_model_gives_its_memory_back(models, tmp_path):
    """The process's resident memory falls by at least 0.9 of what the removed model counted."""
    from demo import dlrm_onnx
    from tools.server_process import ServerProcess

    big = tmp_path / "big"
    dlrm_onnx.build(big / "model.onnx", rows=60_000, dim=16, seed=5)  # ~100 MB of parameters
    a = entry("a", models["a"])
    with ServerProcess(deployment(a, entry("big", big)), tmp_path / "server") as server:
        assert predict(server, "big")[0] == 200
        held = server.get_json("/api/memory")
        counted = sum(sum(parts.values()) for parts in held["models"]["big"].values())
        assert counted > 90 * 2**20, held["models"]["big"]
        rss = held["budget"]["rss_bytes"]
        rewrite(server, deployment(a))
        assert wait_for(lambda: predict(server, "big")[0] == 404, 60)
        # freed once the version's last request ended (then the heap is trimmed)
        fallen = lambda: rss - server.get_json("/api/memory")["budget"]["rss_bytes"]  # noqa: E731
        assert wait_for(lambda: fallen() >= 0.9 * counted, 30), (fallen() / 2**20, counted / 2**20)
        assert predict(server, "a")[0] == 200
